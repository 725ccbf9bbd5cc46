"""Fourteen more transformers families, as a user who trains them in JAX would export them.

Per family, `FAMILIES[name]` holds:
* `config()`: a tiny transformers config (hidden 32, 2 layers, vocabulary 64);
* `shapes`: the trainer's tree (Flax-style: kernels (in, out), heads split [D, heads, head_dim],
  layers stacked on axis 0), as {'/'-path: shape};
* `convert(p, xp)`: the user's exporter, array operations only, so it runs under numpy (the
  oracle: its result is what `load_state_dict` loads) and under jax.numpy (what
  `rules.from_function` traces). Each leans on a move other families' exporters need:
  fused and per-head-interleaved QKV, strided slices for interleaved rotary, constant-index
  takes over a pipeline's layer order, flip, broadcast_to / repeat / tile for shared or
  expanded heads, unstack, stop_gradient and optimization_barrier, tied embeddings.

Names and shapes here are written from each family's modelling code, not from jax_amem.
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np

L, D, H, KV, V, F = 2, 32, 4, 2, 64, 64
HD = D // H
POS = 32


def _np_unstack(x, axis=0):
    return [np.take(x, i, axis=axis) for i in range(x.shape[axis])]


class Ops:
    """The few operations numpy and jax.numpy spell differently."""

    def __init__(self, xp):
        self.xp = xp
        self.is_jax = xp.__name__.startswith("jax")

    def stop_gradient(self, x):
        if self.is_jax:
            import jax
            return jax.lax.stop_gradient(x)
        return x

    def barrier(self, *xs):
        if self.is_jax:
            import jax
            return jax.lax.optimization_barrier(xs)
        return xs

    def unstack(self, x, axis=0):
        return self.xp.unstack(x, axis=axis) if self.is_jax else _np_unstack(x, axis)


@dataclass(frozen=True)
class Family:
    name: str                          # transformers' prefix: <name>ForCausalLM
    config: Callable
    shapes: dict
    convert: Callable                  # (params, Ops) -> {state-dict name: array}
    layer_convert: Callable | None = None   # (one layer, Ops) -> {name: array}, for from_layer_function
    prefix: str = "model.layers.{}."


def _tf():
    import transformers
    return transformers


def _get(p, path):
    for key in path.split("/"):
        p = p[key]
    return p


def _attn_shapes(kv=KV, bias=False, o_bias=False, q_norm=None, k_norm=None):
    out = {"attn/q/kernel": (L, D, H, HD), "attn/k/kernel": (L, D, kv, HD), "attn/v/kernel": (L, D, kv, HD),
           "attn/o/kernel": (L, H, HD, D)}
    if bias:
        out.update({"attn/q/bias": (L, H, HD), "attn/k/bias": (L, kv, HD), "attn/v/bias": (L, kv, HD)})
    if o_bias:
        out["attn/o/bias"] = (L, D)
    if q_norm:
        out["attn/q_norm/scale"] = (L,) + q_norm
    if k_norm:
        out["attn/k_norm/scale"] = (L,) + k_norm
    return out


def _heads_out(w):
    """[D, heads, hd] kernel -> HF [heads*hd, D]."""
    return w.reshape(w.shape[0], -1).T


def _o_proj(w):
    """[H, hd, D] kernel -> HF [D, H*hd]."""
    return w.reshape(-1, w.shape[-1]).T


# ----------------------------------------------------------------------------- Llama-like families


def _gated_mlp_shapes(f=F):
    return {"mlp/gate/kernel": (L, D, f), "mlp/up/kernel": (L, D, f), "mlp/down/kernel": (L, f, D)}


def _llama_layer(layer, ops, norms=("input_layernorm", "post_attention_layernorm"), bias=False):
    xp = ops.xp
    out = {"self_attn.q_proj.weight": _heads_out(layer["attn"]["q"]["kernel"]),
           "self_attn.k_proj.weight": _heads_out(layer["attn"]["k"]["kernel"]),
           "self_attn.v_proj.weight": _heads_out(layer["attn"]["v"]["kernel"]),
           "self_attn.o_proj.weight": _o_proj(layer["attn"]["o"]["kernel"]),
           "mlp.gate_proj.weight": layer["mlp"]["gate"]["kernel"].T,
           "mlp.up_proj.weight": layer["mlp"]["up"]["kernel"].T,
           "mlp.down_proj.weight": layer["mlp"]["down"]["kernel"].T}
    if bias:
        for n in "qkv":
            out[f"self_attn.{n}_proj.bias"] = xp.reshape(layer["attn"][n]["bias"], (-1,))
    for hf, ours in zip(norms, ("input_norm", "post_attn_norm")):
        out[f"{hf}.weight"] = layer[ours]["scale"]
    return out


def _layer(p, stack, i):
    """Layer i of a stacked tree, by a Python loop over the stack (slice + squeeze)."""
    import jax
    return jax.tree_util.tree_map(lambda x: x[i], _get(p, stack))


def _globals(p, prefix="model.", tied=False):
    out = {f"{prefix}embed_tokens.weight": p["embed"]["embedding"], f"{prefix}norm.weight": p["final_norm"]["scale"]}
    if not tied:
        out["lm_head.weight"] = p["lm_head"]["kernel"].T
    return out


def _global_shapes(tied=False, norm_bias=False):
    out = {"embed/embedding": (V, D), "final_norm/scale": (D,)}
    if not tied:
        out["lm_head/kernel"] = (D, V)
    if norm_bias:
        out["final_norm/bias"] = (D,)
    return out


def _norm_shapes(*names, bias=False):
    out = {}
    for n in names:
        out[f"{n}/scale"] = (L, D)
        if bias:
            out[f"{n}/bias"] = (L, D)
    return out


def qwen2_layer(layer, ops):
    return _llama_layer(layer, ops, bias=True)


def qwen2(p, ops):
    """Layers by from_layer_function (see test); the globals here."""
    return _globals(p)


def phi3(p, ops):
    """Fused qkv_proj and gate_up_proj, layers unstacked with jnp.unstack."""
    xp = ops.xp
    out = _globals(p)
    attn, mlp = p["layers"]["attn"], p["layers"]["mlp"]
    qs, ks, vs, os_ = (ops.unstack(attn[n]["kernel"]) for n in "qkvo")
    gates, ups, downs = (ops.unstack(mlp[n]["kernel"]) for n in ("gate", "up", "down"))
    for i in range(L):
        pre = f"model.layers.{i}."
        out[pre + "self_attn.qkv_proj.weight"] = xp.concatenate([_heads_out(qs[i]), _heads_out(ks[i]),
                                                                 _heads_out(vs[i])], axis=0)
        out[pre + "self_attn.o_proj.weight"] = _o_proj(os_[i])
        out[pre + "mlp.gate_up_proj.weight"] = xp.concatenate([gates[i].T, ups[i].T], axis=0)
        out[pre + "mlp.down_proj.weight"] = downs[i].T
        out[pre + "input_layernorm.weight"] = p["layers"]["input_norm"]["scale"][i]
        out[pre + "post_attention_layernorm.weight"] = p["layers"]["post_attn_norm"]["scale"][i]
    return out


def olmo2(p, ops):
    """Norms after attention and MLP; q_norm over all heads; the trainer shares one k_norm
    across its key/value heads (broadcast_to), exported under stop_gradient."""
    xp = ops.xp
    out = _globals(p)
    for i in range(L):
        layer = _layer(p, "layers", i)
        one = _llama_layer(layer, ops, norms=("post_attention_layernorm", "post_feedforward_layernorm"))
        one["self_attn.q_norm.weight"] = ops.stop_gradient(layer["attn"]["q_norm"]["scale"])
        one["self_attn.k_norm.weight"] = xp.broadcast_to(layer["attn"]["k_norm"]["scale"], (KV, HD)).reshape(-1)
        out.update({f"model.layers.{i}.{k}": v for k, v in one.items()})
    return out


GEMMA_HD = 8


def gemma3(p, ops):
    """Four norms per layer, per-head q/k norms, the tied head written under both names."""
    out = _globals(p, tied=True)
    out["lm_head.weight"] = p["embed"]["embedding"]
    for i in range(L):
        layer = _layer(p, "layers", i)
        one = _llama_layer(layer, ops)
        one["pre_feedforward_layernorm.weight"] = layer["pre_ffw_norm"]["scale"]
        one["post_feedforward_layernorm.weight"] = layer["post_ffw_norm"]["scale"]
        one["self_attn.q_norm.weight"] = layer["attn"]["q_norm"]["scale"]
        one["self_attn.k_norm.weight"] = layer["attn"]["k_norm"]["scale"]
        out.update({f"model.layers.{i}.{k}": v for k, v in one.items()})
    return out


def stablelm(p, ops):
    """LayerNorms with biases; the layer's tensors pass an optimization_barrier first."""
    out = _globals(p)
    out["model.norm.bias"] = p["final_norm"]["bias"]
    for i in range(L):
        layer = _layer(p, "layers", i)
        one = _llama_layer(layer, ops)
        one["input_layernorm.bias"], one["post_attention_layernorm.bias"] = ops.barrier(
            layer["input_norm"]["bias"], layer["post_attn_norm"]["bias"])
        out.update({f"model.layers.{i}.{k}": v for k, v in one.items()})
    return out


def starcoder2(p, ops):
    """Biases everywhere, a plain MLP, tied head; the trainer is multi-query (one key/value
    head), expanded to the model's two with jnp.repeat."""
    xp = ops.xp
    out = {"model.embed_tokens.weight": p["embed"]["embedding"], "model.norm.weight": p["final_norm"]["scale"],
           "model.norm.bias": p["final_norm"]["bias"]}
    for i in range(L):
        layer = _layer(p, "layers", i)
        attn = layer["attn"]
        one = {"self_attn.q_proj.weight": _heads_out(attn["q"]["kernel"]),
               "self_attn.q_proj.bias": attn["q"]["bias"].reshape(-1),
               "self_attn.o_proj.weight": _o_proj(attn["o"]["kernel"]), "self_attn.o_proj.bias": attn["o"]["bias"],
               "mlp.c_fc.weight": layer["mlp"]["fc"]["kernel"].T, "mlp.c_fc.bias": layer["mlp"]["fc"]["bias"],
               "mlp.c_proj.weight": layer["mlp"]["proj"]["kernel"].T, "mlp.c_proj.bias": layer["mlp"]["proj"]["bias"]}
        for n in "kv":
            one[f"self_attn.{n}_proj.weight"] = _heads_out(xp.repeat(attn[n]["kernel"], KV, axis=1))
            one[f"self_attn.{n}_proj.bias"] = xp.repeat(attn[n]["bias"], KV, axis=0).reshape(-1)
        for hf, ours in (("input_layernorm", "input_norm"), ("post_attention_layernorm", "post_attn_norm")):
            one[f"{hf}.weight"], one[f"{hf}.bias"] = layer[ours]["scale"], layer[ours]["bias"]
        out.update({f"model.layers.{i}.{k}": v for k, v in one.items()})
    return out


def cohere(p, ops):
    """One norm per layer (parallel attention and MLP), tied head; the multi-query trainer's
    key/value head tiled to the model's two."""
    xp = ops.xp
    out = {"model.embed_tokens.weight": p["embed"]["embedding"], "model.norm.weight": p["final_norm"]["scale"]}
    for i in range(L):
        layer = _layer(p, "layers", i)
        attn = layer["attn"]
        one = {"self_attn.q_proj.weight": _heads_out(attn["q"]["kernel"]),
               "self_attn.o_proj.weight": _o_proj(attn["o"]["kernel"]),
               "mlp.gate_proj.weight": layer["mlp"]["gate"]["kernel"].T,
               "mlp.up_proj.weight": layer["mlp"]["up"]["kernel"].T,
               "mlp.down_proj.weight": layer["mlp"]["down"]["kernel"].T,
               "input_layernorm.weight": layer["input_norm"]["scale"]}
        for n in "kv":
            one[f"self_attn.{n}_proj.weight"] = _heads_out(xp.tile(attn[n]["kernel"], (1, KV, 1)))
        out.update({f"model.layers.{i}.{k}": v for k, v in one.items()})
    return out


def qwen2_moe(p, ops):
    """Routed experts fused per layer ([E, 2I, D] gate_up, [E, D, I] down), a shared expert and
    its gate ([1, D] from the trainer's [D])."""
    xp = ops.xp
    out = _globals(p)
    for i in range(L):
        layer = _layer(p, "layers", i)
        one = _llama_layer({**layer, "mlp": layer["shared"]}, ops, bias=True)
        one = {k.replace("mlp.", "mlp.shared_expert."): v for k, v in one.items()}
        moe = layer["moe"]
        one["mlp.gate.weight"] = moe["router"]["kernel"].T
        one["mlp.experts.gate_up_proj"] = xp.concatenate([xp.swapaxes(moe["gate"], 1, 2),
                                                          xp.swapaxes(moe["up"], 1, 2)], axis=1)
        one["mlp.experts.down_proj"] = xp.swapaxes(moe["down"], 1, 2)
        one["mlp.shared_expert_gate.weight"] = layer["shared_gate"]["kernel"][None]
        out.update({f"model.layers.{i}.{k}": v for k, v in one.items()})
    return out


E, MOE_I, SHARED_I = 4, 16, 32

# ----------------------------------------------------------------------------- GPT-style families


def _interleaved_rotary_to_halves(w, xp, rotary=HD):
    """A trainer using interleaved rotary pairs (GPT-J style: (x0, x1), (x2, x3)...) exported
    to a model that rotates halves: within each head's first `rotary` dims, the even then the
    odd ones. w: [..., heads, head_dim]."""
    part = w[..., :rotary]
    return xp.concatenate([part[..., ::2], part[..., 1::2], w[..., rotary:]], axis=-1)


def gpt_neox(p, ops):
    """query_key_value interleaved per head ([H, 3, hd] rows), interleaved rotary converted with
    strided slices, biases; layers in the pipeline's stage order, restored with a take."""
    xp = ops.xp
    order = np.argsort(NEOX_STAGE_ORDER)  # the trainer keeps layer NEOX_STAGE_ORDER[j] at j
    stack = {path: xp.take(x, order, axis=0) for path, x in _flat(p["layers"]).items()}
    out = {"gpt_neox.embed_in.weight": p["embed"]["embedding"], "lm_head.weight": p["lm_head"]["kernel"].T,
           "gpt_neox.final_layer_norm.weight": p["final_norm"]["scale"],
           "gpt_neox.final_layer_norm.bias": p["final_norm"]["bias"]}
    for i in range(L):
        w = {path: x[i] for path, x in stack.items()}
        q, k = (_interleaved_rotary_to_halves(w[f"attn/{n}/kernel"], xp, NEOX_ROTARY) for n in "qk")
        qb, kb = (_interleaved_rotary_to_halves(w[f"attn/{n}/bias"], xp, NEOX_ROTARY) for n in "qk")
        pre = f"gpt_neox.layers.{i}."
        out[pre + "attention.query_key_value.weight"] = xp.stack([q, k, w["attn/v/kernel"]], axis=2).reshape(D, -1).T
        out[pre + "attention.query_key_value.bias"] = xp.stack([qb, kb, w["attn/v/bias"]], axis=1).reshape(-1)
        out[pre + "attention.dense.weight"] = _o_proj(w["attn/o/kernel"])
        out[pre + "attention.dense.bias"] = w["attn/o/bias"]
        out[pre + "mlp.dense_h_to_4h.weight"] = w["mlp/fc/kernel"].T
        out[pre + "mlp.dense_h_to_4h.bias"] = w["mlp/fc/bias"]
        out[pre + "mlp.dense_4h_to_h.weight"] = w["mlp/proj/kernel"].T
        out[pre + "mlp.dense_4h_to_h.bias"] = w["mlp/proj/bias"]
        for hf, ours in (("input_layernorm", "input_norm"), ("post_attention_layernorm", "post_attn_norm")):
            out[f"{pre}{hf}.weight"], out[f"{pre}{hf}.bias"] = w[f"{ours}/scale"], w[f"{ours}/bias"]
    return out


NEOX_STAGE_ORDER = (1, 0)
NEOX_ROTARY = HD // 2  # rotary_pct 0.5


def _flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = v
    return out


def phi(p, ops):
    """Biased q/k/v/dense, fc1/fc2, a biased lm_head; the trainer stores its layers last first
    (jnp.flip restores the order)."""
    xp = ops.xp
    stack = {path: xp.flip(x, axis=0) for path, x in _flat(p["layers"]).items()}
    out = {"model.embed_tokens.weight": p["embed"]["embedding"], "lm_head.weight": p["lm_head"]["kernel"].T,
           "lm_head.bias": p["lm_head"]["bias"], "model.final_layernorm.weight": p["final_norm"]["scale"],
           "model.final_layernorm.bias": p["final_norm"]["bias"]}
    for i in range(L):
        w = {path: x[i] for path, x in stack.items()}
        pre = f"model.layers.{i}."
        for n in "qkv":
            out[f"{pre}self_attn.{n}_proj.weight"] = _heads_out(w[f"attn/{n}/kernel"])
            out[f"{pre}self_attn.{n}_proj.bias"] = w[f"attn/{n}/bias"].reshape(-1)
        out[pre + "self_attn.dense.weight"] = _o_proj(w["attn/o/kernel"])
        out[pre + "self_attn.dense.bias"] = w["attn/o/bias"]
        out[pre + "mlp.fc1.weight"], out[pre + "mlp.fc1.bias"] = w["mlp/fc/kernel"].T, w["mlp/fc/bias"]
        out[pre + "mlp.fc2.weight"], out[pre + "mlp.fc2.bias"] = w["mlp/proj/kernel"].T, w["mlp/proj/bias"]
        out[pre + "input_layernorm.weight"], out[pre + "input_layernorm.bias"] = w["input_norm/scale"], w["input_norm/bias"]
    return out


def bloom(p, ops):
    """query_key_value interleaved per head, an embedding LayerNorm, the tied head written
    under both names; layers unstacked."""
    xp = ops.xp
    out = {"transformer.word_embeddings.weight": p["embed"]["embedding"],
           "lm_head.weight": p["embed"]["embedding"],
           "transformer.word_embeddings_layernorm.weight": p["embed_norm"]["scale"],
           "transformer.word_embeddings_layernorm.bias": p["embed_norm"]["bias"],
           "transformer.ln_f.weight": p["final_norm"]["scale"], "transformer.ln_f.bias": p["final_norm"]["bias"]}
    layers = {path: ops.unstack(x) for path, x in _flat(p["layers"]).items()}
    for i in range(L):
        w = {path: x[i] for path, x in layers.items()}
        pre = f"transformer.h.{i}."
        out[pre + "self_attention.query_key_value.weight"] = xp.stack(
            [w["attn/q/kernel"], w["attn/k/kernel"], w["attn/v/kernel"]], axis=2).reshape(D, -1).T
        out[pre + "self_attention.query_key_value.bias"] = xp.stack(
            [w["attn/q/bias"], w["attn/k/bias"], w["attn/v/bias"]], axis=1).reshape(-1)
        out[pre + "self_attention.dense.weight"] = _o_proj(w["attn/o/kernel"])
        out[pre + "self_attention.dense.bias"] = w["attn/o/bias"]
        out[pre + "mlp.dense_h_to_4h.weight"], out[pre + "mlp.dense_h_to_4h.bias"] = w["mlp/fc/kernel"].T, w["mlp/fc/bias"]
        out[pre + "mlp.dense_4h_to_h.weight"], out[pre + "mlp.dense_4h_to_h.bias"] = w["mlp/proj/kernel"].T, w["mlp/proj/bias"]
        for hf, ours in (("input_layernorm", "input_norm"), ("post_attention_layernorm", "post_attn_norm")):
            out[f"{pre}{hf}.weight"], out[f"{pre}{hf}.bias"] = w[f"{ours}/scale"], w[f"{ours}/bias"]
    return out


def falcon(p, ops):
    """Multi-query query_key_value ([H + 2] heads of rows: queries, the key, the value),
    parallel attention with one LayerNorm, no biases, the tied head left to the embedding."""
    xp = ops.xp
    out = {"transformer.word_embeddings.weight": p["embed"]["embedding"],
           "transformer.ln_f.weight": p["final_norm"]["scale"], "transformer.ln_f.bias": p["final_norm"]["bias"]}
    for i in range(L):
        layer = _layer(p, "layers", i)
        attn = layer["attn"]
        pre = f"transformer.h.{i}."
        out[pre + "self_attention.query_key_value.weight"] = xp.concatenate(
            [_heads_out(attn[n]["kernel"]) for n in "qkv"], axis=0)
        out[pre + "self_attention.dense.weight"] = _o_proj(attn["o"]["kernel"])
        out[pre + "mlp.dense_h_to_4h.weight"] = layer["mlp"]["fc"]["kernel"].T
        out[pre + "mlp.dense_4h_to_h.weight"] = layer["mlp"]["proj"]["kernel"].T
        out[pre + "input_layernorm.weight"] = layer["input_norm"]["scale"]
        out[pre + "input_layernorm.bias"] = layer["input_norm"]["bias"]
    return out


def opt(p, ops):
    """Separate biased projections (k, v, q in the state dict), learned positions (offset 2
    rows included), tied head left to the embedding."""
    out = {"model.decoder.embed_tokens.weight": p["embed"]["embedding"],
           "model.decoder.embed_positions.weight": p["pos_embed"]["embedding"],
           "model.decoder.final_layer_norm.weight": p["final_norm"]["scale"],
           "model.decoder.final_layer_norm.bias": p["final_norm"]["bias"]}
    for i in range(L):
        layer = _layer(p, "layers", i)
        attn = layer["attn"]
        pre = f"model.decoder.layers.{i}."
        for n in "qkv":
            out[f"{pre}self_attn.{n}_proj.weight"] = _heads_out(attn[n]["kernel"])
            out[f"{pre}self_attn.{n}_proj.bias"] = attn[n]["bias"].reshape(-1)
        out[pre + "self_attn.out_proj.weight"] = _o_proj(attn["o"]["kernel"])
        out[pre + "self_attn.out_proj.bias"] = attn["o"]["bias"]
        out[pre + "fc1.weight"], out[pre + "fc1.bias"] = layer["mlp"]["fc"]["kernel"].T, layer["mlp"]["fc"]["bias"]
        out[pre + "fc2.weight"], out[pre + "fc2.bias"] = layer["mlp"]["proj"]["kernel"].T, layer["mlp"]["proj"]["bias"]
        for hf, ours in (("self_attn_layer_norm", "input_norm"), ("final_layer_norm", "post_attn_norm")):
            out[f"{pre}{hf}.weight"], out[f"{pre}{hf}.bias"] = layer[ours]["scale"], layer[ours]["bias"]
    return out


def gpt_bigcode(p, ops):
    """Multi-query c_attn (queries, then one key and one value head), learned positions, tied
    head left to the embedding."""
    xp = ops.xp
    out = {"transformer.wte.weight": p["embed"]["embedding"], "transformer.wpe.weight": p["pos_embed"]["embedding"],
           "transformer.ln_f.weight": p["final_norm"]["scale"], "transformer.ln_f.bias": p["final_norm"]["bias"]}
    for i in range(L):
        layer = _layer(p, "layers", i)
        attn = layer["attn"]
        pre = f"transformer.h.{i}."
        out[pre + "attn.c_attn.weight"] = xp.concatenate([_heads_out(attn[n]["kernel"]) for n in "qkv"], axis=0)
        out[pre + "attn.c_attn.bias"] = xp.concatenate([attn[n]["bias"].reshape(-1) for n in "qkv"], axis=0)
        out[pre + "attn.c_proj.weight"], out[pre + "attn.c_proj.bias"] = _o_proj(attn["o"]["kernel"]), attn["o"]["bias"]
        out[pre + "mlp.c_fc.weight"], out[pre + "mlp.c_fc.bias"] = layer["mlp"]["fc"]["kernel"].T, layer["mlp"]["fc"]["bias"]
        out[pre + "mlp.c_proj.weight"], out[pre + "mlp.c_proj.bias"] = layer["mlp"]["proj"]["kernel"].T, layer["mlp"]["proj"]["bias"]
        for hf, ours in (("ln_1", "input_norm"), ("ln_2", "post_attn_norm")):
            out[f"{pre}{hf}.weight"], out[f"{pre}{hf}.bias"] = layer[ours]["scale"], layer[ours]["bias"]
    return out


def _plain_mlp_shapes(f=F, bias=True):
    out = {"mlp/fc/kernel": (L, D, f), "mlp/proj/kernel": (L, f, D)}
    if bias:
        out.update({"mlp/fc/bias": (L, f), "mlp/proj/bias": (L, D)})
    return out


# ----------------------------------------------------------------------------- the table


def _common(**extra):
    return dict(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H, intermediate_size=F,
                attn_implementation="eager", **extra)


FAMILIES = {
    "Phi3": Family("Phi3", lambda: _tf().Phi3Config(**_common(num_key_value_heads=KV, pad_token_id=0)),
                   {**_attn_shapes(), **_gated_mlp_shapes(), **_norm_shapes("input_norm", "post_attn_norm"),
                    **_global_shapes()}, phi3),
    "GPTNeoX": Family("GPTNeoX", lambda: _tf().GPTNeoXConfig(**_common(rotary_pct=0.5)),
                      {**_attn_shapes(kv=H, bias=True, o_bias=True), **_plain_mlp_shapes(),
                       **_norm_shapes("input_norm", "post_attn_norm", bias=True),
                       **_global_shapes(norm_bias=True)}, gpt_neox),
    "Qwen2": Family("Qwen2", lambda: _tf().Qwen2Config(**_common(num_key_value_heads=KV)),
                    {**_attn_shapes(bias=True), **_gated_mlp_shapes(), **_norm_shapes("input_norm", "post_attn_norm"),
                     **_global_shapes()}, qwen2, layer_convert=qwen2_layer),
    "Olmo2": Family("Olmo2", lambda: _tf().Olmo2Config(**_common(num_key_value_heads=KV, pad_token_id=0)),
                    {**_attn_shapes(q_norm=(D,), k_norm=(HD,)), **_gated_mlp_shapes(),
                     **_norm_shapes("input_norm", "post_attn_norm"), **_global_shapes()}, olmo2),
    "Gemma3": Family("Gemma3", lambda: _tf().Gemma3TextConfig(**_common(num_key_value_heads=KV, head_dim=HD,
                                                                          sliding_window=8)),
                     {**_attn_shapes(q_norm=(HD,), k_norm=(HD,)), **_gated_mlp_shapes(),
                      **_norm_shapes("input_norm", "post_attn_norm", "pre_ffw_norm", "post_ffw_norm"),
                      **_global_shapes(tied=True)}, gemma3),
    "StableLm": Family("StableLm", lambda: _tf().StableLmConfig(**_common(num_key_value_heads=KV)),
                       {**_attn_shapes(), **_gated_mlp_shapes(), **_norm_shapes("input_norm", "post_attn_norm", bias=True),
                        **_global_shapes(norm_bias=True)}, stablelm),
    "Falcon": Family("Falcon", lambda: _tf().FalconConfig(vocab_size=V, hidden_size=D, num_hidden_layers=L,
                                                         num_attention_heads=H, multi_query=True,
                                                         new_decoder_architecture=False, attn_implementation="eager"),
                     {**_attn_shapes(kv=1), **_plain_mlp_shapes(f=4 * D, bias=False),
                      **_norm_shapes("input_norm", bias=True), **_global_shapes(tied=True, norm_bias=True)}, falcon),
    "OPT": Family("OPT", lambda: _tf().OPTConfig(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                                 ffn_dim=F, word_embed_proj_dim=D, max_position_embeddings=POS,
                                                 attn_implementation="eager"),
                  {**_attn_shapes(kv=H, bias=True, o_bias=True), **_plain_mlp_shapes(),
                   **_norm_shapes("input_norm", "post_attn_norm", bias=True),
                   "pos_embed/embedding": (POS + 2, D), **_global_shapes(tied=True, norm_bias=True)}, opt),
    "Starcoder2": Family("Starcoder2", lambda: _tf().Starcoder2Config(**_common(num_key_value_heads=KV)),
                         {**_attn_shapes(kv=1, bias=True, o_bias=True), **_plain_mlp_shapes(),
                          **_norm_shapes("input_norm", "post_attn_norm", bias=True),
                          **_global_shapes(tied=True, norm_bias=True)}, starcoder2),
    "Cohere": Family("Cohere", lambda: _tf().CohereConfig(**_common(num_key_value_heads=KV)),
                     {**_attn_shapes(kv=1), **_gated_mlp_shapes(), **_norm_shapes("input_norm"),
                      **_global_shapes(tied=True)}, cohere),
    "Phi": Family("Phi", lambda: _tf().PhiConfig(**_common()),
                  {**_attn_shapes(kv=H, bias=True, o_bias=True), **_plain_mlp_shapes(),
                   **_norm_shapes("input_norm", bias=True), **_global_shapes(norm_bias=True), "lm_head/bias": (V,)},
                  phi),
    "Bloom": Family("Bloom", lambda: _tf().BloomConfig(vocab_size=V, hidden_size=D, n_layer=L, n_head=H,
                                                       attn_implementation="eager"),
                    {**_attn_shapes(kv=H, bias=True, o_bias=True), **_plain_mlp_shapes(f=4 * D),
                     **_norm_shapes("input_norm", "post_attn_norm", bias=True), "embed_norm/scale": (D,),
                     "embed_norm/bias": (D,), **_global_shapes(tied=True, norm_bias=True)}, bloom),
    "GPTBigCode": Family("GPTBigCode", lambda: _tf().GPTBigCodeConfig(vocab_size=V, n_embd=D, n_layer=L, n_head=H,
                                                                     n_positions=POS, multi_query=True,
                                                                     attn_implementation="eager"),
                         {**_attn_shapes(kv=1, bias=True, o_bias=True), **_plain_mlp_shapes(f=4 * D),
                          **_norm_shapes("input_norm", "post_attn_norm", bias=True), "pos_embed/embedding": (POS, D),
                          **_global_shapes(tied=True, norm_bias=True)}, gpt_bigcode),
    "Qwen2Moe": Family("Qwen2Moe", lambda: _tf().Qwen2MoeConfig(**_common(
                           num_key_value_heads=KV, num_experts=E, num_experts_per_tok=2, moe_intermediate_size=MOE_I,
                           shared_expert_intermediate_size=SHARED_I, decoder_sparse_step=1)),
                       {**_attn_shapes(bias=True), **_norm_shapes("input_norm", "post_attn_norm"),
                        "shared/gate/kernel": (L, D, SHARED_I), "shared/up/kernel": (L, D, SHARED_I),
                        "shared/down/kernel": (L, SHARED_I, D), "shared_gate/kernel": (L, D),
                        "moe/router/kernel": (L, D, E), "moe/gate": (L, E, D, MOE_I), "moe/up": (L, E, D, MOE_I),
                        "moe/down": (L, E, MOE_I, D), **_global_shapes()}, qwen2_moe),
}


def _fix_stacks(shapes):
    """The trainer keeps every per-layer tensor under 'layers/'."""
    out = {}
    for path, shape in shapes.items():
        top = path.split("/")[0]
        layered = top in ("attn", "mlp", "input_norm", "post_attn_norm", "pre_ffw_norm", "post_ffw_norm", "shared",
                          "shared_gate", "moe")
        out[("layers/" + path) if layered else path] = shape
    return out


def source_tree(family: Family, seed: int = 0) -> dict:
    """The trainer's tree of `family`, random float32 values, nested dicts."""
    rng = np.random.default_rng(seed)
    tree: dict = {}
    for path, shape in _fix_stacks(family.shapes).items():
        node = tree
        *heads, leaf = path.split("/")
        for key in heads:
            node = node.setdefault(key, {})
        node[leaf] = (0.2 * rng.standard_normal(shape)).astype(np.float32)
    return tree


def hf_model(family: Family, nan: bool = False):
    """The family's transformers model, float32, in eval mode; `nan`: every tensor NaN, so a
    tensor a swap missed shows."""
    import torch

    model = getattr(_tf(), family.name + "ForCausalLM")(family.config()).float().eval()
    if nan:
        with torch.no_grad():
            for tensor in model.state_dict().values():
                if tensor.is_floating_point():
                    tensor.fill_(float("nan"))
    return model
