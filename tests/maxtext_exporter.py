"""MaxText's own MaxText -> Hugging Face checkpoint conversion, re-expressed in numpy: the oracle
the `source="maxtext"` presets are checked against.

Read from AI-Hypercomputer/maxtext (not copied; the same steps written again here):

* src/maxtext/checkpoint_conversion/utils/param_mapping.py at commit
  a429848a0a51b8c6c56c1d1e2f916b2f0e0a031e: the name maps and hooks
  `LLAMA31_MAXTEXT_TO_HF_PARAM_MAPPING` / `_HOOK_FN` (`scale_query_layer`: x.astype(float32) *
  float32(sqrt(head_dim)), cast back; `adjust_rope`: concatenate(x[..., ::2], x[..., 1::2]);
  `reshape_kernel`: x.reshape(flipped target shape).T; query chain [scale, rope, reshape], key
  chain [rope, reshape]), `QWEN3_...` (`reshape_kernel` on every kernel, experts included;
  `pad_embedding_layer`: embedding[:target vocab]), `MIXTRAL_...`
  (`reshape_and_transpose_attention`: x.reshape(hidden_size, -1).T; `reshape_kernel`: x.T;
  `scale_query_layer`: (x * float32(sqrt(head_dim))).astype(x.dtype)), `DEEPSEEK_...`
  (`reshape_kernel` on every kernel).
* src/maxtext/checkpoint_conversion/utils/utils.py at commit
  f75c7e2bc80aefc797b07e4471b2fdb6d6823ec4: `process_maxtext_param` (a scanned tensor is cut
  into layers with `jax.lax.index_in_dim(x, i, axis=param_scan_axis)`; a scanned expert tensor,
  stacked (experts, layers, ...), is cut on axis 0 for the expert, then on axis 0 for the layer),
  `apply_hook_fns` (hooks applied in list order), `_process` (`.squeeze()` after the hooks).

MaxText writes one tensor per expert (`mlp.experts.{e}.gate_proj.weight`, Mixtral's
`block_sparse_moe.experts.{e}.w1.weight`); transformers 5 fuses them when it loads a checkpoint
(transformers/conversion_mapping.py, 'qwen2_moe' and 'mixtral': experts stacked on dim 0, gate
and up concatenated on dim 1, `block_sparse_moe` renamed `mlp`): `to_transformers` does that.
`to_vllm` then fuses per tensor-parallel rank as vLLM's loader does.
"""

import numpy as np

from preset_models import D, E, F, H, HD, I, KV, L, NOPE, R, ROPE, S, V, VHD
from jax_amem.reshard import names_tree

MAXTEXT_COMMIT = "a429848a0a51b8c6c56c1d1e2f916b2f0e0a031e"
FAMILIES = ("llama", "qwen3", "qwen3_moe", "mixtral", "deepseek")
SCALES_QUERIES = ("llama", "mixtral")

# MaxText's parameter names per logical weight (its Linen module paths), by family.
ATTENTION = {"q": "self_attention-query-kernel", "k": "self_attention-key-kernel",
             "v": "self_attention-value-kernel", "o": "self_attention-out-kernel",
             "attn_norm": "pre_self_attention_layer_norm-scale", "mlp_norm": "post_self_attention_layer_norm-scale"}
QK_NORMS = {"q_norm": "self_attention-query_norm-scale", "k_norm": "self_attention-key_norm-scale"}
MLP = {"gate": "mlp-wi_0-kernel", "up": "mlp-wi_1-kernel", "down": "mlp-wo-kernel"}
MLA = {"q": "self_attention-query-kernel", "kv_a": "self_attention-wkv_a-kernel",
       "kv_norm": "self_attention-kv_norm-scale", "kv_b": "self_attention-wkv_b-kernel",
       "o": "self_attention-out-kernel", "attn_norm": "pre_self_attention_layer_norm-scale",
       "mlp_norm": "post_self_attention_layer_norm-scale"}
MOE = {"qwen3_moe": {"router": "moe_block-gate-kernel", "e_gate": "moe_block-wi_0", "e_up": "moe_block-wi_1",
                     "e_down": "moe_block-wo"},
       "mixtral": {"router": "MoeBlock_0-gate-kernel", "e_gate": "MoeBlock_0-wi_0", "e_up": "MoeBlock_0-wi_1",
                   "e_down": "MoeBlock_0-wo"},
       "deepseek": {"router": "DeepSeekMoeBlock_0-MoeBlock_0-gate-kernel",
                    "router_bias": "DeepSeekMoeBlock_0-MoeBlock_0-gate-bias",
                    "e_gate": "DeepSeekMoeBlock_0-MoeBlock_0-wi_0", "e_up": "DeepSeekMoeBlock_0-MoeBlock_0-wi_1",
                    "e_down": "DeepSeekMoeBlock_0-MoeBlock_0-wo",
                    "s_gate": "DeepSeekMoeBlock_0-shared_experts-wi_0-kernel",
                    "s_up": "DeepSeekMoeBlock_0-shared_experts-wi_1-kernel",
                    "s_down": "DeepSeekMoeBlock_0-shared_experts-wo-kernel"}}
GLOBALS = {"embed": "params-token_embedder-embedding", "final_norm": "params-decoder-decoder_norm-scale",
           "lm_head": "params-decoder-logits_dense-kernel"}
# Hugging Face names MaxText writes, per logical weight (per layer; experts get `{e}`).
HF = {"q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
      "o": "self_attn.o_proj.weight", "attn_norm": "input_layernorm.weight",
      "mlp_norm": "post_attention_layernorm.weight", "q_norm": "self_attn.q_norm.weight",
      "k_norm": "self_attn.k_norm.weight", "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight",
      "down": "mlp.down_proj.weight", "kv_a": "self_attn.kv_a_proj_with_mqa.weight",
      "kv_norm": "self_attn.kv_a_layernorm.weight", "kv_b": "self_attn.kv_b_proj.weight",
      "router": "mlp.gate.weight", "router_bias": "mlp.gate.e_score_correction_bias",
      "e_gate": "mlp.experts.{e}.gate_proj.weight", "e_up": "mlp.experts.{e}.up_proj.weight",
      "e_down": "mlp.experts.{e}.down_proj.weight", "s_gate": "mlp.shared_experts.gate_proj.weight",
      "s_up": "mlp.shared_experts.up_proj.weight", "s_down": "mlp.shared_experts.down_proj.weight"}
MIXTRAL_HF = {"router": "block_sparse_moe.gate.weight", "e_gate": "block_sparse_moe.experts.{e}.w1.weight",
              "e_up": "block_sparse_moe.experts.{e}.w3.weight", "e_down": "block_sparse_moe.experts.{e}.w2.weight"}
EXPERTS = ("e_gate", "e_up", "e_down")


def stacks(family):
    """(MaxText stack name, layers, its logical weights -> MaxText names) per stack."""
    if family == "deepseek":  # one dense layer (first_k_dense_replace=1), then one MoE layer
        return [("dense_layers", 1, {**MLA, **MLP}), ("moe_layers", 1, {**MLA, **MOE["deepseek"]})]
    names = dict(ATTENTION)
    if family in ("qwen3", "qwen3_moe"):
        names.update(QK_NORMS)
    names.update(MOE[family] if family in MOE else MLP)
    return [("layers", L, names)]


def maxtext_tree(family, weights, scan_axis):
    """The MaxText parameter tree (under `params`) of `weights` (preset_models.logical: layers on
    axis 0), each layer tensor stacked on `scan_axis` as MaxText's nn.scan does
    (param_scan_axis: a (D,) norm becomes (D, L) on axis 1; experts (E, L, D, I))."""
    flat = {}
    for (stack, _, names), (_, per) in zip(stacks(family), _weight_stacks(family, weights)):
        for logical, name in names.items():
            flat[f"decoder/{stack}/{name.replace('-', '/')}"] = np.moveaxis(per[logical], 0, scan_axis)
    flat["token_embedder/embedding"] = weights["embed"]
    flat["decoder/decoder_norm/scale"] = weights["final_norm"]
    flat["decoder/logits_dense/kernel"] = weights["lm_head"]
    return names_tree(flat)


def _weight_stacks(family, weights):
    return [("dense", weights["dense"]), ("moe", weights["moe"])] if family == "deepseek" \
        else [("layers", weights["layers"])]


def param_map(family):
    """MaxText key -> Hugging Face name (globals), list of names per layer (scanned), or
    per expert a list of names per layer (scanned experts), as the *_PARAM_MAPPING functions."""
    hf = {**HF, **(MIXTRAL_HF if family == "mixtral" else {})}
    out = {GLOBALS["embed"]: "model.embed_tokens.weight", GLOBALS["final_norm"]: "model.norm.weight",
           GLOBALS["lm_head"]: "lm_head.weight"}
    first = 0
    for stack, count, names in stacks(family):
        layers = range(first, first + count)
        for logical, name in names.items():
            key = f"params-decoder-{stack}-{name}"
            if logical in EXPERTS:
                out[key] = [[f"model.layers.{i}.{hf[logical].format(e=e)}" for i in layers] for e in range(E)]
            else:
                out[key] = [f"model.layers.{i}.{hf[logical]}" for i in layers]
        first += count
    return out


def hf_shape(family, name, heads=(H, KV)):
    """The Hugging Face shape of one name MaxText writes (its hf_shape.py tables, for these sizes;
    `heads`: (query heads, KV heads) of a model with other head counts)."""
    mla = family == "deepseek"
    parts = name.split(".")
    module = parts[-2]
    if "experts" in parts and "shared_experts" not in parts:
        return (D, I) if module in ("down_proj", "w2") else (I, D)
    if "shared_experts" in parts:
        return (D, S) if module == "down_proj" else (S, D)
    if module == "gate":
        return (E,) if parts[-1] == "e_score_correction_bias" else (E, D)
    h, kv = heads
    table = {"q_proj": (h * (NOPE + ROPE if mla else HD), D), "k_proj": (kv * HD, D), "v_proj": (kv * HD, D),
             "o_proj": (D, h * (VHD if mla else HD)), "gate_proj": (F, D), "up_proj": (F, D),
             "down_proj": (D, F), "kv_a_proj_with_mqa": (R + ROPE, D), "kv_b_proj": (H * (NOPE + VHD), R),
             "q_norm": (HD,), "k_norm": (HD,), "kv_a_layernorm": (R,), "embed_tokens": (V, D), "lm_head": (V, D)}
    return table.get(module, (D,))


def hooks(family, scale_queries=True, xp=np, head_dim=HD, hidden=D):
    """MaxText key -> the hook functions applied in order (saving_to_hf=True); `xp`: numpy, or
    jax.numpy to trace them; `head_dim`: the config's, which scale_query_layer reads; `hidden`:
    the config's hidden size, which reshape_and_transpose_attention reads."""
    def scale_query_layer(x, target_shape):
        return query_scaled(family, x, head_dim)

    def adjust_rope(x, target_shape):
        return xp.concatenate((x[..., ::2], x[..., 1::2]), axis=x.ndim - 1)

    def reshape_kernel(x, target_shape):
        if family == "mixtral":
            return x.T
        return x.reshape(tuple(np.flip(np.array(target_shape)))).T

    def reshape_and_transpose_attention(x, target_shape):
        return x.reshape(hidden, -1).T

    def pad_embedding_layer(x, target_shape):
        return x if x.shape[0] == target_shape[0] else x[:target_shape[0], :]

    out = {GLOBALS["lm_head"]: [reshape_kernel]}
    if family in ("qwen3", "qwen3_moe"):
        out[GLOBALS["embed"]] = [pad_embedding_layer]
    for stack, _, names in stacks(family):
        key = lambda logical: f"params-decoder-{stack}-{names[logical]}"
        kernels = [lg for lg in names if lg not in ("attn_norm", "mlp_norm", "q_norm", "k_norm", "kv_norm",
                                                    "router_bias")]
        for logical in kernels:
            if family == "mixtral" and logical in ("q", "k", "v", "o"):
                out[key(logical)] = [reshape_and_transpose_attention]
            else:
                out[key(logical)] = [reshape_kernel]
        if family == "llama":
            out[key("q")] = [scale_query_layer, adjust_rope, reshape_kernel]
            out[key("k")] = [adjust_rope, reshape_kernel]
        if family == "mixtral":
            out[key("q")] = [reshape_and_transpose_attention, scale_query_layer]
        if not scale_queries and family in SCALES_QUERIES:
            out[key("q")] = [h for h in out[key("q")] if h is not scale_query_layer]
    return out


def query_scaled(family, x, head_dim):
    """scale_query_layer (saving_to_hf=True): Llama's casts to float32 first, Mixtral's multiplies
    the kernel as it is (numpy promotes it with the float32 scalar); both cast back."""
    depth_scale = np.float32(np.sqrt(head_dim))
    if family == "mixtral":
        return (x * depth_scale).astype(x.dtype)
    return (x.astype(np.float32) * depth_scale).astype(x.dtype)


def _flat(tree, prefix="params"):
    for k, v in tree.items():
        yield from (_flat(v, f"{prefix}-{k}") if isinstance(v, dict) else [(f"{prefix}-{k}", v)])


def export(family, tree, scan_axis, *, vocab=V, scale_queries=True, xp=np, head_dim=HD, heads=(H, KV)):
    """MaxText's to_huggingface on `tree` (maxtext_tree): {Hugging Face name: numpy array}.
    `scale_queries=False` leaves out scale_query_layer (for a tree whose queries are unscaled);
    `head_dim`: the model's (HD, or another for a tree whose heads are regrouped); `heads`:
    (query heads, KV heads) of a model with other head counts (of head_dim HD)."""
    mapping, chain = param_map(family), hooks(family, scale_queries, xp, head_dim)
    out = {}
    for key, x in _flat(tree):
        x = np.asarray(x) if xp is np else x
        targets = mapping[key]
        if isinstance(targets, str):                       # unscanned
            cuts = [(targets, x)]
        elif not isinstance(targets[0], list):             # scanned: layer i on param_scan_axis
            cuts = [(name, _index(x, i, scan_axis)) for i, name in enumerate(targets)]
        else:  # scanned experts: MaxText slices axis 0 (expert) then axis 0 (layer), its code written for
            # param_scan_axis=1's (experts, layers, ...); with param_scan_axis=0 the stack is (layers,
            # experts, ...) and the same two cuts are taken on the axes that hold them
            expert_axis = 1 if scan_axis == 0 else 0
            cuts = [(name, _index(_index(x, e, expert_axis), i, 0))
                    for e, names in enumerate(targets) for i, name in enumerate(names)]
        for name, value in cuts:
            shape = (vocab, D) if name == "model.embed_tokens.weight" else hf_shape(family, name, heads)
            for hook in chain.get(key, []):
                value = hook(value, shape)
            value = xp.squeeze(value)
            assert value.shape == tuple(shape), (name, value.shape, shape)
            out[name] = value
    return out


def _index(x, i, axis):
    """jax.lax.index_in_dim(x, i, axis, keepdims=False), written as an index."""
    return x[(slice(None),) * axis + (i,)]


def to_transformers(family, state, xp=np):
    """transformers 5's load-time conversion of per-expert tensors (conversion_mapping.py)."""
    out, experts = {}, {}
    for name, value in state.items():
        name = name.replace(".block_sparse_moe.", ".mlp.")
        parts = name.split(".")
        if "experts" in parts and "shared_experts" not in parts:
            layer, e, which = parts[2], int(parts[-3]), parts[-2]
            which = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}.get(which, which)
            experts.setdefault(layer, {}).setdefault(which, {})[e] = value
        else:
            out[name] = value
    for layer, per in experts.items():
        stack = {w: xp.stack([per[w][e] for e in range(E)], axis=0) for w in per}   # MergeModulelist(dim=0)
        p = f"model.layers.{layer}.mlp.experts."
        out[p + "gate_up_proj"] = xp.concatenate([stack["gate_proj"], stack["up_proj"]], axis=1)  # Concatenate(dim=1)
        out[p + "down_proj"] = stack["down_proj"]
    return out


def _per_rank(members, axis, tp, xp):
    chunks = [xp.split(m, tp, axis=axis) for m in members]
    return xp.concatenate([c[r] for r in range(tp) for c in chunks], axis=axis)


def to_vllm(family, state, tp, xp=np):
    """vLLM's fused tensors from the transformers state: qkv_proj, gate_up_proj and the experts'
    w13_weight per tensor-parallel rank, w2_weight; Mixtral's MoE under block_sparse_moe."""
    out = dict(state)
    for name in [n for n in state if n.endswith("self_attn.q_proj.weight")]:
        p = name[: -len("q_proj.weight")]
        if p + "k_proj.weight" in state:
            out[p + "qkv_proj.weight"] = _per_rank([out.pop(p + f"{x}_proj.weight") for x in "qkv"], 0, tp, xp)
    for name in [n for n in state if n.endswith("gate_proj.weight")]:
        p = name[: -len("gate_proj.weight")]
        out[p + "gate_up_proj.weight"] = _per_rank([out.pop(p + "gate_proj.weight"), out.pop(p + "up_proj.weight")],
                                                   0, tp, xp)
    moe = "block_sparse_moe." if family == "mixtral" else "mlp."
    for name in [n for n in state if n.endswith("mlp.experts.gate_up_proj")]:
        p = name[: -len("mlp.experts.gate_up_proj")]
        gate, up = xp.split(out.pop(name), 2, axis=1)
        out[p + moe + "experts.w13_weight"] = _per_rank([gate, up], 1, tp, xp)
        out[p + moe + "experts.w2_weight"] = out.pop(p + "mlp.experts.down_proj")
        out[p + moe + "gate.weight"] = out.pop(p + "mlp.gate.weight")
    return out
