"""The trainer's Flax tree as the rollout's Hugging Face state dict, written by hand in numpy:
the conversion a user writes today, and the oracle the swap is checked against.

Independent of jax_amem's rules on purpose (its own name table, its own transposes), so that
a wrong rule and a wrong oracle would have to be wrong the same way to agree.
"""

from __future__ import annotations

import numpy as np

from ..config import PolicyConfig

# Hugging Face name under `model.layers.{i}.` -> (path in the Flax tree under `layers/`, transposed)
LAYER = {
    "self_attn.q_proj.weight": ("attn/q/kernel", True),
    "self_attn.k_proj.weight": ("attn/k/kernel", True),
    "self_attn.v_proj.weight": ("attn/v/kernel", True),
    "self_attn.o_proj.weight": ("attn/o/kernel", True),
    "self_attn.q_norm.weight": ("attn/q_norm/scale", False),
    "self_attn.k_norm.weight": ("attn/k_norm/scale", False),
    "mlp.gate_proj.weight": ("mlp/gate/kernel", True),
    "mlp.up_proj.weight": ("mlp/up/kernel", True),
    "mlp.down_proj.weight": ("mlp/down/kernel", True),
    "input_layernorm.weight": ("input_norm/scale", False),
    "post_attention_layernorm.weight": ("post_attn_norm/scale", False),
}


def _at(tree, path: str):
    for key in path.split("/"):
        tree = tree[key]
    return tree


def hf_arrays(host_params, config: PolicyConfig, *, with_tied: bool = False):
    """Yields (Hugging Face name, float32 numpy array in PyTorch's layout), one tensor at a time
    (a 1.7B model never holds a second full copy). host_params: the Flax tree as numpy arrays
    (`jax.device_get`). with_tied: also yield `lm_head.weight` when it is the embedding (a
    tied model's state_dict names it; its named_parameters do not)."""
    embedding = np.asarray(_at(host_params, "embed/embedding"))
    yield "model.embed_tokens.weight", embedding
    layers = host_params["layers"]
    for i in range(config.num_layers):
        for name, (path, transposed) in LAYER.items():
            value = np.asarray(_at(layers, path))[i]
            yield f"model.layers.{i}.{name}", np.ascontiguousarray(value.T) if transposed else value
    yield "model.norm.weight", np.asarray(_at(host_params, "final_norm/scale"))
    if not config.tie_embeddings:
        yield "lm_head.weight", np.ascontiguousarray(np.asarray(_at(host_params, "lm_head/kernel")).T)
    elif with_tied:
        yield "lm_head.weight", embedding
