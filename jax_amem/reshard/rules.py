"""Mapping rules between source and destination names (`jax_amem.rules`).

    rules.Rule.copy("dst", "src", transpose=(1, 0), cast="bfloat16")
    rules.Rule.concat("qkv", [Part("q"), Part("k"), Part("v")], axis=0, groups=tp)
    rules.hf_llama(num_layers, tp=2, fused_qkv=True)
    rules.from_function(convert, params)     # from the user's own checkpoint exporter

See rule_types for the data, hf for the ready Hugging Face tables.
"""

from .hf import FUSED, GLOBAL_WEIGHTS, LLAMA_LAYER_WEIGHTS, QKV_BIASES, hf_llama, hf_qwen2
from .lowering import RuleError, check_coverage, identity_rules, lower
from .rule_types import Part, Piece, Rule
from .presets import (FAMILIES, deepseek, gemma, gemma2, gemma3, gpt2, llama, mixtral, phi3, preset, qwen2, qwen3,
                      qwen3_moe)
from .trace import TraceError, from_function, from_layer_function, trace_count
from .trace import clear_cache as clear_trace_cache

__all__ = [
    "FAMILIES", "deepseek", "gemma", "gemma2", "gemma3", "gpt2", "llama", "mixtral", "phi3", "preset", "qwen2",
    "qwen3", "qwen3_moe",
    "FUSED", "GLOBAL_WEIGHTS", "LLAMA_LAYER_WEIGHTS", "QKV_BIASES", "Part", "Piece", "Rule",
    "RuleError", "TraceError", "check_coverage", "clear_trace_cache", "from_function", "from_layer_function", "trace_count", "hf_llama", "hf_qwen2", "identity_rules", "lower",
]
