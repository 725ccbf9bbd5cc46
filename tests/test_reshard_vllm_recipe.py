"""docs/reshard.md's `to_vllm` recipe (rules from your own function, into vLLM's fused qkv_proj)
against vLLM's own loader: every rank's slice of what the recipe returns equals what
QKVParallelLinear.weight_loader puts on that rank (tests/test_reshard_preset_kv_heads.py's
`vllm_ranks`), for weights and the qkv bias, where tp is below, equal to and above the KV heads
(each KV head then replicated on tp // KV ranks)."""

import numpy as np
import pytest

import preset_models as M
from test_reshard_preset_kv_heads import H, _trainer_and_checkpoint, vllm_ranks


def to_vllm_qkv(q, k, v, tp, kv):
    """The recipe's fused tensor, as docs/reshard.md writes it (numpy for jnp): the ranks' slices
    side by side, each rank its H / tp query heads, then its KV heads (one, replicated, where tp
    exceeds them)."""
    copies = max(1, tp // kv)
    q = np.split(q, tp)
    k, v = (np.split(x, tp // copies) for x in (k, v))
    return np.concatenate([t for r in range(tp) for t in (q[r], k[r // copies], v[r // copies])])


@pytest.mark.parametrize("kv, tp", [(4, 2), (2, 2), (1, 2), (2, 4), (2, 8), (1, 8)])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_recipe_gives_every_rank_what_vllms_loader_gives_it(family, kv, tp):
    _, checkpoint = _trainer_and_checkpoint(family, "flax", 0, kv)
    kinds = ("weight", "bias") if family == "qwen2" else ("weight",)
    for i in range(M.L):
        prefix = f"model.layers.{i}."
        for kind in kinds:
            q, k, v = (np.asarray(checkpoint[f"{prefix}self_attn.{x}_proj.{kind}"]) for x in "qkv")
            fused = to_vllm_qkv(q, k, v, tp, kv)
            expected = vllm_ranks(checkpoint, prefix, kind, tp, kv)
            for rank, (ours, theirs) in enumerate(zip(np.split(fused, tp), expected)):
                assert np.array_equal(ours, theirs), f"layer {i} {kind}, rank {rank} of tp={tp} with {kv} KV heads"


def test_splitting_kv_into_tp_blocks_is_what_the_recipe_avoids():
    """The old recipe (k and v cut into tp blocks) is wrong where tp exceeds the KV heads: the
    oracle tells them apart, so the test above can fail."""
    kv, tp = 1, 2
    _, checkpoint = _trainer_and_checkpoint("llama", "flax", 0, kv)
    prefix = "model.layers.0."
    q, k, v = (np.asarray(checkpoint[f"{prefix}self_attn.{x}_proj.weight"]) for x in "qkv")
    q, k, v = (np.split(x, tp) for x in (q, k, v))
    old = np.concatenate([t[r] for r in range(tp) for t in (q, k, v)])
    assert H % tp == 0 and not all(np.array_equal(a, b) for a, b in
                                   zip(np.split(old, tp), vllm_ranks(checkpoint, prefix, "weight", tp, kv)))
