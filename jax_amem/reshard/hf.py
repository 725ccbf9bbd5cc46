"""Ready rules for Hugging Face Llama / Qwen2-style destination names.

The source side is a Flax-style parameter tree, named by '/'-joined keys
(`tree_names`), with kernels stored (in, out) as Flax does. `stacked=True`
means a scanned model: every layer's weight sits in one tensor with a leading
layer axis (`layers/attn/q/kernel` of shape (L, D, H*hd)); `stacked=False`
means one subtree per layer (`layers/3/attn/q/kernel` of shape (D, H*hd)).
The table below is the whole mapping: edit a copy of it for other names.
"""

from __future__ import annotations

import numbers
import os

from .lowering import RuleError
from .rule_checks import checked_cast
from .rule_types import Part, Rule

# hf name (per layer, under model.layers.{i}.) -> (source name under layers/, transposed?)
LLAMA_LAYER_WEIGHTS = {
    "self_attn.q_proj.weight": ("attn/q/kernel", True),
    "self_attn.k_proj.weight": ("attn/k/kernel", True),
    "self_attn.v_proj.weight": ("attn/v/kernel", True),
    "self_attn.o_proj.weight": ("attn/o/kernel", True),
    "mlp.gate_proj.weight": ("mlp/gate/kernel", True),
    "mlp.up_proj.weight": ("mlp/up/kernel", True),
    "mlp.down_proj.weight": ("mlp/down/kernel", True),
    "input_layernorm.weight": ("input_norm/scale", False),
    "post_attention_layernorm.weight": ("post_attn_norm/scale", False),
}
QKV_BIASES = {
    "self_attn.q_proj.bias": ("attn/q/bias", False),
    "self_attn.k_proj.bias": ("attn/k/bias", False),
    "self_attn.v_proj.bias": ("attn/v/bias", False),
}
# Fused destinations as vLLM holds them: per tensor-parallel rank, the rank's slice
# of each member, in this order.
FUSED = {
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                  "self_attn.v_proj.weight"),
    "self_attn.qkv_proj.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                "self_attn.v_proj.bias"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}
GLOBAL_WEIGHTS = {
    "model.embed_tokens.weight": ("embed/embedding", False),
    "model.norm.weight": ("final_norm/scale", False),
    "lm_head.weight": ("lm_head/kernel", True),
}


def _part(source: str, transposed: bool, layer: int | None, stacked: bool, cast) -> Part:
    if layer is None:
        return Part(source, (), (1, 0) if transposed else None, cast)
    if stacked:
        return Part(f"layers/{source}", (layer,), (1, 0) if transposed else None, cast)
    return Part(f"layers/{layer}/{source}", (), (1, 0) if transposed else None, cast)


# Said in every error about these rules: the most common surprise is a tree of another naming.
ORIGIN = ("rules.hf_llama, which expects a Flax-style tree (layers/attn/q/kernel (L, D, H*hd), kernels "
          "(in, out)); for a MaxText-style tree use rules.preset(family, params, source='maxtext')")


def hf_llama(num_layers: int, *, tp: int = 1, stacked: bool = True, fused_qkv: bool = False,
             fused_gate_up: bool = False, qkv_bias: bool = False, tie_embeddings: bool = False,
             cast: str | None = None) -> list[Rule]:
    """Rules from a Flax-style Llama parameter tree to Hugging Face names.

    `fused_qkv` / `fused_gate_up` produce vLLM's `qkv_proj` / `gate_up_proj`,
    interleaved per tensor-parallel rank (`tp` ranks). `cast` converts on the
    sender (e.g. "bfloat16").
    """
    _check(num_layers, tp)
    flags = dict(stacked=stacked, fused_qkv=fused_qkv, fused_gate_up=fused_gate_up, qkv_bias=qkv_bias,
                 tie_embeddings=tie_embeddings)
    for flag, value in flags.items():   # 'no' would read as True
        if not isinstance(value, bool):
            raise RuleError(f"rules.hf_llama: {flag}={value!r:.60} is True or False")
    checked_cast(cast, "rules.hf_llama")
    per_layer = dict(LLAMA_LAYER_WEIGHTS)
    if qkv_bias:
        per_layer.update(QKV_BIASES)
    rules = []
    for layer in range(num_layers):
        fused_members = set()
        for fused, members in FUSED.items():
            wanted = (fused_qkv and "qkv" in fused) or (fused_gate_up and "gate_up" in fused)
            if not wanted or any(m not in per_layer for m in members):
                continue
            fused_members.update(members)
            parts = [_part(*per_layer[m], layer, stacked, cast) for m in members]
            rules.append(Rule.concat(f"model.layers.{layer}.{fused}", parts, axis=0, groups=tp, origin=ORIGIN))
        for name, (source, transposed) in per_layer.items():
            if name not in fused_members:
                rules.append(Rule(f"model.layers.{layer}.{name}",
                                  (_part(source, transposed, layer, stacked, cast),), origin=ORIGIN))
    for name, (source, transposed) in GLOBAL_WEIGHTS.items():
        if name == "lm_head.weight" and tie_embeddings:
            source, transposed = GLOBAL_WEIGHTS["model.embed_tokens.weight"]
        rules.append(Rule(name, (_part(source, transposed, None, stacked, cast),), origin=ORIGIN))
    return rules


# Less than any one Rule takes in memory (its name alone is a str of over 50 bytes): a count whose
# rules would need more than the host's memory at this size surely cannot be built.
_RULE_BYTES_AT_LEAST = 100


def _check(num_layers, tp) -> None:
    """The options, refused here rather than as a shape error at plan()."""
    def whole(n) -> bool:
        return isinstance(n, numbers.Integral) and not isinstance(n, bool)
    if not whole(num_layers) or num_layers < 0:
        raise RuleError(f"rules.hf_llama: num_layers={num_layers!r} is not a layer count (an int >= 0)")
    needed = int(num_layers) * len(LLAMA_LAYER_WEIGHTS) * _RULE_BYTES_AT_LEAST
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > memory:
        raise RuleError(f"rules.hf_llama: num_layers={num_layers!r} needs one rule per layer and weight, at least "
                        f"{needed / 2**30:.3g} GiB of rules, more than this host's {memory / 2**30:.3g} GiB of "
                        "memory: give the model's layer count")
    if not whole(tp) or tp < 1:
        raise RuleError(f"rules.hf_llama: tp={tp!r} is not a tensor-parallel size: give an int >= 1")


def hf_qwen2(num_layers: int, **options) -> list[Rule]:
    """Qwen2: Llama's names plus q/k/v biases."""
    return hf_llama(num_layers, qkv_bias=True, **options)
