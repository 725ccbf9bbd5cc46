"""Repeat swaps into PyTorch tensors (swapping/in_process/repeat.py): the fingerprint check lets
a training loop's swap (same tensors, new arrays of the same layouts) skip planning and jit's
checks, and sends everything else, the cases that must be refused above all, to the full path."""

import collections
import gc
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem import reshard
from jax_amem._native import core
from jax_amem.swapping import SwapError, destinations, forget
from jax_amem.swapping.destinations import TorchDestination, describe
from jax_amem.swapping.in_process import repeat, run
from jax_amem.swapping.sources import flat_named

torch = pytest.importorskip("torch")
from swap_probes import clean  # noqa: F401 - clean: an autouse fixture

step = jax.jit(lambda tree: jax.tree_util.tree_map(lambda x: x + 1, tree))

LAYOUT, METHODS = "layout through DLPack", "facts through PyTorch's methods"


@pytest.fixture(autouse=True, params=[LAYOUT, METHODS])
def facts(request, monkeypatch):
    """Every test with the destination's facts read both ways (TorchDestination.repeat_readers):
    the layout through PyTorch's DLPack C exchange table with the storage size, and, as on a
    PyTorch without that table, address, storage offset, storage size and version counter."""
    if request.param == METHODS:
        monkeypatch.setattr(destinations, "torch_layout_reader", lambda: None)
    elif destinations.torch_layout_reader() is None:
        pytest.skip("this PyTorch has no DLPack C exchange table")
    return request.param


def sources(count=6, device=None):
    device = device or jax.devices()[0]
    return {f"t{i}": jax.device_put(jnp.arange(8 * 4, dtype=jnp.float32).reshape(8, 4) + 100 * i, device)
            for i in range(count)}


def hits(src, dst) -> bool:
    found, _, _ = repeat.find(src, describe(dst), run._how(None, None))
    return found is not None


def assert_written(src, dst):
    for name, array in src.items():
        np.testing.assert_array_equal(dst[name].detach().cpu().numpy(), np.asarray(array))


def swapped():
    """Six sources swapped once into new zero tensors: the program is remembered."""
    src = sources()
    dst = {name: torch.zeros(8, 4) for name in src}
    jax_amem.swap(src, dst, progress=False)
    return src, dst


@pytest.mark.parametrize("launched_directly", [True, False])
def test_a_training_loop_repeats_with_new_arrays_and_the_direct_call(monkeypatch, launched_directly):
    from jax_amem.swapping.in_process import direct
    monkeypatch.setattr(direct, "ENABLED", launched_directly)  # else the loaded executables' calls
    src = sources()
    dst = {name: torch.full((8, 4), float("nan")) for name in src}
    jax_amem.swap(src, dst, progress=False)
    for k in range(3):
        src = step(src)  # new arrays, same layouts: a repeat
        assert hits(src, dst)
        report = jax_amem.swap(src, dst, progress=False)
        assert_written(src, dst)
        assert [t._version for t in dst.values()] == [k + 2] * 6  # bumped once per swap, as copy_ would
        assert report.route == "addresses" and report.bytes == 6 * 8 * 4 * 4
    entry = repeat._entries.get(repeat.key_of(jax.tree_util.tree_structure(src), dst, run._how(None, None)))
    assert entry is not None
    if launched_directly:  # no XLA call at all (in_process/direct.py)
        assert entry.calls is None and entry.program.direct
    else:
        assert len(entry.calls) == len(entry.program.groups)


def test_a_new_dict_of_the_same_tensors_repeats_and_new_tensors_do_not():
    src, dst = swapped()
    assert hits(src, dict(dst))
    other = {name: torch.zeros(8, 4) for name in src}
    assert not hits(src, other)
    jax_amem.swap(src, other, progress=False)
    assert_written(src, other)


def test_a_storage_shrunk_in_place_misses_and_is_refused_untouched():
    src, dst = swapped()
    victim = dst["t3"]
    victim.untyped_storage().resize_(0)
    victim.untyped_storage().resize_(16)  # fewer bytes than the tensor needs
    assert not hits(src, dst)
    with pytest.raises(SwapError, match="t3"):
        jax_amem.swap(step(src), dst, progress=False)
    assert_written({k: v for k, v in src.items() if k != "t3"}, dst)  # the old values: nothing written


def resized_destination(src, dst):
    dst["t1"].resize_(4, 8)  # same storage and address, other shape: the version counter moves
    return src, "t1"


def deleted_source(src, dst):
    src["t2"].delete()
    return src, "t2"


def source_of_another_dtype(src, dst):
    return dict(src, t0=src["t0"].astype(jnp.bfloat16)), "t0"


@pytest.mark.parametrize("change", [resized_destination, deleted_source, source_of_another_dtype])
def test_a_changed_input_misses_and_the_full_path_names_it(change):
    src, dst = swapped()
    src, name = change(src, dst)
    assert not hits(src, dst)
    with pytest.raises(SwapError, match=name):
        jax_amem.swap(src, dst, progress=False)


def test_a_dead_tensor_drops_the_entry():
    src = sources(2)
    dst = {name: torch.zeros(8, 4) for name in src}
    jax_amem.swap(src, dst, progress=False)
    entry = next(iter(repeat._entries.values()))
    del dst
    gc.collect()
    assert entry.alive == [False]


def test_inference_tensors_repeat_on_shapes_instead_of_versions():
    src = sources()
    with torch.inference_mode():
        dst = {name: torch.zeros(8, 4) for name in src}
    jax_amem.swap(src, dst, progress=False)
    src = step(src)
    assert hits(src, dst)
    jax_amem.swap(src, dst, progress=False)
    assert_written(src, dst)


def test_verify_and_a_progress_bar_take_the_full_path():
    src, dst = swapped()
    assert jax_amem.swap(src, dst, verify=True).verified


@pytest.mark.gpu
@pytest.mark.parametrize("launched_directly", [True, False])
def test_gpu_training_loop_of_many_small_tensors(monkeypatch, launched_directly):
    from jax_amem.swapping.in_process import direct
    monkeypatch.setattr(direct, "ENABLED", launched_directly)
    gpu = jax.devices("gpu")[0]
    src = {f"t{i}": jax.device_put(jnp.full((16, 16), float(i), jnp.float32), gpu) for i in range(1500)}
    dst = {name: torch.full((16, 16), float("nan"), device=f"cuda:{gpu.local_hardware_id}") for name in src}
    for _ in range(4):
        jax_amem.swap(src, dst, progress=False)
        torch.cuda.synchronize()
        assert_written(src, dst)
        src = step(src)
    entry = next(iter(repeat._entries.values()))
    assert (entry.calls is None) == launched_directly and bool(entry.program.direct) == launched_directly


def test_large_whole_copies_go_to_pytorch_beside_the_xla_call(monkeypatch):
    from jax_amem.swapping.in_process import direct, torch_copies

    monkeypatch.setattr(direct, "ENABLED", False)  # launched directly, these are bulk rows (test_swap_direct.py)

    monkeypatch.setattr(torch_copies, "PLATFORMS", ("gpu", "cpu"))
    monkeypatch.setattr(torch_copies, "MIN_BYTES", 8 * 4 * 4)
    src = sources(3)
    src["small"] = jnp.arange(6, dtype=jnp.float32)  # below MIN_BYTES: stays in the XLA call
    dst = {name: torch.full(tuple(a.shape), float("nan")) for name, a in src.items()}
    for k in range(3):  # the full path, the first repeat, a repeat with the direct call
        assert hits(src, dst) == (k > 0)  # PyTorch's copies do not bump the version counters twice
        report = jax_amem.swap(src, dst, progress=False)
        assert_written(src, dst)
        for t in dst.values():
            t.data.fill_(float("nan"))
        src = step(src)
    groups = next(iter(repeat._entries.values())).program.groups
    assert sorted(len(g.torch_copies) for g in groups) == [3] and report.launches == 4


def test_only_pytorch_copies_and_no_xla_call(monkeypatch):
    from jax_amem.swapping.in_process import torch_copies

    monkeypatch.setattr(torch_copies, "PLATFORMS", ("gpu", "cpu"))
    monkeypatch.setattr(torch_copies, "MIN_BYTES", 1)
    src = sources(2)
    dst = {name: torch.zeros(8, 4) for name in src}
    for k in range(3):
        assert hits(src, dst) == (k > 0)
        jax_amem.swap(src, dst, progress=False)
        assert_written(src, dst)
        src = step(src)
    assert all(fn is None for fn in next(iter(repeat._entries.values())).program.fns)


def test_a_destination_that_does_not_copy_with_torch_keeps_every_copy_in_the_xla_call(monkeypatch):
    from jax_amem.swapping.destinations import TorchDestination
    from jax_amem.swapping.in_process import torch_copies

    class XlaOnly(TorchDestination):  # as another process's tensors over IPC declare it
        def __init__(self, tensors):
            super().__init__(tensors)
            self.torch_tensors = None

    monkeypatch.setattr(torch_copies, "PLATFORMS", ("gpu", "cpu"))
    monkeypatch.setattr(torch_copies, "MIN_BYTES", 1)
    src = sources(2)
    dst = {name: torch.zeros(8, 4) for name in src}
    report = jax_amem.swap(src, XlaOnly(dst), progress=False)
    assert_written(src, dst)
    program = next(iter(run._programs.values()))
    assert not program.torch_copies and all(fn is not None for fn in program.fns) and report.launches == 1


# ----------------------------------------------------------------------------- the native pass


class ReadersSeen(TorchDestination):
    """PyTorch tensors whose facts are read through Python functions that note which fact and
    which Python frame the read came from (a native call has no frame of its own: the frame
    seen is the one that made the call)."""

    reads: list = []

    def repeat_readers(self):
        readers, rewritten = super().repeat_readers()

        def seen(k, chain):
            def read(tensor):
                ReadersSeen.reads.append((k, sys._getframe(1).f_code.co_name))
                for step_ in chain:  # a callable, or a getter (a descriptor) of the tensor's type
                    tensor = step_(tensor) if callable(step_) else step_.__get__(tensor, type(tensor))
                return tensor
            return (read,)

        return [seen(k, chain) for k, chain in enumerate(readers)], rewritten


def repeat_seen(count: int):
    """One repeat swap of `count` tensors (new arrays, as a training step makes them): the facts
    read, and the Python calls and C calls made from Python other than the readers' own."""
    forget()
    src = sources(count)
    dst = {name: torch.full((8, 4), float("nan")) for name in src}
    jax_amem.swap(src, ReadersSeen(dst), progress=False)
    src = step(src)
    jax_amem.swap(src, ReadersSeen(dst), progress=False)  # the first repeat makes what later ones reuse
    src = step(src)
    ReadersSeen.reads = []
    events = collections.Counter()

    def count_events(frame, event, arg):
        if event in ("call", "c_call") and frame.f_code.co_name != "read":
            events[event] += 1

    sys.setprofile(count_events)
    try:
        jax_amem.swap(src, ReadersSeen(dst), progress=False)
    finally:
        sys.setprofile(None)
    assert_written(src, dst)
    return collections.Counter(ReadersSeen.reads), events


def test_a_repeat_reads_each_fact_once_inside_one_native_call_and_its_python_work_is_constant(facts):
    """The repeat's per-tensor work is the native pass: every fact of every tensor read once,
    all from inside the one check call (the version counters after writing are not read again:
    they move by what the first repeat's write moved them); everything else it runs in Python
    is the same for 8 tensors as for 300."""
    few_reads, few_events = repeat_seen(8)
    many_reads, many_events = repeat_seen(300)
    for count, reads in ((8, few_reads), (300, many_reads)):
        # layout and storage size; or address, storage offset, storage size and version
        readers = 2 if facts == LAYOUT else 4
        assert reads == {(k, "check"): count for k in range(readers)}, reads
    assert few_events == many_events, (few_events, many_events)
    assert few_events["call"] < 60, few_events


def test_version_counters_moved_by_anything_but_the_swap_miss_after_many_repeats(facts):
    """Tied weights (one tensor under two names: its counter moves twice a swap) and a tensor
    bumped by the rollout between swaps: the computed counters still match only the swap's own.
    (Read through DLPack, the layout replaces the counters: a write of values repeats.)"""
    src = sources(3)
    dst = {name: torch.zeros(8, 4) for name in src}
    dst["tied"] = dst["t0"]
    rules = [reshard.Rule.copy(name) for name in src] + [reshard.Rule.copy("tied", "t0")]
    how = run._how(rules, None)
    for k in range(4):
        src = step(src)
        assert (repeat.find(src, describe(dst), how)[0] is not None) == (k > 0), k
        jax_amem.swap(src, dst, rules=rules, progress=False)
        assert_written(src, dst)
    with torch.no_grad():
        dst["t2"].add_(1.0)  # the rollout writes in place: its counter moves
    assert (repeat.find(src, describe(dst), how)[0] is None) == (facts == METHODS)
    dst["t1"].resize_(4, 8)
    with pytest.raises(SwapError, match="t1"):
        jax_amem.swap(step(src), dst, rules=rules, progress=False)


def assert_copied(src, dst):
    """assert_written through copies (a tensor's .numpy() makes its storage unresizable)."""
    for name, array in src.items():
        assert torch.equal(dst[name], torch.from_numpy(np.array(array))), name


def _storage_shrunk(tensor):
    tensor.untyped_storage().resize_(0)
    tensor.untyped_storage().resize_(16)  # the same storage, fewer bytes: no version moves


def _storage_freed_and_regrown(tensor):
    storage = tensor.untyped_storage()
    size = storage.nbytes()
    storage.resize_(0)  # FSDP-style: freed, then allocated again; larger here, so the check must
    storage.resize_(size + 64)  # miss (the same size may come back at the same address: rightly a hit)


def _set_to_new_storage(tensor):
    tensor.set_(torch.zeros(tensor.shape))  # a new storage, same shape and dtype


def _viewed_further_in(tensor):
    with torch.no_grad():
        tensor.set_(tensor.untyped_storage(), 4, (7, 4), (4, 1))  # another offset and shape


def _written_by_the_rollout(tensor):
    with torch.no_grad():
        tensor.mul_(-1)


@pytest.mark.parametrize("change, refused", [
    (_storage_shrunk, True), (_storage_freed_and_regrown, False), (_set_to_new_storage, False),
    (_viewed_further_in, True), (_written_by_the_rollout, False)])
def test_after_many_repeats_a_changed_destination_misses_and_is_refused_or_written_exactly(change, refused, facts):
    """After repeats (facts compared as int64, the version counters computed, not read), each
    change of a destination's storage or layout makes the next swap miss: the full path refuses
    it with every tensor as it was, or re-plans and writes exactly the tensors as they are now
    (never the old bytes). A write of new values misses on the version counter; read through
    DLPack it repeats, and the repeat writes exactly the same."""
    src = sources(4)
    dst = {name: torch.zeros(8, 4) for name in src}
    for k in range(4):
        src = step(src)
        jax_amem.swap(src, dst, progress=False)
        assert_copied(src, dst)
    tensor = dst["t2"]
    before = {name: t.clone() for name, t in dst.items() if name != "t2"}
    change(tensor)
    assert hits(src, dst) == (change is _written_by_the_rollout and facts == LAYOUT)
    src = step(src)
    if refused:
        with pytest.raises(SwapError, match="t2"):
            jax_amem.swap(src, dst, progress=False)
        for name, t in before.items():
            assert torch.equal(dst[name], t), name
    else:
        jax_amem.swap(src, dst, progress=False)
        assert_written(src, dst)
        assert hits(step(src), dst)  # remembered again, as the tensors are now


def test_a_tensor_re_pointed_with_data_at_another_shape_misses_where_its_layout_is_read(facts):
    """`tensor.data = view` at the same address and storage with another shape moves no version
    counter: read through PyTorch's methods the repeat does not see it (a documented gap: it
    writes the old layout's bytes, inside the storage); read through DLPack the shape differs,
    so the repeat misses and the full path refuses the tensor before writing anything."""
    src = sources(3)
    dst = {name: torch.zeros(8, 4) for name in src}
    for _ in range(2):
        src = step(src)
        jax_amem.swap(src, dst, progress=False)
    dst["t1"].data = dst["t1"].data.view(4, 8)
    before = {name: t.clone() for name, t in dst.items()}
    assert hits(src, dst) == (facts == METHODS)
    if facts == LAYOUT:
        with pytest.raises(SwapError, match="t1"):
            jax_amem.swap(step(src), dst, progress=False)
        for name, t in before.items():
            assert torch.equal(dst[name], t), name


def test_after_many_repeats_a_deleted_or_changed_source_misses_with_the_destination_intact():
    """The same arrays repeat without their addresses read again; a deleted one (its buffer
    freed, the object alive) and one of another layout still miss, and the full path refuses
    them before writing."""
    src = sources(4)
    dst = {name: torch.zeros(8, 4) for name in src}
    for _ in range(3):
        jax_amem.swap(src, dst, progress=False)  # the same arrays each time
    before = {name: t.clone() for name, t in dst.items()}
    for changed, name in ((dict(src, t1=src["t1"].reshape(4, 8)), "t1"), (src, "t3")):
        if changed is src:
            src["t3"].delete()
        assert not hits(changed, dst)
        with pytest.raises(SwapError, match=name):
            jax_amem.swap(changed, dst, progress=False)
        for key, t in before.items():
            assert torch.equal(dst[key], t), key


@pytest.mark.parametrize("error", [RuntimeError, BufferError, TypeError])
def test_facts_that_cannot_be_read_leave_the_swap_done_and_nothing_remembered(monkeypatch, error):
    """A reader that raises (PyTorch's methods, or a DLPack export refused with BufferError as
    the protocol says) leaves the swap done, nothing remembered, and the next swap done too."""
    def unreadable(tensor):
        raise error("no facts here (injected)")

    monkeypatch.setattr(TorchDestination, "repeat_readers", lambda self: ([(unreadable,)], []))
    src = sources(2)
    dst = {name: torch.zeros(8, 4) for name in src}
    for _ in range(2):
        jax_amem.swap(src, dst, progress=False)
        assert_written(src, dst)
        assert len(repeat._entries) == 0
        src = step(src)


def nested(scale=1.0):
    """A tree of dicts, lists, tuples and None, as a model's parameters nest."""
    leaf = lambda *shape: jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape) * scale  # noqa: E731
    return {"embed": leaf(4, 3), "layers": [{"w": leaf(3, 3), "b": (leaf(3), None)} for _ in range(3)],
            "head": (leaf(2, 3),), "unused": None}


def test_a_nested_tree_repeats_without_being_flattened(monkeypatch):
    src = nested()
    names, leaves, _ = flat_named(src)
    dst = {name: torch.full(tuple(a.shape), float("nan")) for name, a in zip(names, leaves)}
    jax_amem.swap(src, dst, progress=False)
    flattened = []
    real = jax.tree_util.tree_flatten
    monkeypatch.setattr(jax.tree_util, "tree_flatten", lambda *a, **k: flattened.append(1) or real(*a, **k))
    for k in range(3):
        src = step(src)
        jax_amem.swap(src, dst, progress=False)
        for name, array in zip(names, flat_named(src)[1]):
            np.testing.assert_array_equal(dst[name].numpy(), np.asarray(array))
    assert len(flattened) == 3  # the checks above flatten; the swaps did not


@pytest.mark.parametrize("change", ["extra key", "shorter list", "None for a leaf", "list for a tuple", "same shapes, other keys"])
def test_a_nested_tree_of_another_structure_misses(change):
    src = nested()
    names, leaves, _ = flat_named(src)
    dst = {name: torch.zeros(tuple(a.shape)) for name, a in zip(names, leaves)}
    jax_amem.swap(src, dst, progress=False)
    other = nested(2.0)
    if change == "extra key":
        other["extra"] = jnp.ones(2)
    elif change == "shorter list":
        other["layers"].pop()
    elif change == "None for a leaf":
        other["head"] = (None,)
    elif change == "list for a tuple":
        other["head"] = list(other["head"])
    else:
        other["embed2"] = other.pop("embed")
    assert not hits(other, dst)
    if change == "list for a tuple":  # the same names: a tree JAX flattens alike, swapped by the full path
        jax_amem.swap(other, dst, progress=False)
        np.testing.assert_array_equal(dst["head/0"].numpy(), np.asarray(other["head"][0]))
    else:
        with pytest.raises(SwapError):
            jax_amem.swap(other, dst, progress=False)


Pair = collections.namedtuple("Pair", "a b")


def test_a_tree_with_other_nodes_and_two_trees_in_turn_repeat_through_the_flattened_tree():
    """A namedtuple is a node the native walk leaves to JAX: such a tree is flattened and its
    structure compared; two trees swapped in turn each repeat (the last one first, the other by
    its structure)."""
    first = {"p": Pair(jnp.ones(3), jnp.zeros(2))}
    first_dst = {"p/a": torch.zeros(3), "p/b": torch.zeros(2)}
    second = sources(3)
    second_dst = {name: torch.zeros(8, 4) for name in second}
    assert repeat.tree_spec(first, jax.tree_util.tree_leaves(first)) is None
    jax_amem.swap(first, first_dst, progress=False)
    jax_amem.swap(second, second_dst, progress=False)
    for _ in range(2):
        first, second = step(first), step(second)
        assert hits(first, first_dst) and hits(second, second_dst)
        jax_amem.swap(first, first_dst, progress=False)
        jax_amem.swap(second, second_dst, progress=False)
        np.testing.assert_array_equal(first_dst["p/b"].numpy(), np.asarray(first["p"].b))
        assert_written(second, second_dst)


def test_two_destinations_with_the_same_names_swapped_in_turn_each_repeat():
    """One tree into two sets of tensors with the same names, in turn (a norm replicated to
    every tensor-parallel rank, one plan for all): each keeps its own entry and repeats, and
    each set is written with its swap's values."""
    src = sources(3)
    first = {name: torch.zeros(8, 4) for name in src}
    second = {name: torch.zeros(8, 4) for name in src}
    jax_amem.swap(src, first, progress=False)
    jax_amem.swap(src, second, progress=False)
    for _ in range(2):
        src = step(src)
        assert hits(src, first)
        jax_amem.swap(src, first, progress=False)
        assert hits(src, second)
        jax_amem.swap(src, second, progress=False)
        assert_written(src, first)
        assert_written(src, second)


def test_a_reordered_destination_misses_and_is_written_by_name():
    src, dst = swapped()
    reordered = dict(reversed(list(dst.items())))
    assert not hits(src, reordered)
    src = step(src)
    jax_amem.swap(src, reordered, progress=False)
    assert_written(src, dst)


def _check(**changes):
    leaf = jnp.ones(2)
    tensor = torch.zeros(2)
    arguments = dict(spec=(0, ("x",), (0,)), array_type=type(leaf), aval_attribute="aval",
                     sharding_attribute="sharding", leaves=[leaf], names=["x"], tensors=[tensor],
                     readers=[(torch.Tensor.data_ptr,)], rewritten=[0], groups=[[0]],
                     pointers=[np.zeros(1, np.int64)], wait=jax.block_until_ready)
    arguments.update(changes)
    return core.copy.RepeatCheck(*arguments.values())


def test_repeat_check_fills_the_pointers_and_misses_on_a_change():
    pointers = np.zeros(1, np.int64)
    leaf = jnp.ones(2)
    tensor = torch.zeros(2)
    check = _check(leaves=[leaf], tensors=[tensor], pointers=[pointers])
    assert check.walks and check.leaves == 1 and check.tensors == 1
    assert pointers[0] == 0  # filled on a hit
    assert check.check({"x": leaf}, True, {"x": tensor}, False) is True
    assert pointers[0] == leaf.unsafe_buffer_pointer()
    new = leaf + 1
    assert check.check([new], False, {"x": tensor}, True) == [new] and pointers[0] == new.unsafe_buffer_pointer()
    assert check.check({"x": new}, True, {"y": tensor}, False) is None          # another name
    assert check.check({"x": new}, True, {"x": torch.zeros(2)}, False) is None  # another tensor
    assert check.check({"x": new.astype(jnp.bfloat16)}, True, {"x": tensor}, False) is None
    assert check.check({"x": np.ones(2)}, True, {"x": tensor}, False) is None    # not a jax.Array
    tensor.set_(torch.zeros(4))  # another storage: another address
    assert check.check({"x": new}, True, {"x": tensor}, False) is None
    assert pointers[0] == new.unsafe_buffer_pointer()  # a miss changes nothing


@pytest.mark.parametrize("changes, error, match", [
    (dict(leaves=[np.ones(2)]), TypeError, "array_type"),
    (dict(spec=(0, ("x", "y"), (0, 1))), ValueError, "another number of leaves"),
    (dict(spec=(0, ("x", "y"), (0,))), ValueError, "do not match its keys"),
    (dict(spec=(2, 1, (1,))), ValueError, "numbered in order"),
    (dict(rewritten=[1]), ValueError, "no such reader"),
    (dict(names=["x", "y"]), ValueError, "one name per tensor"),
    (dict(groups=[[1]]), ValueError, "no such leaf"),
    (dict(groups=[[0], [0]]), ValueError, "one pointer array per group"),
    (dict(pointers=[np.zeros(2, np.int64)]), ValueError, "another length"),
])
def test_repeat_check_refuses_what_does_not_fit(changes, error, match):
    with pytest.raises(error, match=match):
        _check(**changes)
