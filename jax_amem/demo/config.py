"""The sizes of one RL run: the policy's architecture and the loop's budget.

One `PolicyConfig` describes both models: the Flax trainer (`policy.py`) and
the transformers rollout (`rollout.py`, through `to_hf_config`), so the two
cannot drift apart. Two families: "llama" (the small demo) and "qwen3" (Llama plus
RMSNorm on each query and key head, as transformers' Qwen3; the real-size presets).
"""

from __future__ import annotations

import dataclasses

FAMILIES = ("llama", "qwen3")


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """A Llama-style decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU;
    family "qwen3" adds Qwen3's per-head query/key RMSNorm; tie_embeddings reads the logits
    off the token embedding (no separate head), as Qwen3's small models do."""

    vocab_size: int = 12
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_positions: int = 64
    init_std: float = 0.02
    family: str = "llama"          # "llama" | "qwen3"
    tie_embeddings: bool = False

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads}) for grouped-query attention")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")

    def to_hf_config(self):
        """The same architecture as a transformers config (LlamaConfig or Qwen3Config)."""
        return self.to_qwen3_config() if self.family == "qwen3" else self.to_llama_config()

    def to_llama_config(self):
        """The same architecture as a transformers.LlamaConfig (float32, untied head)."""
        from transformers import LlamaConfig

        if self.family != "llama" or self.tie_embeddings:
            raise ValueError(f"to_llama_config: this policy is family {self.family!r}"
                             f"{' with tied embeddings' if self.tie_embeddings else ''}; use to_hf_config()")
        return LlamaConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim, hidden_act="silu", max_position_embeddings=self.max_positions,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta,  # transformers 4 and 5
            attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="eager")

    def to_qwen3_config(self):
        """The same architecture as a transformers.Qwen3Config (no sliding window, no biases)."""
        from transformers import Qwen3Config

        return Qwen3Config(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim, hidden_act="silu", max_position_embeddings=self.max_positions,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta, attention_bias=False,
            use_sliding_window=False, tie_word_embeddings=self.tie_embeddings,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """How long and how hard the loop trains."""

    iterations: int = 150
    prompts_per_iteration: int = 16
    group_size: int = 8            # samples per prompt (GRPO's group)
    learning_rate: float = 1e-3
    check_every: int = 50          # logits check period (and always at the end)
    seed: int = 0

    @property
    def batch_size(self) -> int:
        return self.prompts_per_iteration * self.group_size


# Measured on 2 CPU cores (8 XLA devices): ~0.1 s an iteration after ~10 s of set-up when the
# cores are free, several times that when they are shared. At 3e-3 the reward rises fastest but
# falls back after ~150 iterations; 1e-3 climbs steadily. DEFAULT is what `make demo` runs: 150
# iterations keep a first run on a 2-core machine to about two minutes with the reward clearly
# rising (500 reach ~0.88, docs/demo.md); `--iterations` runs longer.
QUICK = (PolicyConfig(), LoopConfig(iterations=60, learning_rate=3e-3, check_every=20))
DEFAULT = (PolicyConfig(), LoopConfig())
