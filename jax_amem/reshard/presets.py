"""Ready rules per model family, source naming and destination layout.

    rules.preset("qwen3_moe", params, source="maxtext", layout="vllm", tp=2)
    rules.qwen3(params)                          # source="flax", layout="hf"

Families: llama, qwen3, qwen3_moe, mixtral, gemma (Llama's tensors, tied head), gemma2 (and
pre/post feed-forward norms), gemma3 (Gemma2's and per-head q/k norms), deepseek (MoE with shared
experts, first dense layers, multi-head latent attention as in Hugging Face's DeepseekV3), gpt2,
qwen2 (Llama's tensors and q/k/v biases), phi3 (Llama's tensors, its checkpoint fusing q/k/v into
qkv_proj and gate/up into gate_up_proj); "mistral" reads as "llama" (ALIASES). Gemma's RMSNorm
multiplies by (1 + weight) in the model itself: the trainer's tree holds the checkpoint's values
and the presets copy them.

Sources (the trainer's tree, named by `tree_names`; layers stacked on `scan_axis`, found from
the shapes when not given):

* `"flax"`: the naming `hf_llama` uses: `layers/attn/q/kernel` (L, D, H*hd), kernels
  (in, out), heads merged. jax_amem's own naming (Flax conventions: `kernel` (in, out),
  `scale`, `embedding`), not a framework's exporter.
* `"maxtext"`: MaxText's tree, converted as MaxText's own exporter to Hugging Face converts it
  (`EXPORTERS`: its checkpoint_conversion hooks, file and commit): `decoder/layers/
  self_attention/query/kernel` (D, H, hd) per layer, out kernels (H, hd, D), MLP kernels
  (in, out) `mlp/wi_0`, `wi_1`, `wo`, experts (E, D, I) (`moe_block/` for Qwen3-MoE,
  `MoeBlock_0/` for Mixtral, `DeepSeekMoeBlock_0/MoeBlock_0/` for DeepSeek), layers on
  MaxText's `param_scan_axis` (1 by default, or 0). Llama's RoPE reorder (even then odd
  rotary features) is done, and Llama's and Mixtral's query scaling (`scale_query_layer`: the
  query kernel times float32(sqrt(head_dim))) runs in the copy as constant steps, rounded as
  the exporter rounds it (`query_scale`); an exporter the presets do not follow (Gemma 2's and
  Gemma 3's norm offsets, embedding scaling and split layers) or none (Gemma 1, Phi-3) is
  refused at `preset()` with the reason named (`REFUSED`).

Layouts (the rollout's names and shapes):

* `"hf"`: transformers' own (installed 5.x: Qwen3-MoE / Mixtral / DeepSeek experts fused
  as 3-D `mlp.experts.gate_up_proj` (E, 2I, D) and `down_proj` (E, D, I); GPT-2 Conv1D
  kernels (in, out) and fused `c_attn`; Phi-3's fused `qkv_proj` and `gate_up_proj`). Whole
  tensors: `tp` must be 1.
* `"vllm"`: vLLM's fused tensors: `qkv_proj`, `gate_up_proj`, MoE `w13_weight` (E, 2I, D)
  and `w2_weight` (E, D, I), each fused tensor interleaved per tensor-parallel rank (`tp`).
  Where tp exceeds the KV heads, each rank's `qkv_proj` (and its bias) holds its query heads
  and one KV head, rank r head r // (tp // kv_heads), as vLLM's QKVParallelLinear loads it.

The tables below are the whole mapping: copy and edit them for another naming.
"""

from __future__ import annotations

import difflib
import numbers
from dataclasses import dataclass, replace

import numpy as np

from . import fragments as F
from .affine import FLOATS, Affine, Step, step_for
from .from_jax import tree_names
from .listing import few
from .lowering import RuleError, closest
from .rule_checks import checked_cast
from .rule_types import Part, Piece, Rule
from .unread import UnreadWeightsError, unread_weights

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
# Phi-3's checkpoint (transformers' Phi3ForCausalLM): Llama's attention and MLP with q, k, v fused
# on the output axis in that order, and gate then up. These are vLLM's names for Llama's fused
# tensors, and vLLM's Phi3ForCausalLM is its Llama: Phi-3's 'vllm' layout is Llama's (`_vllm`).
PHI3_ATTN = {"self_attn.qkv_proj.weight": (("q", "k", "v"), 0), "self_attn.o_proj.weight": "o"}
PHI3_MLP = {"mlp.gate_up_proj.weight": (("gate", "up"), 0), "mlp.down_proj.weight": "down"}
NORMS = {"input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "mlp_norm"}
QK_NORM = {"self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm"}
# The families with per-head q/k norms: their q_norm's width is the head_dim.
QK_NORM_FAMILIES = ("qwen3", "qwen3_moe", "gemma3")
QKV_BIAS = {"self_attn.q_proj.bias": "q_bias", "self_attn.k_proj.bias": "k_bias", "self_attn.v_proj.bias": "v_bias"}
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
        elif name == "self_attn.q_proj.bias":
            out["self_attn.qkv_proj.bias"] = (("q_bias", "k_bias", "v_bias"), 0)
        elif name in ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_proj.bias",
                      "self_attn.v_proj.bias"):
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
        phi3_fused = family == "phi3" and layout == "hf"   # the vllm layout fuses Llama's names itself
        attn = MLA if family == "deepseek" else PHI3_ATTN if phi3_fused else LLAMA_ATTN
        layer = {**attn, **NORMS}
        if family in QK_NORM_FAMILIES:
            layer.update(QK_NORM)
        if family == "qwen2":
            layer.update(QKV_BIAS)
        if family in ("gemma2", "gemma3"):
            layer.update({"pre_feedforward_layernorm.weight": "pre_ffw_norm",
                          "post_feedforward_layernorm.weight": "post_ffw_norm"})
        if family in ("qwen3_moe", "mixtral") or (family == "deepseek" and moe_layer):
            layer.update(HF_EXPERTS)
            if family == "deepseek":
                layer.update({"mlp.gate.e_score_correction_bias": "router_bias", **SHARED})
        else:
            layer.update(PHI3_MLP if phi3_fused else DENSE_MLP)
    if layout == "vllm":
        layer = _vllm(layer, "block_sparse_moe" if family == "mixtral" else "mlp")
    return layer, globals_, prefix




# MaxText's own paths where a family differs from the table above (its MoE blocks).
MAXTEXT_PATHS = {
    "qwen3_moe": {"router": "moe_block/gate/kernel", "e_gate": "moe_block/wi_0", "e_up": "moe_block/wi_1",
                  "e_down": "moe_block/wo"},
    "deepseek": {"router": "DeepSeekMoeBlock_0/MoeBlock_0/gate/kernel",
                 "router_bias": "DeepSeekMoeBlock_0/MoeBlock_0/gate/bias",
                 "e_gate": "DeepSeekMoeBlock_0/MoeBlock_0/wi_0", "e_up": "DeepSeekMoeBlock_0/MoeBlock_0/wi_1",
                 "e_down": "DeepSeekMoeBlock_0/MoeBlock_0/wo",
                 "s_gate": "DeepSeekMoeBlock_0/shared_experts/wi_0/kernel",
                 "s_up": "DeepSeekMoeBlock_0/shared_experts/wi_1/kernel",
                 "s_down": "DeepSeekMoeBlock_0/shared_experts/wo/kernel"},
}

# The exporter each source="maxtext" preset reproduces (MaxText's MaxText -> Hugging Face hooks), or
# for gemma2 and gemma3 the one whose steps their refusal names (REFUSED).
MAXTEXT_COMMIT = "a429848a0a51b8c6c56c1d1e2f916b2f0e0a031e"
MAXTEXT_HOOKS = "AI-Hypercomputer/maxtext src/maxtext/checkpoint_conversion/utils/param_mapping.py"
EXPORTERS = {"llama": "LLAMA31_MAXTEXT_TO_HF_PARAM_HOOK_FN", "qwen3": "QWEN3_MAXTEXT_TO_HF_PARAM_HOOK_FN",
             "qwen3_moe": "QWEN3_MAXTEXT_TO_HF_PARAM_HOOK_FN", "mixtral": "MIXTRAL_MAXTEXT_TO_HF_PARAM_HOOK_FN",
             "deepseek": "DEEPSEEK_MAXTEXT_TO_HF_PARAM_HOOK_FN", "gemma2": "GEMMA2_MAXTEXT_TO_HF_PARAM_HOOK_FN",
             "gemma3": "GEMMA3_MAXTEXT_TO_HF_PARAM_HOOK_FN"}
# Families whose MaxText exporter reorders the rotary features of q and k (`adjust_rope`:
# x[..., ::2] then x[..., 1::2]): a permutation, done by the preset.
MAXTEXT_ROPE = {"llama": ("q", "k")}
# Families whose MaxText exporter multiplies the query kernel by sqrt(head_dim) (MaxText folds
# 1/sqrt(head_dim) into it), and the dtype the multiply runs in: Llama's hook casts to float32
# first (`x.astype(float32) * c`), Mixtral's multiplies the kernel as it is by a float32 scalar
# (`x * c`, numpy's promotion: float32 for bfloat16 / float16 / float32, float64 for float64).
# Both cast the product back to the kernel's dtype. `query_scale` writes that as constant steps.
MAXTEXT_QUERY_SCALE = {"llama": "float32", "mixtral": "promoted"}
# source="maxtext" presets refused whole, with the reason.
REFUSED = {
    "gemma2": ("MaxText's Gemma2 exporter (GEMMA2_MAXTEXT_TO_HF_PARAM_HOOK_FN) subtracts 1 from every RMSNorm scale "
               "(scale_rmsnorm_layer), divides the embedding by sqrt(hidden_size) (pad_hf_embedding_layer), "
               "multiplies the query kernels by sqrt(head_dim) (scale_query_layer) and stores two Hugging Face "
               "layers per MaxText layer (_local / _global); constant arithmetic is not a copy"),
    "gemma3": ("MaxText's Gemma3 exporter (GEMMA3_MAXTEXT_TO_HF_PARAM_HOOK_FN) subtracts 1 from every RMSNorm scale, "
               "q/k norms included (scale_rmsnorm), divides the embedding by bfloat16(sqrt(hidden_size)) "
               "(pad_and_scale_embedding) and reads the layers from six scanned sub-stacks (layers_0 .. layers_5, "
               "five local and one global) and a remainder; constant arithmetic is not a copy"),
    "gemma": (f"MaxText's exporter to Hugging Face ({MAXTEXT_HOOKS} at {MAXTEXT_COMMIT[:12]}) has no Gemma (1) "
              "hooks (its HOOK_FNS list Gemma 2 and Gemma 3 models only): no conversion to reproduce"),
    "gpt2": "MaxText has no GPT-2 model or GPT-2 to Hugging Face exporter to reproduce",
    "qwen2": "the presets follow no MaxText exporter for Qwen2 (EXPORTERS lists the ones they follow)",
    "phi3": (f"MaxText's exporter to Hugging Face ({MAXTEXT_HOOKS} at {MAXTEXT_COMMIT[:12]}) has no Phi-3 hooks "
             "(its HOOK_FNS list Gemma 2 and 3, Llama 3.1, Qwen3, DeepSeek 3, GPT-OSS, Mixtral and OLMo 3 models): "
             "no conversion to reproduce"),
}

FAMILIES = ("llama", "qwen3", "qwen3_moe", "mixtral", "gemma", "gemma2", "gemma3", "deepseek", "gpt2", "qwen2",
            "phi3")
# Names a user may type for a family whose tensors are another's: Mistral's are Llama's (names and
# shapes; transformers' MistralForCausalLM and vLLM's hold the same tensors as their Llama), so
# "mistral" reads as "llama". Only from the 'flax' naming: the presets follow no MaxText exporter
# for Mistral (`resolved_family`).
ALIASES = {"mistral": "llama"}
# Per kind: (rank of one layer's tensor in the flax naming, in the maxtext naming).
RANKS = {"in_heads": (2, 3), "out_heads": (2, 3), "linear": (2, 2), "experts": (3, 3), "vector": (1, 1),
         "head_vector": (1, 2)}
# Per kind: (axis of one layer's tensor that a vLLM rank splits in a fused tensor, what it counts),
# in the maxtext naming; the flax naming merges heads, so there it is the merged axis.
SPLIT = {"in_heads": (1, "heads"), "linear": (1, "output features"), "experts": (2, "expert width"),
         "head_vector": (0, "heads"), "vector": (0, "features")}
# The parts of a fused qkv that vLLM replicates when the tensor-parallel size exceeds their heads.
KV_PARTS = ("k", "v", "k_bias", "v_bias")


def _transform(kind: str, source: str, conv: bool, shape) -> tuple[tuple | None, tuple | None]:
    """(transpose, reshape) turning one layer's source tensor of `shape` into the destination's
    (out, in) form, or (in, out) for GPT-2's Conv1D (`conv`). For MaxText this is its exporter's
    `reshape_kernel` (`x.reshape(flipped target).T`) written as a transpose then a reshape."""
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


@dataclass(frozen=True)
class _Spec:
    """One source tensor as a destination part: `layer` on `layer_axis` removed, the first
    `cut[1]` rows of axis `cut[0]` kept (a vocabulary cut), the `rope` axis reordered evens
    then odds, then `transpose`, `shape` (a reshape) and `cast`, in that order; the elements
    go through `affine`'s scalar steps (the query scaling) before the cast."""
    path: str
    layer: int | None
    layer_axis: int
    transpose: tuple | None
    shape: tuple | None
    cast: str | None
    rope: int | None = None
    cut: tuple[int, int] | None = None
    affine: Affine | None = None   # constant steps every element goes through before the cast
    replicas: int = 1              # in a fused tensor: consecutive rank blocks holding one slice (Part.replicas)

    def part(self) -> Part | None:
        """The same as a `Part`, when a Part can say it (layers on axis 0, no reorder, no cut, no
        constant steps: a Part's scale runs in the source's dtype, MaxText's in float32)."""
        if self.rope is not None or self.cut is not None or self.affine is not None or \
                (self.layer is not None and self.layer_axis != 0):
            return None
        return Part(self.path, () if self.layer is None else (self.layer,), self.transpose, self.cast, self.shape,
                    replicas=self.replicas)

    def fragments(self, full_shape) -> tuple[list, tuple]:
        # the steps are scalars: where they sit among the slices and moves below changes nothing
        frags, value = [replace(F.whole(self.path, full_shape, dtype=self.cast), affine=self.affine)], list(full_shape)
        if self.layer is not None:
            start, limit = [0] * len(value), list(value)
            start[self.layer_axis], limit[self.layer_axis] = self.layer, self.layer + 1
            frags = F.squeeze(F.slice_box(frags, start, limit), [self.layer_axis])
            del value[self.layer_axis]
        if self.cut is not None:
            value[self.cut[0]] = self.cut[1]
            frags = F.slice_box(frags, [0] * len(value), value)
        if self.rope is not None:
            n = value[self.rope]
            frags = F.pick(frags, self.rope, [*range(0, n, 2), *range(1, n, 2)])
        if self.transpose is not None:
            frags, value = F.transpose(frags, self.transpose), [value[a] for a in self.transpose]
        if self.shape is not None:
            frags, value = F.reshape(frags, value, self.shape), list(self.shape)
        return frags, tuple(value)


def _emit(dst: str, specs: list[_Spec], axis: int, groups: int, shapes: dict, origin: str) -> list:
    """One `Rule` when parts can say it, else the `Piece`s of the same concatenation."""
    parts = [s.part() for s in specs]
    if all(p is not None for p in parts):
        return [Rule.concat(dst, parts, axis=axis, groups=groups, origin=origin)]
    values = [s.fragments(shapes[s.path]) for s in specs]
    axis %= len(values[0][1])
    frags, offset = [], 0
    for group in range(groups):
        for spec, (value, shape) in zip(specs, values):
            step = shape[axis] // (groups // spec.replicas)
            start, limit = [0] * len(shape), list(shape)
            start[axis] = group // spec.replicas * step
            limit[axis] = start[axis] + step
            frags.extend(F.shift(F.slice_box(value, start, limit), axis, offset))
            offset += step
    return F.to_pieces(dst, frags, {s.path: len(shapes[s.path]) for s in specs}, origin)


def _moved(pieces: list[Piece], dst: str, layer_axis: int, layer: int) -> list[Piece]:
    """Layer 0's pieces of one destination, written for `layer` into `dst`: the source start
    moves along the layer axis (where `perm` put it)."""
    out = []
    for p in pieces:
        at = layer_axis if p.perm is None else p.perm.index(layer_axis)
        start = p.src_start[:at] + (p.src_start[at] + layer,) + p.src_start[at + 1:]
        out.append(replace(p, dst=dst, src_start=start))
    return out


def query_scale(family: str, dtype, head_dim: int) -> Affine:
    """MaxText's `scale_query_layer` (saving to Hugging Face) on a query kernel of `dtype`, as
    constant steps: the multiply by float32(sqrt(head_dim)) in the dtype the hook computes in
    (`MAXTEXT_QUERY_SCALE`), then the product rounded back to the kernel's dtype (its
    `.astype(original_dtype)`, a multiply by 1 in that dtype) where the two differ."""
    source = np.dtype(dtype)
    compute = np.dtype(np.float32) if MAXTEXT_QUERY_SCALE[family] == "float32" else np.result_type(source, np.float32)
    steps = [step_for("mul", compute.name, np.float32(np.sqrt(head_dim)))]
    if compute != source:
        steps.append(Step("mul", source.name, (1.0,)))
    return Affine(tuple(steps))


def _whole_number(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_options(who: str, family: str, source: str, layout: str, tp, scan_axis, vocab_size,
                   unscaled_queries, head_dim, cast=None, tie_embeddings=False) -> None:
    """Every option checked before the tree is read, each error naming the option."""
    checked_cast(cast, who, floating=True)
    if not isinstance(tie_embeddings, bool):
        raise RuleError(f"{who}: tie_embeddings={tie_embeddings!r:.60} is True or False (True: the rollout's head "
                        "is its embedding, written once)")
    if not _whole_number(tp) or tp < 1:
        raise RuleError(f"{who}: tp={tp!r} is not a tensor-parallel size: give an int >= 1 (the rollout's "
                        "ranks per replica)")
    if tp != 1 and layout != "vllm":
        raise RuleError(f"{who}: tp={tp} applies to the 'vllm' layout's fused tensors (qkv_proj, gate_up_proj, "
                        f"w13_weight, interleaved per rank); the {layout!r} layout holds whole tensors and a "
                        "tensor-parallel rollout's layout splits them: pass tp=1, or layout='vllm'")
    if scan_axis is not None and (not _whole_number(scan_axis) or scan_axis < 0):
        raise RuleError(f"{who}: scan_axis={scan_axis!r} is not an axis: give the axis the trainer stacks layers "
                        "on (MaxText's param_scan_axis: 1 by default, or 0), or None to find it from the shapes")
    if vocab_size is not None and (not _whole_number(vocab_size) or vocab_size < 1):
        raise RuleError(f"{who}: vocab_size={vocab_size!r} is not a vocabulary size: give the rollout's "
                        "vocabulary (an int >= 1) to cut a padded embedding, or None")
    if head_dim is not None and (not _whole_number(head_dim) or head_dim < 1):
        raise RuleError(f"{who}: head_dim={head_dim!r} is not a head size: give the model config's head_dim "
                        "(an int >= 1), or None")
    if not isinstance(unscaled_queries, bool):
        raise RuleError(f"{who}: unscaled_queries={unscaled_queries!r} is True or False")
    if source == "maxtext" and family in REFUSED:
        raise RuleError(f"{who}: refused: {REFUSED[family]}. Write the conversion with "
                        "jax_amem.rules.from_function (docs/reshard.md shows MaxText's hooks used that way), "
                        "or use source='flax' with a tree in that naming")
    scaled = source == "maxtext" and family in MAXTEXT_QUERY_SCALE
    if unscaled_queries and not scaled:
        raise RuleError(f"{who}: unscaled_queries=True applies only to trees whose exporter scales the queries "
                        f"(source='maxtext' with {' or '.join(map(repr, MAXTEXT_QUERY_SCALE))}); this preset copies "
                        "the query kernels as they are: leave it False")


def _scaled_query(who: str, family: str, path: str, dtype: str, one: tuple) -> Affine:
    """The query scaling of MaxText's exporter for the query kernel `path` (one layer: (D, N, hd))."""
    if dtype not in FLOATS:
        raise RuleError(f"{who}: MaxText's exporter ({EXPORTERS[family]}'s scale_query_layer, {MAXTEXT_HOOKS} at "
                        f"{MAXTEXT_COMMIT[:12]}) multiplies the query kernel {path!r} by sqrt(head_dim) in floating "
                        f"point, and it is {dtype}: the copy scales floating values only ({', '.join(FLOATS)}). "
                        "Pass unscaled_queries=True if its values are already plain, or write the conversion with "
                        "rules.from_function")
    return query_scale(family, dtype, one[-1])


def weight_paths(family: str, source: str) -> dict[str, str]:
    """Every tree path the presets know as a weight in `source` naming ({path: logical weight}),
    whether or not `family`'s tables read it (an attention bias, a head of its own, a router):
    `preset` refuses a tree that holds one its rules leave unread (`check_all_read`)."""
    paths = {_source_path(family, source, logical): logical for logical in GLOBAL_WEIGHTS}
    for stack in STACKS[source].values():
        paths.update({stack + _source_path(family, source, logical): logical for logical in LAYER_WEIGHTS})
    return paths


def check_all_read(who: str, family: str, source: str, names, rules, tie_embeddings: bool,
                   layers: dict[str, int]) -> None:
    """UnreadWeightsError naming every leaf of the tree (`names`: its paths) at a path the presets
    know as a weight (`weight_paths`) that `rules` do not read, with what to do: the rollout would
    serve a model without it. `layers`: the layer count of each layer stack the rules read."""
    unread = unread_weights(names, weight_paths(family, source), rules)
    if not unread:
        return
    listed = few(list(unread), {path: count for path in unread for stack, count in layers.items()
                                if path.startswith(stack)})
    advice = {}
    head = next((path for path, logical in unread.items() if logical == "lm_head"), None)
    if head is not None and tie_embeddings:
        advice["head"] = (f"{head!r} is a head of its own, and tie_embeddings=True writes the embedding as the "
                          "rollout's head: pass tie_embeddings=False into a rollout model with a head of its own "
                          "(lm_head.weight, tie_word_embeddings=False), or leave the head out of the tree if the "
                          "trainer ties it")
    elif head is not None:
        advice["head"] = (f"the {family!r} preset writes no head of its own (the model ties it to the embedding): "
                          f"leave {head!r} out of the tree if the trainer ties it, or write the rules with "
                          "rules.from_function")
    others = list(dict.fromkeys(logical for logical in unread.values() if logical != "lm_head"))
    if others:
        writers = _writers(family, source, set(others))
        advice["weights"] = (f"the {family!r} preset writes no {', '.join(others)}: "
                             + (" or ".join(f"family={w!r}" for w in writers) + " writes them, if the tree is that "
                                "family's; or write the rules with rules.from_function" if writers else
                                f"no preset from the {source!r} naming writes them with the rest of {family!r}'s "
                                "weights: check that family= is the tree's, or write the rules with "
                                "rules.from_function"))
    raise UnreadWeightsError(f"{who}: the tree holds {len(unread)} weight(s) that the rules would not read: {listed}; "
                             "the rollout would serve a model without them, not the trainer's: "
                             + "; ".join(advice.values()), unread, listed, advice, rules)


def _writers(family: str, source: str, missing: set[str]) -> list[str]:
    """The families whose presets (from `source`) write every weight `family`'s does and `missing`,
    the closest only: one that writes more than another such family (Gemma3's norms besides
    Qwen3's q/k norms) would expect weights the tree has not."""
    def written(f: str) -> set[str]:
        tables = [table for moe in (False, True) for table in family_tables(f, "hf", moe)[:2]]
        return {logical for table in tables for logical in _logicals(table)}
    wanted = written(family) | missing
    fits = {f: written(f) for f in FAMILIES
            if f != family and not (source == "maxtext" and f in REFUSED) and written(f) >= wanted}
    return [f for f, has in fits.items() if not any(other < has for other in fits.values())]


def _source_path(family: str, source: str, logical: str) -> str:
    table = LAYER_WEIGHTS if logical in LAYER_WEIGHTS else GLOBAL_WEIGHTS
    if source == "maxtext":
        return MAXTEXT_PATHS.get(family, {}).get(logical, table[logical][2])
    return table[logical][1]


def _layer_axis(who: str, stack: str, leaves: dict, norm: str, width: int | None, scan_axis) -> tuple[int, int]:
    """(axis, layer count) of the layer stack `stack` (its tensors `leaves`: name -> shape).

    Every tensor of a scanned stack holds the layers on one axis (Flax's nn.scan and MaxText's
    param_scan_axis), with one extent: the axes 0 and 1 that agree are the candidates, and the
    layer norm `norm` without that axis must be one feature vector of the model width `width`."""
    def fits(axis: int) -> bool:
        if any(len(s) <= axis for s in leaves.values()) or len({s[axis] for s in leaves.values()}) != 1:
            return False
        s = leaves.get(norm)
        return width is None or s is None or s[:axis] + s[axis + 1:] == (width,)

    listing = ", ".join(f"{n!r} {s}" for n, s in list(leaves.items())[:4])
    if scan_axis is not None:
        if not fits(scan_axis):
            raise RuleError(f"{who}: scan_axis={scan_axis}: the tensors of the layer stack {stack!r} do not hold "
                            f"their layers on axis {scan_axis} (they must share its extent, and a norm scale "
                            f"without it must be ({width},)): {listing}. MaxText stacks layers on its "
                            "param_scan_axis (1 by default); pass that axis, or scan_axis=None to find it")
        return scan_axis, next(iter(leaves.values()))[scan_axis]
    found = [a for a in (0, 1) if fits(a)]
    if len(found) == 1:
        return found[0], next(iter(leaves.values()))[found[0]]
    if not found:
        raise RuleError(f"{who}: the layer stack {stack!r} has no layer axis: no axis 0 or 1 that every tensor "
                        f"shares with one extent and that leaves ({width},) norm scales: {listing}. "
                        "A scanned model stacks every layer tensor on one axis (MaxText's param_scan_axis, "
                        "1 by default); pass scan_axis= if it is another, or check that the tree is this family's")
    raise RuleError(f"{who}: the layer stack {stack!r} fits layers on axis 0 and on axis 1 ({listing}): "
                    "pass scan_axis=0 or scan_axis=1 (MaxText's param_scan_axis, 1 by default)")


def preset(family: str, params, *, source: str = "flax", layout: str = "hf", tp: int = 1,
           cast: str | None = None, tie_embeddings: bool = False, scan_axis: int | None = None,
           vocab_size: int | None = None, unscaled_queries: bool = False, head_dim: int | None = None) -> list:
    """Rules from a trainer tree (`params`: arrays, ShapeDtypeStructs or Layouts; names and shapes
    are read, and a scaled query kernel's dtype) of `family` in `source` naming into the
    rollout's `layout`.

    `scan_axis`: the axis every layer tensor is stacked on (None: found from the shapes).
    `vocab_size`: keep the first rows of a padded embedding (and lm_head), as MaxText's
    exporter cuts its padded vocabulary. `unscaled_queries`: for MaxText's Llama and Mixtral,
    whose exporter multiplies the query kernel by sqrt(head_dim): by default the copy does the
    same (in the dtype the exporter computes in, read from the query kernel's dtype); True
    says this tree's query kernels are already plain, and they are copied as they are.
    `head_dim`: the model's, for the 'flax' naming with layout="vllm" and tp > 1 (it merges the
    heads with head_dim; Qwen3's and Gemma3's q_norm hold it, and the 'maxtext' naming's kernels do): each
    rank gets whole query heads, and where tp exceeds the KV heads (a multiple of them, as vLLM
    requires) one KV head, rank r head r // (tp // kv_heads), as vLLM's QKVParallelLinear loads it.
    Returns `Rule`s, and `Piece`s for what a `Part` cannot say (layers on axis 1, a reorder,
    the query scaling).

    A leaf at a path the presets know as a weight (`weight_paths`: a head of its own with
    tie_embeddings=True, q/k/v biases into a family whose preset writes none, another family's
    norms or router) that the rules would not read is refused (`UnreadWeightsError`, a
    RuleError naming each such path and what to do): the rollout would serve a model without
    it. Leaves at other paths are not weights the presets know (optimizer state, a value head
    under a name of its own) and are left out without a word."""
    family = resolved_family(family, source)
    if source not in SOURCES or layout not in LAYOUTS:
        raise RuleError(f"preset {family!r}: source must be one of {SOURCES} and layout one of {LAYOUTS}, "
                        f"got source={source!r}, layout={layout!r}")
    who = f"preset {family!r} (source={source!r}, layout={layout!r})"
    _check_options(who, family, source, layout, tp, scan_axis, vocab_size, unscaled_queries, head_dim, cast,
                   tie_embeddings)
    made = _PresetRules(who, family, params, source=source, layout=layout, tp=tp, cast=cast, vocab_size=vocab_size,
                        unscaled_queries=unscaled_queries, head_dim=head_dim)
    out, layers = made.layer_rules(scan_axis)
    out.extend(made.global_rules(tie_embeddings))
    check_all_read(who, family, source, made.shapes, out, tie_embeddings, layers)
    return out


class _PresetRules:
    """One preset's rules for one tree, part by part: the per-tensor spec (`spec`), how a fused
    tensor is cut into rank blocks (`replicas_in`, `head_size`), each destination's rules
    (`rules_for`), the layer stacks (`layer_rules`) and the tensors outside them (`global_rules`).
    Options are `preset()`'s, checked there."""

    def __init__(self, who, family, params, *, source, layout, tp, cast, vocab_size, unscaled_queries, head_dim):
        self.who, self.family, self.source, self.layout, self.tp = who, family, source, layout, tp
        self.cast, self.vocab_size, self.head_dim = cast, vocab_size, head_dim
        self.leaves_by_name = tree_names(params)
        self.shapes = shapes = _shapes_of(who, self.leaves_by_name)
        self.conv = family == "gpt2" and layout == "hf"
        self.maxtext = maxtext = source == "maxtext"
        self.rope = MAXTEXT_ROPE.get(family, ()) if maxtext else ()
        self.scale_queries = maxtext and family in MAXTEXT_QUERY_SCALE and not unscaled_queries
        embed = _source_path(family, source, "embed")
        self.width = shapes[embed][1] if len(shapes.get(embed, ())) == 2 else None
        if vocab_size is not None and embed in shapes and vocab_size > shapes[embed][0]:
            raise RuleError(f"{who}: vocab_size={vocab_size} is more than the {shapes[embed][0]} rows of {embed!r}: "
                            "the cut keeps the first vocab_size rows of a padded embedding")
        self.global_table = None   # the last stack's family tables name the global tensors

    def spec(self, logical: str, stack: str | None, layer: int | None, axis: int) -> _Spec:
        who, shapes, maxtext = self.who, self.shapes, self.maxtext
        kind = (LAYER_WEIGHTS.get(logical) or GLOBAL_WEIGHTS[logical])[0]
        path = (stack or "") + _source_path(self.family, self.source, logical)
        if path not in shapes:
            raise RuleError(f"{who} expects source {path!r} (weight {logical!r}, a {kind} tensor), which "
                            f"the tree does not have{closest(path, shapes, 'source')}. The {self.source!r} naming is "
                            f"described in jax_amem/reshard/presets.py; pass source='flax' or 'maxtext', "
                            "or write rules with from_function")
        shape = shapes[path]
        one = shape if layer is None else shape[:axis] + shape[axis + 1:]
        rank = RANKS[kind][maxtext]
        if layer is not None and len(one) != rank:
            where = "" if layer is None else f" without its layer axis {axis}"
            raise RuleError(f"{who}: source {path!r} (weight {logical!r}) has shape {shape}, {one}{where}; a "
                            f"{kind} tensor in the {self.source!r} naming has {rank} axes"
                            + (" (in, heads, head_dim) / (heads, head_dim, out)" if maxtext and "heads" in kind
                               else "") + ": is the tree this family's, in this naming?")
        transpose, reshape = _transform(kind, self.source, self.conv, one)
        affine = (_scaled_query(who, self.family, path, np.dtype(self.leaves_by_name[path].dtype).name, one)
                  if self.scale_queries and logical == "q" else None)
        cut = None
        if self.vocab_size is not None and logical in ("embed", "lm_head"):
            vocab_axis = 0 if logical == "embed" else 1       # embedding (V, D), lm_head kernel (D, V)
            if shape[vocab_axis] != self.vocab_size:
                cut = (vocab_axis, self.vocab_size)
        return _Spec(path, layer, axis, transpose, reshape, self.cast, 2 if logical in self.rope else None, cut,
                     affine)

    def head_size(self, dst: str, logical: str, s: _Spec, one: list, split: int) -> int:
        """head_dim of a heads part: its own axis in the maxtext naming; in the flax naming, which
        merges heads with head_dim, `head_dim=` or the width of Qwen3's (or Gemma3's) q_norm scale."""
        who, shapes, head_dim = self.who, self.shapes, self.head_dim
        held, by = (one[split + 1], f"source {s.path!r} (shape {shapes[s.path]})") if self.maxtext else (None, "")
        stack = s.path[:len(s.path) - len(_source_path(self.family, self.source, logical))]
        norm = stack + _source_path(self.family, self.source, "q_norm")
        if held is None and self.family in QK_NORM_FAMILIES and norm in shapes:
            held, by = shapes[norm][-1], f"the q_norm scale {norm!r} (shape {shapes[norm]})"
        if head_dim is not None and held is not None and head_dim != held:
            raise RuleError(f"{who}: head_dim={head_dim} differs from the head_dim {held} of {by}: leave head_dim "
                            "out (the tree holds it)")
        if held is not None or head_dim is not None:
            return held or head_dim
        raise RuleError(f"{who}: tp={self.tp} gives each rank of {dst!r} whole heads (and one replicated KV head "
                        f"where tp exceeds the KV heads), and the 'flax' naming merges the heads with head_dim "
                        f"(source {s.path!r} is {shapes[s.path]}): pass head_dim= (the model config's head_dim)")

    def replicas_in(self, dst: str, logicals, specs: list[_Spec]) -> list[int]:
        """A fused tensor is cut into tp rank blocks: each part's split axis must divide, except a
        KV part (k, v and their biases) with fewer heads than ranks. vLLM's QKVParallelLinear
        gives each rank one KV head then, rank r head r // (tp // heads): its replicas."""
        who, shapes, tp = self.who, self.shapes, self.tp
        out = []
        for logical, s in zip(logicals, specs):
            kind = (LAYER_WEIGHTS.get(logical) or GLOBAL_WEIGHTS[logical])[0]
            split, what = SPLIT.get(kind, (0, "rows"))
            one = list(shapes[s.path])
            if s.layer is not None:
                del one[s.layer_axis]
            count = one[split]
            full = split if s.layer is None or split < s.layer_axis else split + 1
            where = f"(axis {full} of source {s.path!r}, shape {shapes[s.path]})"
            if kind in ("in_heads", "head_vector"):
                size = self.head_size(dst, logical, s, one, split)
                if not self.maxtext:
                    if count % size:
                        raise RuleError(f"{who}: head_dim={size} does not divide the {count} features of {logical!r} "
                                        f"{where}, which merge its heads: give the model config's head_dim")
                    count, what = count // size, f"heads (of head_dim {size}, merged)"
                if logical in KV_PARTS and count < tp:
                    if tp % count:
                        raise RuleError(f"{who}: tp={tp} exceeds the {count} KV heads of {logical!r} {where} and is "
                                        f"not a multiple of them: vLLM then gives each rank one KV head, held by "
                                        f"tp / {count} ranks (QKVParallelLinear's num_kv_head_replicas), so tp must "
                                        f"divide {count} or be a multiple of it")
                    out.append(tp // count)
                    continue
            if count % tp:
                raise RuleError(f"{who}: tp={tp} does not divide the {count} {what} of {logical!r} {where}, which "
                                f"{dst!r} splits over the tp ranks: give a tp that divides it (vLLM needs whole "
                                "heads per rank)")
            out.append(1)
        return out

    def rules_for(self, dst: str, entry, stack: str | None, layer: int | None, axis: int) -> list:
        logicals, concat = (entry if isinstance(entry, tuple) else ((entry,), 0))
        specs = [self.spec(lg, stack, layer, axis) for lg in logicals]
        groups = self.tp if self.layout == "vllm" and len(specs) > 1 else 1
        if groups > 1:
            specs = [replace(s, replicas=r) for s, r in zip(specs, self.replicas_in(dst, logicals, specs))]
        return _emit(dst, specs, concat, groups, self.shapes, self.who)

    def layer_rules(self, scan_axis: int | None) -> tuple[list, dict]:
        """Every layer stack's rules, and each stack's layer count."""
        who, shapes, family, source = self.who, self.shapes, self.family, self.source
        out, layers = [], {}
        stacks = STACKS[source]
        runs = [(stacks["dense"], False), (stacks["moe"], True)] if family == "deepseek" else [(stacks["layers"], True)]
        first = 0
        for stack, moe in runs:
            layer_table, self.global_table, prefix = family_tables(family, self.layout, moe)
            logicals = list(dict.fromkeys(_logicals(layer_table)))
            probe = stack + _source_path(family, source, logicals[0])
            if probe not in shapes:
                raise RuleError(f"{who} expects the layer stack {probe!r} (every layer stacked on one axis), which "
                                f"the tree does not have{closest(probe, shapes, 'source')}. `hf_llama` and the 'flax' "
                                "naming expect a Flax-style tree (layers/attn/q/kernel ...); 'maxtext' expects "
                                "decoder/layers/self_attention/query/kernel ...")
            leaves = {stack + _source_path(family, source, lg): None for lg in logicals}
            leaves = {n: shapes[n] for n in leaves if n in shapes}
            norm = stack + _source_path(family, source, "attn_norm")
            axis, count = _layer_axis(who, stack.rstrip("/"), leaves, norm, self.width, scan_axis)
            layers[stack] = count
            # Layer 0's pieces are cut once and moved to each layer (the cut is the same, only the
            # source's layer coordinate differs): a RoPE reorder is one piece per rotary row.
            templates = {name: self.rules_for(prefix.format(first) + name, entry, stack, 0, axis)
                         for name, entry in layer_table.items()}
            for i in range(count):
                for name, entry in layer_table.items():
                    made = templates[name]
                    if isinstance(made[0], Rule):
                        made = made if i == 0 else self.rules_for(prefix.format(first + i) + name, entry, stack, i, axis)
                    elif i:
                        made = _moved(made, prefix.format(first + i) + name, axis, i)
                    out.extend(made)
            first += count
        return out, layers

    def global_rules(self, tie_embeddings: bool) -> list:
        """The embedding, final norm and head (none for a tied head)."""
        out = []
        for name, entry in self.global_table.items():
            if name == "lm_head.weight" and tie_embeddings:
                continue
            out.extend(self.rules_for(name, entry, None, None, 0))
        return out


def resolved_family(family, source: str = "flax") -> str:
    """`family` as the presets name it (an alias, ALIASES, resolved); RuleError naming the known
    families otherwise."""
    if isinstance(family, str) and family in ALIASES:
        if source == "maxtext":
            raise RuleError(f"preset {family!r} reads as {ALIASES[family]!r} from a 'flax' tree (its tensors are "
                            f"{ALIASES[family]!r}'s), but the presets follow no MaxText exporter for {family!r}: "
                            f"pass family={ALIASES[family]!r} if your MaxText tree was converted as "
                            f"{ALIASES[family]!r}'s (its rotary reorder and query scaling then apply), or write "
                            "rules with from_function")
        return ALIASES[family]
    if not isinstance(family, str) or family not in FAMILIES:
        near = difflib.get_close_matches(family, FAMILIES, 1) if isinstance(family, str) else []
        raise RuleError(f"preset: unknown family {family!r}; known: {', '.join(FAMILIES)}, and "
                        + ", ".join(f"{a!r} (read as {f!r})" for a, f in ALIASES.items())
                        + (f" (did you mean {near[0]!r}?)" if near else ""))
    return family


def _logicals(table: dict):
    for entry in table.values():
        yield from (entry[0] if isinstance(entry, tuple) else (entry,))


def _named(family: str):
    def make(params, **options) -> list:
        return preset(family, params, **options)
    make.__name__ = family
    make.__doc__ = (f"`preset({family!r}, params, source=, layout=, tp=, cast=, tie_embeddings=, scan_axis=, "
                    "vocab_size=, unscaled_queries=, head_dim=)`.")
    return make


llama, qwen3, qwen3_moe, mixtral, gemma, gemma2, gemma3, deepseek, gpt2, qwen2, phi3 = (_named(f) for f in FAMILIES)



def _shapes_of(who: str, leaves_by_name: dict) -> dict[str, tuple[int, ...]]:
    """Each leaf's shape; a leaf without one (not an array, ShapeDtypeStruct or Layout) refused."""
    shapes = {}
    for name, leaf in leaves_by_name.items():
        try:
            shapes[name] = tuple(int(s) for s in leaf.shape)
        except (AttributeError, TypeError):
            raise RuleError(f"{who}: params leaf {name!r} is {type(leaf).__name__}, not an array, "
                            "ShapeDtypeStruct or Layout: give the trainer's parameter tree") from None
    return shapes
