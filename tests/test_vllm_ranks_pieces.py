"""The vLLM backend's per-rank plans for rules that are Pieces, without vLLM: a MaxText-style
Llama tree (layers on scan axis 0 or 1; the rotary reorder and the query scaling, which the
preset says as Pieces) cut for each tensor-parallel rank (jax_amem/vllm/ranks.py) and, through
the backend's update loop, picked one layer at a time (jax_amem/vllm/trainer.py).

The oracle is MaxText's own exporter (maxtext_exporter.py) on the same tree, each rank's slice
then cut as vLLM's loaders cut it: QKVParallelLinear's weight_loader redone in numpy
(test_reshard_preset_kv_heads.vllm_ranks: one KV head per rank, replicated, where tp exceeds
them), gate_up per rank, o/down by columns, the vocabulary by rows, the norms whole.
"""

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the staging buffers are PyTorch tensors")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_amem  # noqa: E402
from jax_amem import reshard  # noqa: E402
from jax_amem.reshard import Layout, Owner, Piece, numpy_exec  # noqa: E402
from jax_amem.reshard.affine import Affine, Step  # noqa: E402
from jax_amem.vllm.ranks import rank_pieces, whole_shapes  # noqa: E402
from jax_amem.vllm.trainer import VllmEngine, _one_layer  # noqa: E402

import maxtext_exporter as X  # noqa: E402
import preset_models as M  # noqa: E402
from reshard_oracle import shard_tree  # noqa: E402
from test_reshard_preset_kv_heads import HD, H, _trainer_and_checkpoint, vllm_ranks  # noqa: E402
from test_vllm_ranks import Commits, Rank, notes_for, split_axis  # noqa: E402

HERE = Owner(0, 0)


def expected(checkpoint, name: str, rank: int, tp: int, kv: int) -> np.ndarray:
    """Rank `rank`'s slice of vLLM's tensor `name`, from the Hugging Face checkpoint MaxText's
    exporter writes."""
    def block(a, axis):
        n = a.shape[axis] // tp
        return np.take(a, range(rank * n, (rank + 1) * n), axis=axis)
    if name.endswith("qkv_proj.weight"):
        return vllm_ranks(checkpoint, name[:-len("self_attn.qkv_proj.weight")], "weight", tp, kv)[rank]
    if name.endswith("gate_up_proj.weight"):
        p = name[:-len("gate_up_proj.weight")]
        return np.concatenate([block(checkpoint[p + f"{x}_proj.weight"], 0) for x in ("gate", "up")])
    axis = split_axis(name)
    return checkpoint[name] if axis is None else block(checkpoint[name], axis)


def groups_of(names) -> dict[str, list[str]]:
    """vLLM's names by layer group, as the worker reports them (a layer, or a global tensor)."""
    out: dict[str, list[str]] = {}
    for name in names:
        out.setdefault(name.split(".")[2] if ".layers." in name else name, []).append(name)
    return out


def each_rank_equals(tree, made, tp: int, want) -> dict:
    """Plans every layer group of `made` (the preset's whole-tensor rules and pieces) for each rank
    on its own, runs it in numpy and checks it bit for bit against `want(name, rank)`; returns
    the whole shapes."""
    flat = reshard.tree_names(tree)
    layouts = {name: Layout.single(x.shape, x.dtype, HERE) for name, x in flat.items()}
    arrays = {(name, HERE): x for name, x in flat.items()}
    wholes = whole_shapes(made, layouts)
    for names in groups_of(wholes).values():
        mine = [r for r in made if r.dst in names]
        for rank in range(tp):
            expect = {name: want(name, rank) for name in names}
            wire = [{"name": n, "shape": list(w.shape), "loaded": list(w.shape), "dtype": "float32"}
                    for n, w in expect.items()]
            pieces = rank_pieces(mine, layouts, wire, HERE, rank, tp)
            targets = {n: Layout.single(w.shape, np.float32, HERE) for n, w in expect.items()}
            out = numpy_exec.execute(reshard.plan(layouts, targets, pieces, cache=False), arrays)
            for name, w in expect.items():
                assert np.array_equal(out[(name, HERE)].view(np.uint32), w.view(np.uint32)), (name, rank)
    return wholes


@pytest.mark.parametrize("scan_axis", [0, 1])
@pytest.mark.parametrize("kv", [1, 2])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_ranks_pieces_equal_maxtexts_export_as_vllm_loads_it(scan_axis, kv, tp):
    """Each rank's pieces, planned on their own and run in numpy, write exactly the rank's slice
    of what MaxText's exporter makes of the tree: the rotary reorder, the query scaling and the
    KV heads (replicated where tp exceeds them) cut per rank."""
    tree, checkpoint = _trainer_and_checkpoint("llama", "maxtext", scan_axis, kv)
    made = jax_amem.rules.preset("llama", tree, source="maxtext", layout="vllm", tp=tp, head_dim=HD)
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    assert any(isinstance(r, Piece) and r.dst == qkv for r in made)      # what a Rule cannot say
    wholes = each_rank_equals(tree, made, tp, lambda name, rank: expected(checkpoint, name, rank, tp, kv))
    assert wholes[qkv] == (tp * (H // tp + 2 * max(1, kv // tp)) * HD, M.D)   # every rank's block, KV replicated


@pytest.mark.parametrize("scan_axis", [0, 1])
def test_mixtral_ranks_equal_maxtexts_export_fused_as_vllm_fuses_it(scan_axis):
    """MaxText's Mixtral (query scaling; experts, router and every layer tensor on scan axis 1 as
    Pieces) at tp 2: each rank's pieces write its block of the exporter's tensors fused as vLLM's
    loaders fuse them (maxtext_exporter.to_vllm: qkv, experts' w13 per rank, side by side)."""
    tp = 2
    tree = X.maxtext_tree("mixtral", M.logical("mixtral", np.random.default_rng(3)), scan_axis)
    fused = X.to_vllm("mixtral", X.to_transformers("mixtral", X.export("mixtral", tree, scan_axis)), tp)
    made = jax_amem.rules.preset("mixtral", tree, source="maxtext", layout="vllm", tp=tp)

    def block(name, rank):
        axis = split_axis(name)
        if axis is None:
            return fused[name]
        n = fused[name].shape[axis] // tp
        return np.take(fused[name], range(rank * n, (rank + 1) * n), axis=axis)
    wholes = each_rank_equals(tree, made, tp, block)
    assert wholes.keys() == fused.keys() and all(wholes[n] == fused[n].shape for n in fused)


def each_rank_holds_the_exporters_slice(ranks, checkpoint, tp: int, kv: int) -> None:
    """Every tensor each rank committed equals its slice of the exporter's checkpoint, bit for bit."""
    for rank in ranks:
        r = rank.note["tp_rank"]
        for name, tensor in rank.held.items():
            w = expected(checkpoint, name, r, tp, kv)
            assert np.array_equal(tensor.numpy().view(np.uint32), w.view(np.uint32)), (name, r)


@pytest.mark.parametrize("direct", ["1", "0"])
def test_the_update_loop_writes_each_rank_from_a_maxtext_tree_picked_per_layer_or_whole(monkeypatch, direct):
    """Through the backend's update loop (the staging buffers in this process), two versions of a
    MaxText Llama tree with layers on MaxText's default axis 1 and one KV head at tp 2. A layer
    group first picks its layer out of the stacks (a Piece's layer axis is 1 here) where the
    direct launch does not read every view: with it off. With it on, no group picks: the query
    kernel's view, transposed with its layer axis and scaled, is the fused transpose copy's (its
    rows run the scale), so every view is read from the whole stacks. Each rank holds the
    exporter's slice either way."""
    monkeypatch.setenv("JAX_AMEM_SWAP_DIRECT", direct)
    tp, kv = 2, 1
    cases = [_trainer_and_checkpoint("llama", "maxtext", 1, kv, seed) for seed in (1, 2)]
    params = [jax.tree.map(jnp.asarray, tree) for tree, _ in cases]
    made = jax_amem.rules.preset("llama", params[0], source="maxtext", layout="vllm", tp=tp, head_dim=HD)
    ranks = [Rank(note) for note in notes_for(made, reshard.layouts_of(params[0]), tp, HD)]
    engine = VllmEngine(Commits(ranks), ranks, params[0], family="llama", source="maxtext", rules=None, cast=None,
                        timeout=60)
    assert [pick is not None for pick in engine.picks] == [direct == "0"] * (M.L + 3)
    if direct == "0":
        picked = engine.picks[0](params[0])       # layer 0: one layer of each stack, the layer axis kept
        query = "decoder/layers/self_attention/query/kernel"
        assert picked[query + "@:,0:1,:,:"].shape == (M.D, 1, H, HD)
    for (_, checkpoint), version in zip(cases, params):
        engine.update(version)
        each_rank_holds_the_exporters_slice(ranks, checkpoint, tp, kv)


def test_connect_plans_each_picked_layer_without_running_the_pick(monkeypatch):
    """A group that picks its layer is planned from what the pick would make, read from its
    compiled program, not by running it: connect takes a copy of the tree whose buffers are all
    deleted (running a pick on it raises), over a 2x4 mesh. What it read (shape, dtype, sharding
    of each picked layer) is what the pick makes of the live tree, and the update from the live
    tree puts the exporter's slice on each rank."""
    monkeypatch.setenv("JAX_AMEM_SWAP_DIRECT", "0")
    tp, kv = 2, 1
    tree, checkpoint = _trainer_and_checkpoint("llama", "maxtext", 1, kv, 4)
    params = shard_tree(tree)
    gone = jax.tree.map(lambda x: x.copy(), params)
    for x in jax.tree.leaves(gone):
        x.delete()
    with pytest.raises(RuntimeError, match="deleted"):
        jnp.sum(jax.tree.leaves(gone)[0])
    made = jax_amem.rules.preset("llama", params, source="maxtext", layout="vllm", tp=tp, head_dim=HD)
    ranks = [Rank(note) for note in notes_for(made, reshard.layouts_of(params), tp, HD)]
    engine = VllmEngine(Commits(ranks), ranks, gone, family="llama", source="maxtext", rules=None, cast=None,
                        timeout=60)
    assert all(pick is not None for pick in engine.picks)
    sharded = 0
    for pick in engine.picks:
        read, made_by_pick = reshard.layouts_of(pick.shapes(params)), reshard.layouts_of(pick(params))
        assert read == made_by_pick
        sharded += sum(len(layout.owners) > 1 for layout in read.values())
    assert sharded, "no picked layer is sharded: the mesh was not exercised"
    engine.update(params)
    each_rank_holds_the_exporters_slice(ranks, checkpoint, tp, kv)


def test_a_cut_keeps_vector_constants_on_the_rows_each_rank_holds():
    """A piece with constant steps (vectors along source axes, in source coordinates) from a
    stacked source, transposed: each rank's cut along the axis a vector runs on applies that
    vector's own entries to the rank's rows, and picking the piece's layer first (a vector along
    the layer axis too) changes nothing. Oracle: numpy on the whole tensor, then sliced."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 12, 6)).astype(np.float32)             # (layers, rows, columns)
    rows = rng.standard_normal(12).astype(np.float32)
    per_layer = rng.standard_normal(3).astype(np.float32)
    affine = Affine((Step("mul", "float32", tuple(map(float, rows)), axis=1),
                     Step("add", "float32", tuple(map(float, per_layer)), axis=0)))
    # dst (6, 8) = (x[1] * rows[:, None] + per_layer[1])[2:10].T: source rows 2..9 along dst axis 1
    piece = Piece("w", (0, 0), (6, 8), "x", (1, 0, 2), perm=(0, 2, 1), affine=affine)
    whole = ((x[1] * rows[:, None]) + per_layer[1])[2:10].T
    layouts = {"x": Layout.single(x.shape, np.float32, HERE)}
    assert whole_shapes([piece], layouts) == {"w": (6, 8)}
    tp = 2
    picked_rules, pick = _one_layer([piece], layouts)
    picked_sources = pick({"x": jnp.asarray(x)})
    assert [p.src for p in picked_rules] == ["x@1:2,:,:"] and picked_sources["x@1:2,:,:"].shape == (1, 12, 6)
    for rules, sources in (([piece], {"x": x}), (picked_rules, picked_sources)):
        source_layouts = {n: Layout.single(a.shape, np.float32, HERE) for n, a in sources.items()}
        for rank in range(tp):
            wire = [{"name": "w", "shape": [6, 4], "loaded": [6, 4], "dtype": "float32"}]
            pieces = rank_pieces(rules, source_layouts, wire, HERE, rank, tp)
            plan = reshard.plan(source_layouts, {"w": Layout.single((6, 4), np.float32, HERE)}, pieces, cache=False)
            out = numpy_exec.execute(plan, {(n, HERE): np.asarray(a) for n, a in sources.items()})
            assert np.array_equal(out[("w", HERE)], whole[:, rank * 4:(rank + 1) * 4]), (rules[0].src, rank)


def test_a_tensor_written_by_pieces_is_as_large_as_their_boxes_reach():
    """A tensor's whole shape from its pieces' destination boxes; a rank slice of it that the
    pieces do not cover exactly is named (the coverage check)."""
    layouts = {"x": Layout.single((4, 6), np.float32, HERE)}
    top = Piece("w", (0, 0), (2, 6), "x", (0, 0))
    bottom = dataclasses.replace(top, dst_start=(2, 0), src_start=(2, 0))
    assert whole_shapes([top, bottom], layouts) == {"w": (4, 6)}
    wire = [{"name": "w", "shape": [2, 6], "loaded": [2, 6], "dtype": "float32"}]
    assert [p.dst_start for p in rank_pieces([top, bottom], layouts, wire, HERE, 1, 2)] == [(0, 0)]
    with pytest.raises(reshard.RuleError, match=r"destination 'w': region \[0:2, 0:6\] is not covered"):
        rank_pieces([bottom], layouts, wire, HERE, 0, 2)
