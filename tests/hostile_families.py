"""Three transformers families the other family tests do not use, each with the exporter its
framework's converter would write, constants included:

* Gemma2 from a MaxText-style tree: MaxText keeps RMSNorm scales as the whole multiplier
  (transformers computes `x * (1 + w)`, so the exporter subtracts 1), the embedding
  multiplied by sqrt(d_model) (divided on export), the query kernel scaled by
  query_pre_attn_scalar ** -0.5 (multiplied back), and one MaxText layer per pair of
  transformers layers (a `local` sliding-window stack and a `global` stack, interleaved).
* Gemma from a bfloat16 tree: norms with the offset as a float32 round trip
  (`(w.astype(float32) - 1).astype(bfloat16)`), the embedding normaliser a float64 Python
  constant into bfloat16, one KV head.
* Mistral from Mistral's own consolidated checkpoint naming (`layers.N.attention.wq.weight`,
  interleaved rotary pairs): transformers' converter
  (transformers/models/mistral/convert_mistral_weights_to_hf.py) permutes q and k with
  `w.view(heads, dim1 // heads // 2, 2, dim2).transpose(1, 2)`.

`convert(p, xp)` runs under numpy and jax.numpy; what JAX computes eagerly is the oracle
(an XLA division is a multiplication by the reciprocal, which numpy does not do).
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np

D, H, KV, HD, F, V = 32, 4, 2, 8, 64, 64
PAIRS = 2            # Gemma2: MaxText layers, two transformers layers each
L = 2                # Gemma, Mistral
QUERY_SCALAR = 32    # Gemma2's query_pre_attn_scalar (not head_dim, so the scaling is not sqrt(8) alone)


def _tf():
    import transformers
    return transformers


@dataclass(frozen=True)
class Family:
    name: str                    # transformers' <name>ForCausalLM
    config: Callable
    shapes: dict                 # {'/'-path: shape} of the trainer's tree
    convert: Callable            # (tree, xp) -> {state-dict name: array}
    dtype: str = "float32"       # the trainer tree's dtype


def _get(p, path):
    for key in path.split("/"):
        p = p[key]
    return p


def _heads_out(w, xp):
    """(D, heads, hd) -> transformers' (heads * hd, D)."""
    return xp.reshape(w, (w.shape[0], -1)).T


# ----------------------------------------------------------------------------- Gemma2 (MaxText)

def gemma2_shapes():
    out = {"token_embedder/embedding": (V, D), "decoder/decoder_norm/scale": (D,)}
    for stack in ("local", "global"):
        pre = f"decoder/layers/{stack}/"
        out.update({pre + "self_attention/query/kernel": (PAIRS, D, H, HD),
                    pre + "self_attention/key/kernel": (PAIRS, D, KV, HD),
                    pre + "self_attention/value/kernel": (PAIRS, D, KV, HD),
                    pre + "self_attention/out/kernel": (PAIRS, H, HD, D),
                    pre + "mlp/wi_0/kernel": (PAIRS, D, F), pre + "mlp/wi_1/kernel": (PAIRS, D, F),
                    pre + "mlp/wo/kernel": (PAIRS, F, D)})
        for norm in ("pre_self_attention_norm", "post_self_attention_norm", "pre_ffw_norm", "post_ffw_norm"):
            out[pre + norm + "/scale"] = (PAIRS, D)
    return out


def gemma2(p, xp):
    out = {"model.embed_tokens.weight": p["token_embedder"]["embedding"] / np.sqrt(D),
           "model.norm.weight": p["decoder"]["decoder_norm"]["scale"] - 1.0}
    norms = {"input_layernorm": "pre_self_attention_norm", "post_attention_layernorm": "post_self_attention_norm",
             "pre_feedforward_layernorm": "pre_ffw_norm", "post_feedforward_layernorm": "post_ffw_norm"}
    for i in range(PAIRS):
        for k, stack in enumerate(("local", "global")):   # transformers: sliding, full, sliding, full
            layer, n = p["decoder"]["layers"][stack], f"model.layers.{2 * i + k}."
            a, m = layer["self_attention"], layer["mlp"]
            out[n + "self_attn.q_proj.weight"] = _heads_out(a["query"]["kernel"][i] * QUERY_SCALAR ** 0.5, xp)
            out[n + "self_attn.k_proj.weight"] = _heads_out(a["key"]["kernel"][i], xp)
            out[n + "self_attn.v_proj.weight"] = _heads_out(a["value"]["kernel"][i], xp)
            out[n + "self_attn.o_proj.weight"] = xp.reshape(a["out"]["kernel"][i], (H * HD, D)).T
            out[n + "mlp.gate_proj.weight"] = m["wi_0"]["kernel"][i].T
            out[n + "mlp.up_proj.weight"] = m["wi_1"]["kernel"][i].T
            out[n + "mlp.down_proj.weight"] = m["wo"]["kernel"][i].T
            for hf, ours in norms.items():
                out[n + hf + ".weight"] = layer[ours]["scale"][i] - 1.0
    return out


# ----------------------------------------------------------------------------- Gemma (bfloat16)

def gemma_shapes():
    return {"embed/embedding": (V, D), "final_norm/scale": (D,),
            "layers/attn/q/kernel": (L, D, H, HD), "layers/attn/k/kernel": (L, D, 1, HD),
            "layers/attn/v/kernel": (L, D, 1, HD), "layers/attn/o/kernel": (L, H, HD, D),
            "layers/mlp/gate/kernel": (L, D, F), "layers/mlp/up/kernel": (L, D, F),
            "layers/mlp/down/kernel": (L, F, D), "layers/input_norm/scale": (L, D),
            "layers/post_attn_norm/scale": (L, D)}


def _offset(scale, xp):
    return (scale.astype(np.float32) - 1).astype(scale.dtype)


def gemma(p, xp):
    embedding = p["embed"]["embedding"]
    out = {"model.embed_tokens.weight": (embedding * (1 / np.sqrt(D))).astype(embedding.dtype),  # a float64 constant
           "model.norm.weight": _offset(p["final_norm"]["scale"], xp)}
    layers = p["layers"]
    for i in range(L):
        n = f"model.layers.{i}."
        out[n + "self_attn.q_proj.weight"] = _heads_out(layers["attn"]["q"]["kernel"][i], xp)
        out[n + "self_attn.k_proj.weight"] = _heads_out(layers["attn"]["k"]["kernel"][i], xp)
        out[n + "self_attn.v_proj.weight"] = _heads_out(layers["attn"]["v"]["kernel"][i], xp)
        out[n + "self_attn.o_proj.weight"] = xp.reshape(layers["attn"]["o"]["kernel"][i], (H * HD, D)).T
        for hf, ours in (("gate", "gate"), ("up", "up"), ("down", "down")):
            out[n + f"mlp.{hf}_proj.weight"] = layers["mlp"][ours]["kernel"][i].T
        out[n + "input_layernorm.weight"] = _offset(layers["input_norm"]["scale"][i], xp)
        out[n + "post_attention_layernorm.weight"] = _offset(layers["post_attn_norm"]["scale"][i], xp)
    return out


# ----------------------------------------------------------------------------- Mistral (consolidated)

def mistral_shapes():
    return {"tok_embeddings/weight": (V, D), "norm/weight": (D,), "output/weight": (V, D),
            "layers/attention/wq/weight": (L, H * HD, D), "layers/attention/wk/weight": (L, KV * HD, D),
            "layers/attention/wv/weight": (L, KV * HD, D), "layers/attention/wo/weight": (L, D, H * HD),
            "layers/feed_forward/w1/weight": (L, F, D), "layers/feed_forward/w2/weight": (L, D, F),
            "layers/feed_forward/w3/weight": (L, F, D), "layers/attention_norm/weight": (L, D),
            "layers/ffn_norm/weight": (L, D)}


def _permute(w, heads, xp):
    """transformers/models/mistral/convert_mistral_weights_to_hf.py: interleaved rotary pairs -> halves."""
    dim1, dim2 = w.shape
    return xp.reshape(xp.swapaxes(xp.reshape(w, (heads, dim1 // heads // 2, 2, dim2)), 1, 2), (dim1, dim2))


def mistral(p, xp):
    out = {"model.embed_tokens.weight": p["tok_embeddings"]["weight"], "model.norm.weight": p["norm"]["weight"],
           "lm_head.weight": p["output"]["weight"]}
    layers = p["layers"]
    for i in range(L):
        n, a, m = f"model.layers.{i}.", layers["attention"], layers["feed_forward"]
        out[n + "self_attn.q_proj.weight"] = _permute(a["wq"]["weight"][i], H, xp)
        out[n + "self_attn.k_proj.weight"] = _permute(a["wk"]["weight"][i], KV, xp)
        out[n + "self_attn.v_proj.weight"] = a["wv"]["weight"][i]
        out[n + "self_attn.o_proj.weight"] = a["wo"]["weight"][i]
        out[n + "mlp.gate_proj.weight"] = m["w1"]["weight"][i]
        out[n + "mlp.down_proj.weight"] = m["w2"]["weight"][i]
        out[n + "mlp.up_proj.weight"] = m["w3"]["weight"][i]
        out[n + "input_layernorm.weight"] = layers["attention_norm"]["weight"][i]
        out[n + "post_attention_layernorm.weight"] = layers["ffn_norm"]["weight"][i]
    return out


def _common(**extra):
    return dict(vocab_size=V, hidden_size=D, intermediate_size=F, num_attention_heads=H, head_dim=HD,
                attn_implementation="eager", **extra)


FAMILIES = {
    "Gemma2": Family("Gemma2", lambda: _tf().Gemma2Config(**_common(
        num_hidden_layers=2 * PAIRS, num_key_value_heads=KV, query_pre_attn_scalar=QUERY_SCALAR, sliding_window=4)),
        gemma2_shapes(), gemma2),
    "Gemma": Family("Gemma", lambda: _tf().GemmaConfig(**_common(num_hidden_layers=L, num_key_value_heads=1)),
                    gemma_shapes(), gemma, dtype="bfloat16"),
    "Mistral": Family("Mistral", lambda: _tf().MistralConfig(**_common(num_hidden_layers=L, num_key_value_heads=KV,
                                                                        sliding_window=None, tie_word_embeddings=False)),
                      mistral_shapes(), mistral),
}


def source_tree(family: Family, seed: int = 0) -> dict:
    """The trainer's tree: random values in the family's dtype (norm scales around 1, as trained)."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    dtype = np.dtype(getattr(ml_dtypes, family.dtype, family.dtype))
    tree: dict = {}
    for path, shape in family.shapes.items():
        node = tree
        *heads, leaf = path.split("/")
        for key in heads:
            node = node.setdefault(key, {})
        values = 0.2 * rng.standard_normal(shape)
        if "norm" in path:
            values += 1.0
        node[leaf] = values.astype(dtype)
    return tree


def hf_model(family: Family):
    """The family's transformers model, float32, eval mode, every tensor NaN (a missed one shows)."""
    import torch

    model = getattr(_tf(), family.name + "ForCausalLM")(family.config()).float().eval()
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.fill_(float("nan"))
    return model
