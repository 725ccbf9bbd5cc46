"""The vLLM backend's batches without vLLM: the worker packs consecutive layer groups into
batches of at most its staging budget (jax_amem_vllm/layout.py `pack`), the trainer commits the
batches every rank holds apart (jax_amem/vllm/steps.py `common_batches`), one call into the
workers per batch, and where the swap reads the tree whole one swap per rank per batch. What each
rank holds after an update is what group-by-group updates write: slices cut by hand from the
trainer's arrays (test_vllm_ranks.expected). The real engine's batches: test_vllm_backend.py."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the staging buffers are PyTorch tensors")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jax_amem.vllm import VllmBackendError  # noqa: E402
from jax_amem.vllm import trainer  # noqa: E402
from jax_amem.vllm.steps import common_batches  # noqa: E402
from jax_amem_vllm.layout import Describe, Tensor, pack, packed, repacked, staged_bytes  # noqa: E402
import test_vllm_ranks as by_rank  # noqa: E402
import vllm_models as vm  # noqa: E402


@pytest.mark.parametrize("sizes, budget, batches, starts, largest", [
    ([64, 128, 64], 0, [[0], [1], [2]], [0, 0, 0], 128),             # 0: one group at a time
    ([64, 128, 64], 256, [[0, 1, 2]], [0, 64, 192], 256),             # all fit exactly
    ([64, 128, 64], 255, [[0, 1], [2]], [0, 64, 0], 192),
    ([512, 64, 64, 512], 128, [[0], [1, 2], [3]], [0, 0, 64, 0], 512),  # a group above the budget stays alone
    ([], 1024, [], [], 0),
])
def test_pack(sizes, budget, batches, starts, largest):
    assert pack(sizes, budget) == (batches, starts, largest)


def layout_of(group_shapes: list[list[tuple]], budget: int) -> Describe:
    """A bf16 layout packed as describe() packs it: groups of tensors t{g}_{i} of these shapes."""
    groups, sizes = [], []
    for g, shapes in enumerate(group_shapes):
        offset, group = 0, []
        for i, shape in enumerate(shapes):
            group.append(Tensor(f"t{g}_{i}", shape, "bfloat16", offset, processed=False))
            offset += staged_bytes(shape, "bfloat16")
        groups.append(group)
        sizes.append(offset)
    groups, batches, largest = packed(groups, sizes, budget)
    return Describe(groups, largest, batches)


def test_repacked_in_place_leaves_one_batch_and_no_staging():
    layout = layout_of([[(64, 32)], [(32, 32), (32,)], [(32, 32), (32,)], [(64, 32)]], budget=4096)
    assert layout.batches == [[0], [1], [2], [3]] and layout.staging_bytes == 4096
    assert repacked(layout, lambda t: False).batches == [[0, 1, 2, 3]]
    assert repacked(layout, lambda t: False).staging_bytes == 0


def test_repacked_keeps_the_staged_tensors_apart_within_the_buffer_it_has():
    layout = layout_of([[(64, 32)], [(32, 32), (32,)], [(32, 32), (32,)], [(64, 32)]], budget=4096)
    # Only the 1-D tensors (the norms, 64 bytes each) and the last group's stay staged.
    staged = lambda t: t.name in ("t1_1", "t2_1", "t3_0")  # noqa: E731
    out = repacked(layout, staged)
    assert out.batches == [[0, 1, 2], [3]] and out.staging_bytes == 4096
    places = {t.name: (t.offset, staged_bytes(t.shape, t.dtype)) for g in out.groups for t in g if staged(t)}
    assert places == {"t1_1": (0, 64), "t2_1": (64, 64), "t3_0": (0, 4096)}
    # Every batch's staged tensors lie apart and inside the buffer the worker already has.
    for batch in out.batches:
        spans = sorted(places[t.name] for g in batch for t in out.groups[g] if staged(t))
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
        assert all(a + n <= layout.staging_bytes for a, n in spans)
    assert [t.name for g in out.groups for t in g] == [t.name for g in layout.groups for t in g]


@pytest.mark.parametrize("per_rank, want", [
    ([[[0, 1, 2], [3]]], [[0, 1, 2], [3]]),
    ([[[0, 1, 2], [3]], [[0], [1, 2, 3]]], [[0], [1, 2], [3]]),   # ranks packed apart: cut where either cuts
    ([None, [[0, 1, 2, 3]]], [[0], [1], [2], [3]]),               # a worker without batches: one group each
])
def test_common_batches(per_rank, want):
    notes = [{"tp_rank": r} if b is None else {"tp_rank": r, "batches": b} for r, b in enumerate(per_rank)]
    assert common_batches(notes, 4) == want


@pytest.mark.parametrize("batches", [[[0, 1]], [[0, 1], [1, 2, 3]], [[0, 2], [1, 3]], [[0, 1], [], [2, 3]],
                                     [[1, 0], [2, 3]]])
def test_batches_that_do_not_cover_the_groups_in_order_are_refused(batches):
    with pytest.raises(VllmBackendError, match=r"rank 1's worker reports batches .* do not cover its 4 layer groups"):
        common_batches([{"tp_rank": 0}, {"tp_rank": 1, "batches": batches}], 4)


def batched(note: dict, budget: int) -> dict:
    """The note as a worker with staging budget `budget` writes it: its groups packed, each
    tensor placed in its batch."""
    sizes = [sum(staged_bytes(t["shape"], t["dtype"]) for t in g) for g in note["groups"]]
    batches, starts, largest = pack(sizes, budget)
    groups = [[{**t, "offset": t["offset"] + start} for t in g] for g, start in zip(note["groups"], starts)]
    return {**note, "groups": groups, "batches": batches, "staging_bytes": largest}


class Counted:
    """The engine's side (test_vllm_ranks.Commits), counting each update_weights call's groups."""

    def __init__(self, ranks):
        self.commits, self.calls = by_rank.Commits(ranks), []

    def collective_rpc(self, method, timeout=None, kwargs=None):
        if method == "update_weights":
            self.calls.append(kwargs["update_info"])
        return self.commits.collective_rpc(method, timeout, kwargs)

    def reset_prefix_cache(self):
        return True


def engine_for(family, params, budgets, monkeypatch):
    notes = by_rank.notes(family, "flax", params)
    ranks = [by_rank.Rank(batched(note, budget)) for note, budget in zip(notes, budgets)]
    llm = Counted(ranks)
    return trainer.VllmEngine(llm, ranks, params, family=family, source="flax", rules=None, cast=None,
                              timeout=60), ranks, llm


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("direct", ["1", "0"])
@pytest.mark.parametrize("budgets", ["whole", "two", "apart"])
def test_each_batch_is_one_commit_and_every_rank_holds_its_slice(family, direct, budgets, monkeypatch):
    """"whole": every group in one batch; "two": the budget of the first half's groups; "apart":
    the ranks packed with other budgets (rank 0 whole, rank 1 group by group past the first
    two), so the trainer commits what both hold apart. With the direct launch the swap reads the
    tree whole and a batch is one swap per rank; without it (JAX_AMEM_SWAP_DIRECT=0) each group
    reads its picked layer, one swap per group, still one commit per batch."""
    monkeypatch.setenv("JAX_AMEM_SWAP_DIRECT", direct)
    trees = [vm.flax_tree(family, seed) for seed in (3, 4)]
    params = [jax.tree.map(jnp.asarray, t) for t in trees]
    sizes = [sum(staged_bytes(t["shape"], t["dtype"]) for t in g)
             for g in by_rank.notes(family, "flax", params[0])[0]["groups"]]
    half = sum(sizes[:len(sizes) // 2])
    budgets = {"whole": [1 << 40] * 2, "two": [half] * 2, "apart": [1 << 40, sizes[0] + sizes[1]]}[budgets]
    engine, ranks, llm = engine_for(family, params[0], budgets, monkeypatch)
    want = common_batches([r.note for r in ranks], len(sizes))
    assert engine.batches == want and len(want) < len(sizes)
    swaps = []
    real_swap = trainer.swap
    monkeypatch.setattr(trainer, "swap", lambda *a, **k: swaps.append(1) or real_swap(*a, **k))
    for version, tree in enumerate(trees):
        llm.calls.clear()
        swaps.clear()
        report = engine.update(params[version])
        assert llm.calls == [{"group": b[0]} if len(b) == 1 else {"groups": b} for b in want]
        assert report.commits == len(want) and report.groups == len(sizes)
        parts = (report.start_seconds, report.swap_seconds, report.commit_seconds, report.finish_seconds)
        assert min(parts) >= 0 and sum(parts) <= report.seconds, (parts, report.seconds)
        assert str(report).startswith(f"vllm update v{report.version}: ") and "start " in str(report)
        merged = direct == "1"
        assert len(swaps) == len(ranks) * (len(want) if merged else len(sizes))
        assert all(pick is None for pick in engine.picks) == merged
        for rank in ranks:
            assert rank.held.keys() == {t["name"] for g in rank.note["groups"] for t in g}
            for name, tensor in rank.held.items():
                assert np.array_equal(tensor.numpy(), by_rank.expected(tree, name, rank.note["tp_rank"])), \
                    (version, rank.note["tp_rank"], name)


def test_a_batch_whose_plan_fails_names_the_group(monkeypatch):
    """The batch's plan fails (a norm one element longer than the trainer's in layer 1): connect plans the batch's
    groups one by one, and the error names the group, as group by group."""
    tree = vm.flax_tree("llama", 3)
    params = jax.tree.map(jnp.asarray, tree)
    notes = by_rank.notes("llama", "flax", params)
    victim = "model.layers.1.input_layernorm.weight"
    index = next(i for i, g in enumerate(notes[0]["groups"]) if victim in [t["name"] for t in g])
    for note in notes:
        for t in note["groups"][index]:
            if t["name"] == victim:
                t["shape"] = t["loaded"] = [vm.D + 1]
    ranks = [by_rank.Rank(batched(note, 1 << 40)) for note in notes]
    assert len(common_batches([r.note for r in ranks], len(notes[0]["groups"]))) == 1
    with pytest.raises(trainer.VllmPlanError, match=rf"the engine's layer group {index} \(.*{victim}"):
        trainer.VllmEngine(Counted(ranks), ranks, params, family="llama", source="flax", rules=None, cast=None,
                           timeout=60)


def test_each_update_compares_the_trees_signature_and_reads_layouts_only_when_it_differs(monkeypatch):
    """A training step's new arrays (same shapes, dtypes and shardings) pass on the tree's
    structure and leaves' signatures, without reading every leaf's layout (about 60 us a leaf);
    a leaf with another dtype differs there, its layouts are read, and the update is refused
    naming it, before anything is written."""
    from jax_amem import reshard
    from jax_amem.vllm import VllmPlanError

    params = [jax.tree.map(jnp.asarray, vm.flax_tree("llama", seed)) for seed in (3, 4)]
    engine, ranks, llm = engine_for("llama", params[0], [1 << 40] * 2, monkeypatch)
    read, real_layouts_of = [], reshard.layouts_of
    monkeypatch.setattr(reshard, "layouts_of", lambda tree: read.append(1) or real_layouts_of(tree))
    engine.update(params[1])
    assert read == [] and len(llm.calls) == 1
    changed = jax.tree.map(lambda a: a, params[1])
    changed["final_norm"]["scale"] = changed["final_norm"]["scale"].astype(jnp.bfloat16)
    held = {rank.note["tp_rank"]: dict(rank.held) for rank in ranks}
    with pytest.raises(VllmPlanError, match=r"not the one planned at connect .*final_norm/scale"):
        engine.update(changed)
    assert read == [1] and len(llm.calls) == 1
    assert all(rank.held.keys() == held[rank.note["tp_rank"]].keys() and
               all(rank.held[n] is t for n, t in held[rank.note["tp_rank"]].items()) for rank in ranks)   # no commit


def test_a_closed_handle_refuses_to_update_and_writes_nothing(monkeypatch):
    """engine.close() unmaps the staging buffers: a later update is refused by name before any
    swap or commit, and the engine still serves the previous version."""
    from jax_amem.vllm import VllmUpdateError

    params = jax.tree.map(jnp.asarray, vm.flax_tree("llama", 3))
    engine, ranks, llm = engine_for("llama", params, [1 << 40] * 2, monkeypatch)
    engine.close()
    with pytest.raises(VllmUpdateError, match=r"committing 0 of .*this engine handle was closed.*connect again") as caught:
        engine.update(params)
    assert caught.value.served == "old" and llm.calls == [] and all(rank.held == {} for rank in ranks)
