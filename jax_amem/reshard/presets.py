"""Ready rules per model family, source naming and destination layout.

    rules.preset("qwen3_moe", params, source="maxtext", layout="vllm", tp=2)
    rules.qwen3(params)                          # source="flax", layout="hf"

Families: llama, qwen3, qwen3_moe, mixtral, gemma2, deepseek (MoE with shared experts,
first dense layers, multi-head latent attention as in Hugging Face's DeepseekV3), gpt2.

Sources (the trainer's tree, named by `tree_names`; every layer stacked on axis 0):

* `"flax"`: the naming `hf_llama` uses: `layers/attn/q/kernel` (L, D, H*hd), kernels
  (in, out), heads merged.
* `"maxtext"`: `decoder/layers/self_attention/query/kernel` (L, D, H, hd), out kernels
  (L, H, hd, D), MLP kernels (in, out) `mlp/wi_0`, `wi_1`, `wo`, experts stacked
  `MoeBlock_0/wi_0` (L, E, D, I).

Layouts (the rollout's names and shapes):

* `"hf"`: transformers' own (installed 5.x: Qwen3-MoE / Mixtral / DeepSeek experts fused
  as 3-D `mlp.experts.gate_up_proj` (E, 2I, D) and `down_proj` (E, D, I); GPT-2 Conv1D
  kernels (in, out) and fused `c_attn`).
* `"vllm"`: vLLM's fused tensors: `qkv_proj`, `gate_up_proj`, MoE `w13_weight` (E, 2I, D)
  and `w2_weight` (E, D, I), each fused tensor interleaved per tensor-parallel rank (`tp`).

The tables below are the whole mapping: copy and edit them for another naming.
"""

from __future__ import annotations

import difflib

from .from_jax import tree_names
from .lowering import RuleError, closest
from .rule_types import Part, Rule

# logical weight -> (kind, flax path, maxtext path). Paths are under the layer stack.
# kinds: in_heads (D, N, hd) | out_heads (N, hd, D) | linear (in, out) | experts (E, in, out)
#        | vector | head_vector (N, hd). Flax stores the head axes merged.
LAYER_WEIGHTS = {
    "q": ("in_heads", "attn/q/kernel", "self_attention/query/kernel"),
    "k": ("in_heads", "attn/k/kernel", "self_attention/key/kernel"),
    "v": ("in_heads", "attn/v/kernel", "self_attention/value/kernel"),
    "o": ("out_heads", "attn/o/kernel", "self_attention/out/kernel"),
    "q_bias": ("head_vector", "attn/q/bias", "self_attention/query/bias"),
    "k_bias": ("head_vector", "attn/k/bias", "self_attention/key/bias"),
    "v_bias": ("head_vector", "attn/v/bias", "self_attention/value/bias"),
    "o_bias": ("vector", "attn/o/bias", "self_attention/out/bias"),
    "q_norm": ("vector", "attn/q_norm/scale", "self_attention/query_norm/scale"),
    "k_norm": ("vector", "attn/k_norm/scale", "self_attention/key_norm/scale"),
    "kv_a": ("linear", "attn/kv_a/kernel", "self_attention/wkv_a/kernel"),      # (D, r + rope)
    "kv_norm": ("vector", "attn/kv_norm/scale", "self_attention/kv_norm/scale"),
    "kv_b": ("in_heads", "attn/kv_b/kernel", "self_attention/wkv_b/kernel"),    # (r, H, nope + v)
    "attn_norm": ("vector", "input_norm/scale", "pre_self_attention_layer_norm/scale"),
    "attn_norm_bias": ("vector", "input_norm/bias", "pre_self_attention_layer_norm/bias"),
    "mlp_norm": ("vector", "post_attn_norm/scale", "post_self_attention_layer_norm/scale"),
    "mlp_norm_bias": ("vector", "post_attn_norm/bias", "post_self_attention_layer_norm/bias"),
    "pre_ffw_norm": ("vector", "pre_ffw_norm/scale", "pre_ffw_norm/scale"),
    "post_ffw_norm": ("vector", "post_ffw_norm/scale", "post_ffw_norm/scale"),
    "gate": ("linear", "mlp/gate/kernel", "mlp/wi_0/kernel"),
    "up": ("linear", "mlp/up/kernel", "mlp/wi_1/kernel"),
    "down": ("linear", "mlp/down/kernel", "mlp/wo/kernel"),
    "fc": ("linear", "mlp/fc/kernel", "mlp/wi/kernel"),
    "fc_bias": ("vector", "mlp/fc/bias", "mlp/wi/bias"),
    "down_bias": ("vector", "mlp/down/bias", "mlp/wo/bias"),
    "router": ("linear", "moe/router/kernel", "MoeBlock_0/gate/kernel"),
    "router_bias": ("vector", "moe/router/bias", "MoeBlock_0/gate/bias"),
    "e_gate": ("experts", "moe/experts/gate/kernel", "MoeBlock_0/wi_0"),
    "e_up": ("experts", "moe/experts/up/kernel", "MoeBlock_0/wi_1"),
    "e_down": ("experts", "moe/experts/down/kernel", "MoeBlock_0/wo"),
    "s_gate": ("linear", "moe/shared/gate/kernel", "MoeBlock_0/shared_experts/wi_0/kernel"),
    "s_up": ("linear", "moe/shared/up/kernel", "MoeBlock_0/shared_experts/wi_1/kernel"),
    "s_down": ("linear", "moe/shared/down/kernel", "MoeBlock_0/shared_experts/wo/kernel"),
}
GLOBAL_WEIGHTS = {
    "embed": ("vector", "embed/embedding", "token_embedder/embedding"),
    "pos_embed": ("vector", "pos_embed/embedding", "decoder/position_embedder/embedding"),
    "final_norm": ("vector", "final_norm/scale", "decoder/decoder_norm/scale"),
    "final_norm_bias": ("vector", "final_norm/bias", "decoder/decoder_norm/bias"),
    "lm_head": ("linear", "lm_head/kernel", "decoder/logits_dense/kernel"),
}
# Where the layer stacks live, per source: (all layers, dense layers, MoE layers) for DeepSeek's split.
STACKS = {"flax": {"layers": "layers/", "dense": "dense_layers/", "moe": "moe_layers/"},
          "maxtext": {"layers": "decoder/layers/", "dense": "decoder/dense_layers/", "moe": "decoder/moe_layers/"}}
SOURCES = ("flax", "maxtext")
LAYOUTS = ("hf", "vllm")

# Destination tables: name under the layer prefix -> a logical weight, or (logical weights, axis)
# for a tensor that concatenates several (fused per TP rank in the vllm layout).
LLAMA_ATTN = {"self_attn.q_proj.weight": "q", "self_attn.k_proj.weight": "k", "self_attn.v_proj.weight": "v",
              "self_attn.o_proj.weight": "o"}
DENSE_MLP = {"mlp.gate_proj.weight": "gate", "mlp.up_proj.weight": "up", "mlp.down_proj.weight": "down"}
NORMS = {"input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "mlp_norm"}
QK_NORM = {"self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm"}
HF_EXPERTS = {"mlp.gate.weight": "router", "mlp.experts.gate_up_proj": (("e_gate", "e_up"), 1),
              "mlp.experts.down_proj": "e_down"}
MLA = {"self_attn.q_proj.weight": "q", "self_attn.kv_a_proj_with_mqa.weight": "kv_a",
       "self_attn.kv_a_layernorm.weight": "kv_norm", "self_attn.kv_b_proj.weight": "kv_b",
       "self_attn.o_proj.weight": "o"}
SHARED = {"mlp.shared_experts.gate_proj.weight": "s_gate", "mlp.shared_experts.up_proj.weight": "s_up",
          "mlp.shared_experts.down_proj.weight": "s_down"}
GPT2_LAYER = {"ln_1.weight": "attn_norm", "ln_1.bias": "attn_norm_bias",
              "attn.c_attn.weight": (("q", "k", "v"), -1), "attn.c_attn.bias": (("q_bias", "k_bias", "v_bias"), 0),
              "attn.c_proj.weight": "o", "attn.c_proj.bias": "o_bias", "ln_2.weight": "mlp_norm",
              "ln_2.bias": "mlp_norm_bias", "mlp.c_fc.weight": "fc", "mlp.c_fc.bias": "fc_bias",
              "mlp.c_proj.weight": "down", "mlp.c_proj.bias": "down_bias"}
LLAMA_GLOBALS = {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm", "lm_head.weight": "lm_head"}
GPT2_GLOBALS = {"transformer.wte.weight": "embed", "transformer.wpe.weight": "pos_embed",
                "transformer.ln_f.weight": "final_norm", "transformer.ln_f.bias": "final_norm_bias"}


def _vllm(table: dict, moe_prefix: str = "mlp") -> dict:
    """vLLM's names for a Hugging Face table: q/k/v and gate/up fused, experts as w13/w2."""
    out = {}
    for name, logical in table.items():
        if name == "self_attn.q_proj.weight" and "self_attn.k_proj.weight" in table:
            out["self_attn.qkv_proj.weight"] = (("q", "k", "v"), 0)
        elif name in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
            continue
        elif name.endswith("gate_proj.weight"):
            out[name.replace("gate_proj", "gate_up_proj")] = ((logical, table[name.replace("gate", "up")]), 0)
        elif name.endswith("up_proj.weight"):
            continue
        elif name == "mlp.gate.weight":
            out[f"{moe_prefix}.gate.weight"] = logical
        elif name == "mlp.gate.e_score_correction_bias":
            out[name] = logical
        elif name == "mlp.experts.gate_up_proj":
            out[f"{moe_prefix}.experts.w13_weight"] = (("e_gate", "e_up"), 1)
        elif name == "mlp.experts.down_proj":
            out[f"{moe_prefix}.experts.w2_weight"] = "e_down"
        elif name == "attn.c_attn.weight":  # vLLM's GPT-2 holds (out, in) like every Linear
            out[name] = (("q", "k", "v"), 0)
        else:
            out[name] = logical
    return out


def family_tables(family: str, layout: str, moe_layer: bool = True) -> tuple[dict, dict, str]:
    """(per-layer table, global table, layer prefix format) of one family in one layout."""
    if family == "gpt2":
        layer, globals_, prefix = dict(GPT2_LAYER), dict(GPT2_GLOBALS), "transformer.h.{}."
    else:
        globals_, prefix = dict(LLAMA_GLOBALS), "model.layers.{}."
        attn = MLA if family == "deepseek" else LLAMA_ATTN
        layer = {**attn, **NORMS}
        if family in ("qwen3", "qwen3_moe"):
            layer.update(QK_NORM)
        if family == "gemma2":
            layer.update({"pre_feedforward_layernorm.weight": "pre_ffw_norm",
                          "post_feedforward_layernorm.weight": "post_ffw_norm"})
        if family in ("qwen3_moe", "mixtral") or (family == "deepseek" and moe_layer):
            layer.update(HF_EXPERTS)
            if family == "deepseek":
                layer.update({"mlp.gate.e_score_correction_bias": "router_bias", **SHARED})
        else:
            layer.update(DENSE_MLP)
    if layout == "vllm":
        layer = _vllm(layer, "block_sparse_moe" if family == "mixtral" else "mlp")
    return layer, globals_, prefix


FAMILIES = ("llama", "qwen3", "qwen3_moe", "mixtral", "gemma2", "deepseek", "gpt2")


def _transform(kind: str, source: str, conv: bool, shape) -> tuple[tuple | None, tuple | None]:
    """(transpose, reshape) turning one layer's source tensor of `shape` into the destination's
    (out, in) form, or (in, out) for GPT-2's Conv1D (`conv`)."""
    maxtext = source == "maxtext"
    if kind == "in_heads":      # maxtext (in, N, hd); flax (in, N*hd)
        if not maxtext:
            return (None if conv else (1, 0)), None
        d, n, hd = shape
        return ((None, (d, n * hd)) if conv else ((1, 2, 0), (n * hd, d)))
    if kind == "out_heads":     # maxtext (N, hd, out); flax (N*hd, out)
        if not maxtext:
            return (None if conv else (1, 0)), None
        n, hd, d = shape
        return ((None, (n * hd, d)) if conv else ((2, 0, 1), (d, n * hd)))
    if kind == "head_vector":
        return None, ((shape[0] * shape[1],) if maxtext else None)
    if kind == "linear":
        return (None if conv else (1, 0)), None
    if kind == "experts":       # (E, in, out) -> (E, out, in)
        return (0, 2, 1), None
    return None, None


def preset(family: str, params, *, source: str = "flax", layout: str = "hf", tp: int = 1,
           cast: str | None = None, tie_embeddings: bool = False) -> list[Rule]:
    """Rules from a trainer tree (`params`: arrays, ShapeDtypeStructs or Layouts; only names and
    shapes are read) of `family` in `source` naming into the rollout's `layout`."""
    if family not in FAMILIES:
        raise RuleError(f"preset: unknown family {family!r}; known: {', '.join(FAMILIES)}"
                        + (f" (did you mean {difflib.get_close_matches(family, FAMILIES, 1)[0]!r}?)"
                           if difflib.get_close_matches(family, FAMILIES, 1) else ""))
    if source not in SOURCES or layout not in LAYOUTS:
        raise RuleError(f"preset {family!r}: source must be one of {SOURCES} and layout one of {LAYOUTS}, "
                        f"got source={source!r}, layout={layout!r}")
    shapes = {n: tuple(int(s) for s in leaf.shape) for n, leaf in tree_names(params).items()}
    column = 1 if source == "flax" else 2
    who = f"preset {family!r} (source={source!r}, layout={layout!r})"
    conv = family == "gpt2" and layout == "hf"

    def part(logical: str, path: str, index: tuple[int, ...]) -> Part:
        kind = (LAYER_WEIGHTS.get(logical) or GLOBAL_WEIGHTS[logical])[0]
        if path not in shapes:
            raise RuleError(f"{who} expects source {path!r} (weight {logical!r}, a {kind} tensor), which "
                            f"the tree does not have{closest(path, shapes, 'source')}. The {source!r} naming is "
                            f"described in jax_amem/reshard/presets.py; pass source='flax' or 'maxtext', "
                            "or write rules with from_function")
        transpose, shape = _transform(kind, source, conv, shapes[path][len(index):])
        return Part(path, index, transpose, cast, shape)

    def rule(dst: str, entry, stack: str | None, layer: int | None) -> Rule:
        logicals, axis = (entry if isinstance(entry, tuple) else ((entry,), 0))
        table = LAYER_WEIGHTS if stack else GLOBAL_WEIGHTS
        parts = [part(lg, (stack or "") + table[lg][column], () if layer is None else (layer,)) for lg in logicals]
        groups = tp if layout == "vllm" and len(parts) > 1 else 1
        return Rule.concat(dst, parts, axis=axis, groups=groups, origin=who)

    rules = []
    stacks = STACKS[source]
    if family == "deepseek":
        runs = [(stacks["dense"], False), (stacks["moe"], True)]
    else:
        runs = [(stacks["layers"], True)]
    first = 0
    for stack, moe in runs:
        layer_table, global_table, prefix = family_tables(family, layout, moe)
        probe = stack + LAYER_WEIGHTS[next(iter(_logicals(layer_table)))][column]
        if probe not in shapes:
            raise RuleError(f"{who} expects the layer stack {probe!r} (layers stacked on axis 0), which the "
                            f"tree does not have{closest(probe, shapes, 'source')}. `hf_llama` and the 'flax' naming "
                            "expect a Flax-style tree (layers/attn/q/kernel ...); 'maxtext' expects "
                            "decoder/layers/self_attention/query/kernel ...")
        count = shapes[probe][0]
        for i in range(count):
            for name, entry in layer_table.items():
                rules.append(rule(prefix.format(first + i) + name, entry, stack, i))
        first += count
    for name, entry in global_table.items():
        if name == "lm_head.weight" and tie_embeddings:
            continue
        rules.append(rule(name, entry, None, None))
    return rules


def _logicals(table: dict):
    for entry in table.values():
        yield from (entry[0] if isinstance(entry, tuple) else (entry,))


def _named(family: str):
    def make(params, **options) -> list[Rule]:
        return preset(family, params, **options)
    make.__name__ = family
    make.__doc__ = f"`preset({family!r}, params, source=, layout=, tp=, cast=, tie_embeddings=)`."
    return make


llama, qwen3, qwen3_moe, mixtral, gemma2, deepseek, gpt2 = (_named(f) for f in FAMILIES)
