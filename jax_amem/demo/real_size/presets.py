"""The real-size presets: a Qwen3-style policy trained in JAX, swapped into a bf16 transformers
Qwen3ForCausalLM, and a tiny model of the same code path for tests.

    qwen3-1.7b  Qwen3-1.7B's architecture (28 layers, d=2048, 16 heads / 8 kv of 128, SwiGLU 6144,
                vocabulary 151936, tied embeddings): 1.72B parameters, 6.9 GB in float32 and
                13.8 GB of Adam moments, 20.6 GB of trainer state (19.2 GiB). Random init from
                the config, nothing downloaded. A systems preset: a few iterations of GRPO cannot
                teach a random 1.7B model to sort, the reward is shown but not expected to rise.
    qwen3-tiny  the same code path at 2 layers and d=64 (CPU, seconds): bf16 rollout, tied
                embeddings, Qwen3's q/k norms, the same baselines and checks.
"""

from __future__ import annotations

import dataclasses

from ..config import LoopConfig, PolicyConfig
from ..task import SortTask


@dataclasses.dataclass(frozen=True)
class RealSizePreset:
    name: str
    policy: PolicyConfig
    loop: LoopConfig
    task: SortTask                  # digits = tokens generated per sample
    rollout_dtype: str = "bfloat16"  # torch dtype name of the rollout model
    no_pause_iterations: int = 1    # baseline (b): iterations with both models resident
    check_sequences: int = 4        # sequences of the logits check
    min_device_gib: float = 0.0     # the GPU memory this preset needs (the default chooses by it)
    systems_preset: bool = True     # True: the summary says the reward is not expected to rise

    def __post_init__(self):
        if self.policy.family != "qwen3":
            raise ValueError(f"preset {self.name!r}: the real-size path runs Qwen3-style policies "
                             f"(the swap uses rules.qwen3), got family {self.policy.family!r}")
        if self.policy.vocab_size < 12:
            raise ValueError(f"preset {self.name!r}: the sort task needs a vocabulary of at least 12 tokens")


QWEN3_1_7B = RealSizePreset(
    name="qwen3-1.7b",
    policy=PolicyConfig(family="qwen3", vocab_size=151936, hidden_size=2048, num_layers=28, num_heads=16,
                        num_kv_heads=8, head_dim=128, intermediate_size=6144, rope_theta=1e6,
                        rms_norm_eps=1e-6, max_positions=4096, tie_embeddings=True),
    # 8 prompts x 4 samples of 16 generated tokens: short, so three iterations, both baselines
    # and the compiles fit in about three minutes on an H200 (docs/demo.md).
    loop=LoopConfig(iterations=3, prompts_per_iteration=8, group_size=4, learning_rate=1e-5,
                    check_every=3, seed=0),
    task=SortTask(digits=16),
    no_pause_iterations=2,
    min_device_gib=60.0,
)

QWEN3_TINY = RealSizePreset(
    name="qwen3-tiny",
    policy=PolicyConfig(family="qwen3", vocab_size=32, hidden_size=64, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, intermediate_size=128, rope_theta=1e6,
                        max_positions=64, tie_embeddings=True),
    loop=LoopConfig(iterations=2, prompts_per_iteration=4, group_size=4, learning_rate=1e-3,
                    check_every=2, seed=0),
    task=SortTask(digits=4),
    no_pause_iterations=1,
)

PRESETS = {p.name: p for p in (QWEN3_1_7B, QWEN3_TINY)}
