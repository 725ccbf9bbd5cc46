"""The rollout: the same architecture as a transformers LlamaForCausalLM (or Qwen3ForCausalLM),
sampling with PyTorch.

The model is built from a config (no download) and its initial weights are
overwritten to NaN: every weight it ever uses comes from the trainer through
the swap, and a tensor the swap missed would show as NaN logits.
"""

from __future__ import annotations

import numpy as np

from .config import PolicyConfig


def torch_device():
    """Where the swap can write the rollout: the CUDA device of JAX's first device when JAX runs on
    its GPU platform and PyTorch sees CUDA, else the CPU. JAX on its CPU platform cannot write CUDA
    memory (JAX_PLATFORMS=cpu on a GPU host): the rollout then lives in host memory too."""
    import jax
    import torch

    device = jax.devices()[0]
    if device.platform == "gpu" and torch.cuda.is_available():
        return torch.device("cuda", device.local_hardware_id)
    return torch.device("cpu")


def build_rollout_model(config: PolicyConfig, device=None, dtype=None):
    """A LlamaForCausalLM (Qwen3ForCausalLM for family "qwen3") of `config`'s architecture,
    in eval mode, weights set to NaN; float32 unless `dtype` (a torch dtype) says otherwise."""
    import torch
    import transformers

    model_class = transformers.Qwen3ForCausalLM if config.family == "qwen3" else transformers.LlamaForCausalLM
    device = device if device is not None else torch_device()
    dtype = dtype if dtype is not None else torch.float32
    previous = torch.get_default_dtype()
    # Made in `dtype` from the start: a 1.7B model built in float32 first would take 7 GB more.
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_class(config.to_hf_config())
    finally:
        torch.set_default_dtype(previous)
    model = model.eval()  # not .to(dtype): that would round the rotary inv_freq (float32) too
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.fill_(float("nan"))
    model.generation_config.pad_token_id = 0  # silences generate(); no padding is used
    return model


def rollout_tensors(model) -> dict:
    """The swap's destination: name -> the model's own parameter tensors (written in place)."""
    return dict(model.named_parameters())


def generate(model, prompts: np.ndarray, new_tokens: int, seed: int) -> np.ndarray:
    """Samples exactly `new_tokens` tokens after each prompt (temperature 1, no top-k/top-p).

    prompts: (B, P) int; returns (B, P + new_tokens) int32. Seeded: the same
    weights, prompts and seed give the same samples.
    """
    import torch

    device = next(model.parameters()).device
    torch.manual_seed(seed)
    inputs = torch.as_tensor(prompts, dtype=torch.long, device=device)
    with torch.no_grad():
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=True,
                             temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, eos_token_id=None, use_cache=True)
    return out.cpu().numpy().astype(np.int32)


def logits(model, tokens: np.ndarray) -> np.ndarray:
    """The rollout model's logits (B, T, V) as float32 numpy."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        out = model(torch.as_tensor(tokens, dtype=torch.long, device=device)).logits
    return out.float().cpu().numpy()
