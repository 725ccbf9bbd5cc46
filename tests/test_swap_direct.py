"""The direct launch of eager swaps by address (swapping/in_process/direct.py): the rows of the
address route launched from C++ outside XLA's dispatch. On the CPU the same rows run in the CPU
loop, so the logic is checked here: the bytes equal the XLA route's, which programs take it,
that a repeated swap costs the same Python work for 8 tensors as for 300, new source buffers,
chunks and groups, every refusal of core.copy.DirectCopy, and failures that leave nothing
written or nothing still writing. GPU (`gpu`): the same on CUDA, ordering with PyTorch's
stream and with sources still being computed."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem import copy as amem_copy
from jax_amem import reshard
from jax_amem._native import core
from jax_amem.swapping import SwapError, forget
from jax_amem.swapping.in_process import direct, repeat, schedule

torch = pytest.importorskip("torch")
from swap_probes import clean, python_work, raw, the_program  # noqa: F401 - clean: an autouse fixture

step = jax.jit(lambda tree: jax.tree_util.tree_map(lambda x: x + 1, tree))


def sources(count, shape=(8, 5), dtype=jnp.float32, device=None):
    device = device or jax.devices()[0]
    return {f"t{i:04d}": jax.device_put((jnp.arange(np.prod(shape)) + 1000 * i).reshape(shape).astype(dtype), device)
            for i in range(count)}


def empty_like(src, device="cpu", fill=7):
    return {name: torch.full(a.shape, fill, dtype=getattr(torch, np.dtype(a.dtype).name), device=device)
            for name, a in src.items()}


def assert_holds(dst, src):
    for name, array in src.items():
        want = np.ascontiguousarray(np.asarray(array)).reshape(-1).view(np.uint8)
        assert np.array_equal(raw(dst[name]), want), name


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int8, jnp.uint16])
def test_plain_copies_are_launched_directly_and_equal_the_xla_route(monkeypatch, dtype):
    src = sources(20, (16, 9), dtype)
    dst = empty_like(src)
    pointers = [t.data_ptr() for t in dst.values()]
    report = jax_amem.swap(src, dst, progress=False)
    program = the_program()
    assert isinstance(program.direct, direct.DirectProgram) and program.direct.ordinals == [-1]
    assert report.route == "addresses" and report.bytes == sum(a.nbytes for a in src.values())
    assert [t.data_ptr() for t in dst.values()] == pointers
    assert_holds(dst, src)
    monkeypatch.setattr(direct, "ENABLED", False)
    forget()
    by_xla = empty_like(src)
    jax_amem.swap(src, by_xla, progress=False)
    assert the_program().direct is False
    assert all(np.array_equal(raw(dst[k]), raw(by_xla[k])) for k in src)


def test_fused_and_sliced_destinations_with_bulk_and_kernel_rows(monkeypatch):
    """Destinations written from several sources (a fused qkv; gate and up interleaved row by
    row) and slices of a stacked source (one layer each): every row a driver copy, then no row
    one: the same bytes, the numpy oracle's."""
    rng = np.random.default_rng(0)
    host = {"q": rng.standard_normal((4, 6), np.float32), "k": rng.standard_normal((2, 6), np.float32),
            "v": rng.standard_normal((2, 6), np.float32), "g": rng.standard_normal((4, 3), np.float32),
            "u": rng.standard_normal((4, 3), np.float32), "layers": rng.standard_normal((3, 5, 7), np.float32)}
    src = {name: jax.device_put(value, jax.devices()[0]) for name, value in host.items()}
    Rule, Part = reshard.Rule, reshard.Part
    rules = [Rule.concat("qkv", [Part("q"), Part("k"), Part("v")]), Rule.concat("gate_up", [Part("g"), Part("u")], axis=1)]
    rules += [Rule.copy(f"layer{i}", "layers", index=(i,)) for i in range(3)]
    want = {"qkv": np.concatenate([host["q"], host["k"], host["v"]]),
            "gate_up": np.concatenate([host["g"], host["u"]], axis=1)}
    want.update({f"layer{i}": host["layers"][i] for i in range(3)})
    for bulk in (1, 1 << 40):
        monkeypatch.setattr(amem_copy, "BULK_BYTES", bulk)  # read when a program first runs
        forget()
        dst = {name: torch.full(w.shape, float("nan")) for name, w in want.items()}
        report = jax_amem.swap(src, dst, rules=rules, progress=False)
        copies = the_program().direct.copies
        assert (sum(c.bulk_rows for c in copies) > 0, sum(c.rows for c in copies) > 0) == (bulk == 1, bulk != 1)
        # The report counts what the launch runs: 3 + 2 * 4 + 3 driver copies, or one kernel.
        assert report.launches == sum(c.launches for c in copies) == (14 if bulk == 1 else 1)
        for name, w in want.items():
            assert np.array_equal(raw(dst[name]), w.reshape(-1).view(np.uint8)), (bulk, name)


def test_views_the_fused_copy_does_not_read_stay_in_xla():
    """A transpose that is no batched 2-D transpose (test_swap_transpose.py has the ones that are)."""
    src = {"w": jax.device_put(jnp.arange(24.0).reshape(2, 3, 4), jax.devices()[0])}
    dst = {"w": torch.zeros(3, 2, 4, dtype=torch.bfloat16)}
    rules = [reshard.Rule.copy("w", transpose=(1, 0, 2), cast="bfloat16")]
    jax_amem.swap(src, dst, rules=rules, progress=False)
    assert the_program().direct is False
    assert torch.equal(dst["w"], torch.arange(24.0).reshape(2, 3, 4).permute(1, 0, 2).to(torch.bfloat16))


def test_views_with_constant_steps_run_as_affine_rows_or_stepped_transpose_rows():
    """A plain view with a constant step is launched directly as the affine kernel's rows
    (tests/test_swap_direct_affine.py has the rest); a transposed one as the fused transpose
    copy's rows running the step (tests/test_swap_transpose_steps.py)."""
    src = {"w": jax.device_put(jnp.arange(12.0).reshape(3, 4), jax.devices()[0])}
    dst = {"w": torch.zeros(3, 4)}
    jax_amem.swap(src, dst, rules=[reshard.Rule.copy("w", scale=0.125)], progress=False)
    assert [c.affine_rows for c in the_program().direct.copies] == [1]
    assert torch.equal(dst["w"], torch.arange(12.0).reshape(3, 4) * 0.125)
    forget()
    dst = {"w": torch.zeros(4, 3)}
    jax_amem.swap(src, dst, rules=[reshard.Rule.copy("w", transpose=(1, 0), scale=0.125)], progress=False)
    copies = the_program().direct.copies
    assert [(c.affine_rows, c.stepped_transpose_rows) for c in copies] == [(0, 1)]
    assert torch.equal(dst["w"], torch.arange(12.0).reshape(3, 4).T * 0.125)


def test_sharded_sources_stay_in_xla():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
    src = {"w": jax.device_put(jnp.arange(16.0).reshape(4, 4), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))}
    dst = {"w": torch.zeros(4, 4)}
    jax_amem.swap(src, dst, progress=False)
    assert the_program().direct is False
    assert torch.equal(dst["w"], torch.arange(16.0).reshape(4, 4))


def test_many_buffers_in_several_chunks_and_groups(monkeypatch):
    monkeypatch.setattr(schedule, "ADDRESS_GROUP_BUFFERS", 700)  # groups of 700 and 300 buffers, chunks of 512
    src = sources(1000, (3,))
    dst = empty_like(src)
    report = jax_amem.swap(src, dst, progress=False)
    assert report.calls == 2 and len(the_program().direct.copies) == 2
    assert [c.sources for c in the_program().direct.copies] == [700, 300]
    assert_holds(dst, src)


def test_a_training_loop_refreshes_the_source_addresses():
    src = sources(30)
    dst = empty_like(src)
    jax_amem.swap(src, dst, progress=False)
    program = the_program()
    for _ in range(3):
        src = step(src)  # new buffers
        jax_amem.swap(src, dst, progress=False)
        assert_holds(dst, src)
    entry = next(iter(repeat._entries.values()))
    assert entry.program is program and entry.calls is None  # no XLA executable was made for the repeats
    assert [t._version for t in dst.values()] == [4] * 30  # bumped once per swap, as copy_ would


def test_only_the_sources_with_new_buffers_are_awaited_and_read_again(monkeypatch):
    """Frozen weights beside trained ones (LoRA): the same arrays keep their addresses; only
    the new ones are awaited (one batched wait per swap) and read again."""
    waited = []
    real = repeat._await
    monkeypatch.setattr(repeat, "_await", lambda arrays: waited.append(len(arrays)) or real(arrays))
    src = sources(30)
    dst = empty_like(src)
    jax_amem.swap(src, dst, progress=False)
    jax_amem.swap(src, dst, progress=False)  # the same arrays: nothing awaited
    trained = {k: v + 1 for k, v in list(src.items())[:3]}
    src = {**src, **trained}
    jax_amem.swap(src, dst, progress=False)
    assert waited == [3]
    assert_holds(dst, src)
    src = step(src)  # every buffer new
    jax_amem.swap(src, dst, progress=False)
    assert waited == [3, 30]
    assert_holds(dst, src)


def python_work_per_repeat(count: int) -> dict:
    """Python function calls and C calls made from Python during one repeated swap of `count`
    tensors (sys.setprofile sees every Python frame, and every C call made from Python code;
    C calls inside map() are not seen: that is the per-tensor work allowed)."""
    forget()
    src = sources(count, (4,))
    dst = empty_like(src)
    jax_amem.swap(src, dst, progress=False)
    src = step(src)
    jax_amem.swap(src, dst, progress=False)  # the first repeat makes what later repeats reuse
    src = step(src)
    seen = python_work(lambda: jax_amem.swap(src, dst, progress=False))
    assert_holds(dst, src)
    assert isinstance(the_program().direct, direct.DirectProgram)
    return seen


def test_a_repeated_swap_does_no_python_work_per_tensor():
    few, many = python_work_per_repeat(8), python_work_per_repeat(300)
    assert few == many, (few, many)
    assert few["call"] < 100, few  # and not much per swap either


def test_the_launch_takes_its_streams_from_the_destination_and_never_waits_on_the_host(monkeypatch):
    """A direct launch into PyTorch tensors asks the destination for its streams
    (`before_launch`: PyTorch's current stream, where the copy is ordered after PyTorch's work
    with no host wait) and bumps the tensors' versions as copy_ would (`while_launched`: after
    the launch, before the wait), on the first swap and on repeats; the host wait of the XLA
    route (`wait_for_torch`) is never called."""
    from jax_amem.swapping import destinations, torch_bridge

    def no_host_wait(devices):
        raise AssertionError("the direct launch waited on the host for PyTorch's stream")

    monkeypatch.setattr(torch_bridge, "wait_for_torch", no_host_wait)
    asked = []
    before_launch = destinations.TorchDestination.before_launch
    monkeypatch.setattr(destinations.TorchDestination, "before_launch",
                        lambda self, ordinals: (asked.append(list(ordinals)), before_launch(self, ordinals))[1])
    src = sources(3)
    dst = empty_like(src)
    versions = [t._version for t in dst.values()]
    # The versions move on once every copy is queued, before the wait for them (so the bump
    # overlaps the device's copy): never before the launch, never after the wait.
    order = []
    synchronize = direct._synchronize
    monkeypatch.setattr(direct, "_synchronize", lambda launched: (order.append("wait"), synchronize(launched)))
    while_launched = destinations.TorchDestination.while_launched
    monkeypatch.setattr(destinations.TorchDestination, "while_launched",
                        lambda self: (order.append(("bump", [t._version for t in dst.values()])), while_launched(self)))
    for swaps in (1, 2, 3):  # the full path, then repeats
        order.clear()
        jax_amem.swap(src, dst, progress=False)
        assert the_program().direct is not None
        assert len(asked) == swaps and asked[-1] == []  # no CUDA ordinal on the CPU
        assert order == [("bump", [v + swaps - 1 for v in versions]), "wait"]
        assert [t._version for t in dst.values()] == [v + swaps for v in versions]
        assert_holds(dst, src)


def test_the_switch(monkeypatch):
    monkeypatch.setenv(direct.ENV, "yes")
    with pytest.raises(SwapError, match="JAX_AMEM_SWAP_DIRECT='yes'"):
        jax_amem.swap(sources(2), empty_like(sources(2)), progress=False)
    monkeypatch.setenv(direct.ENV, "0")
    forget()
    src = sources(2)
    dst = empty_like(src)
    jax_amem.swap(src, dst, progress=False)
    assert the_program().direct is False
    assert_holds(dst, src)


def test_a_deleted_source_on_a_repeat_is_refused_untouched():
    src = sources(4)
    dst = empty_like(src)
    jax_amem.swap(src, dst, progress=False)
    src = step(src)
    before = {k: raw(t) for k, t in dst.items()}
    src["t0002"].delete()
    with pytest.raises(SwapError, match="t0002"):
        jax_amem.swap(src, dst, progress=False)
    assert all(np.array_equal(raw(t), before[k]) for k, t in dst.items())


def test_a_failing_group_leaves_after_the_launched_ones_finished(monkeypatch):
    """A launch that fails (a device error, say) raises only after the groups already launched
    were waited for; with every pointer read before the first launch, a deleted source fails
    before any group writes."""
    monkeypatch.setattr(schedule, "ADDRESS_GROUP_BUFFERS", 1)
    src = sources(3)
    dst = empty_like(src)
    jax_amem.swap(src, dst, progress=False)
    launch = the_program().direct
    waited = []
    monkeypatch.setattr(direct, "_synchronize", lambda launched: waited.append(list(launched)))

    class Failing:
        def run(self, pointers, stream):
            raise RuntimeError("launch failed (injected)")

    copies = list(launch.copies)
    monkeypatch.setattr(launch, "copies", [copies[0], Failing(), copies[2]])
    fresh = {k: v + 1 for k, v in src.items()}
    versions = [t._version for t in dst.values()]
    with pytest.raises(RuntimeError, match="injected"):
        jax_amem.swap(fresh, dst, progress=False)
    assert waited == [[(-1, 0)]]  # the first group's launch, waited for before the error left
    # a tensor may be written: every version moved on all the same, as copy_ would
    assert [t._version for t in dst.values()] == [v + 1 for v in versions]
    assert np.array_equal(raw(dst["t0000"]), np.asarray(fresh["t0000"]).reshape(-1).view(np.uint8))
    assert np.array_equal(raw(dst["t0002"]), np.asarray(src["t0002"]).reshape(-1).view(np.uint8))


# core.copy.DirectCopy refuses what would copy outside its buffers; nothing is written.

def _buffers():
    src = np.arange(64, dtype=np.uint8)
    dst = np.zeros(64, np.uint8)
    return src, dst


def _rows(*rows):
    return np.array(rows, np.int64).reshape(-1, 6)


@pytest.mark.parametrize("chunk, match", [
    (([1], "dst", [64], _rows(), _rows((0, 0, 0, 0, 8, 0))), "source slot 1 is not one of the 1 sources"),
    (([0], "dst", [64], _rows(), _rows((0, 0, 60, 0, 8, 0))), "reads outside source buffer 0 of 64 bytes"),
    (([0], "dst", [64], _rows((0, 0, 0, 60, 8, 0)), _rows()), "bulk .*writes outside destination buffer 0"),
    (([0], "dst", [64], _rows(), _rows((0, 1, 0, 0, 8, 0))), "buffer index out of range"),
    (([0], "dst", [64], _rows(), _rows((0, 0, 0, 0, 8, 1))), "sixth column must be 0"),
    (([0], 0x1000, [64], _rows(), _rows((0, 0, 0, 0, 8, 0))), "destination 0: address 0x1000 cannot be memory of this process"),
    (([0], "dst", [64, 8], _rows(), _rows()), "1 destinations but 2 sizes"),
])
def test_direct_copy_refuses_rows_outside_their_buffers(chunk, match):
    src, dst = _buffers()
    slots, address, sizes, bulk, rows = chunk
    address = dst.ctypes.data if address == "dst" else address
    with pytest.raises(ValueError, match=match):
        core.copy.DirectCopy(-1, [64], [(slots, [address], sizes, bulk, rows)])
    assert not dst.any()


def test_direct_copy_refuses_pointers_it_cannot_use():
    src, dst = _buffers()
    copy = core.copy.DirectCopy(-1, [64], [([0], [dst.ctypes.data], [64], _rows(), _rows((0, 0, 8, 16, 8, 0)))])
    with pytest.raises(RuntimeError, match="2 source addresses for 1 sources"):
        copy.run(np.array([src.ctypes.data, src.ctypes.data]))
    with pytest.raises(RuntimeError, match="no memory of this process"):
        copy.run(np.array([0]))
    assert not dst.any()
    copy.run(np.array([src.ctypes.data]))
    assert dst[16:24].tolist() == list(range(8, 16)) and not dst[:16].any() and not dst[24:].any()


def test_refresh_sources_reads_only_new_arrays_and_leaves_the_addresses_on_a_failure():
    """core.copy.refresh_sources, the one refresh of the direct launch and the repeat check:
    the arrays of the last call are neither awaited nor read again; a new one is, all groups'
    in one wait; a failure to read leaves every address as it was."""
    a, b, c = jnp.ones(3), jnp.zeros(3), jnp.full(3, 2.0)
    pointers = [np.zeros(2, np.int64), np.zeros(1, np.int64)]
    tables = [core.copy.SourceAddresses(p) for p in pointers]
    waited = []
    wait = lambda arrays: waited.append(list(arrays)) or jax.block_until_ready(arrays)  # noqa: E731
    core.copy.refresh_sources(tables, [[a, b], [c]], wait)
    assert pointers[0].tolist() == [a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()]
    assert pointers[1].tolist() == [c.unsafe_buffer_pointer()]
    assert [[id(x) for x in w] for w in waited] == [[id(a), id(b), id(c)]]
    new = b + 1
    core.copy.refresh_sources(tables, [[a, new], [c]], wait)
    assert [[id(x) for x in w] for w in waited[1:]] == [[id(new)]]  # the others kept their addresses
    assert pointers[0].tolist() == [a.unsafe_buffer_pointer(), new.unsafe_buffer_pointer()]
    before = [p.copy() for p in pointers]
    with pytest.raises(AttributeError, match="unsafe_buffer_pointer"):
        core.copy.refresh_sources(tables, [[jnp.ones(3) * 5, np.ones(3)], [c]], jax.block_until_ready)
    assert all((p == q).all() for p, q in zip(pointers, before))
    core.copy.refresh_sources(tables, [[a, new], [c]], wait)  # still known: nothing awaited
    assert len(waited) == 2
    with pytest.raises(ValueError, match="not as many"):
        core.copy.refresh_sources(tables, [[a], [c]], wait)
    with pytest.raises(ValueError, match="one operand list per table"):
        core.copy.refresh_sources(tables, [[a, new]], wait)


def test_the_same_arrays_in_turn_with_new_ones_are_written_exactly():
    """Sources alternating between two sets and a mix (the kept addresses, the refreshed ones),
    through the repeat check and through the full path (verify=True: DirectProgram.run): every
    swap writes exactly its own arrays."""
    first = sources(12)
    second = step(first)
    dst = empty_like(first)
    for verify in (False, True):
        for src in (first, second, first, dict(first, t0003=second["t0003"]), second, first):
            jax_amem.swap(src, dst, progress=False, verify=verify)
            assert_holds(dst, src)


# ----------------------------------------------------------------------------- GPU


def _cuda_sources(count, elements, device):
    return {f"t{i:04d}": jax.device_put(jnp.arange(elements, dtype=jnp.float32) * (i + 1), device) for i in range(count)}


@pytest.mark.gpu
def test_gpu_small_and_bulk_tensors_direct_and_bit_exact():
    gpu = jax.devices("gpu")[0]
    cuda = torch.device("cuda", gpu.local_hardware_id)
    for count, elements in ((2000, 4096), (3, (64 << 20) // 4 + 3)):  # 16 KiB kernel rows; bulk rows
        forget()
        src = _cuda_sources(count, elements, gpu)
        dst = {k: torch.full((elements,), float("nan"), device=cuda) for k in src}
        pointers = [t.data_ptr() for t in dst.values()]
        for k in range(3):
            jax_amem.swap(src, dst, progress=False)
            assert isinstance(the_program().direct, direct.DirectProgram)
            assert_holds(dst, src)
            src = step(src)
        assert [t.data_ptr() for t in dst.values()] == pointers
        assert (sum(c.bulk_rows for c in the_program().direct.copies) > 0) == (count == 3)


@pytest.mark.gpu
def test_gpu_copy_waits_for_sources_still_being_computed():
    """Sources from a long jitted computation still running when swap is called: the copy
    reads its results, not the buffers before they were written."""
    gpu = jax.devices("gpu")[0]
    cuda = torch.device("cuda", gpu.local_hardware_id)
    x = jax.device_put(jnp.ones((4096, 4096), jnp.float32) / 4096, gpu)

    @jax.jit
    def slow(x):
        y = x
        for _ in range(40):
            y = y @ x
        return {"a": y[0] + 1.0, "b": y[1] + 2.0}

    src = slow(x)
    dst = {k: torch.zeros(4096, device=cuda) for k in src}
    jax_amem.swap(src, dst, progress=False)  # learn the program
    for _ in range(3):
        x = x * 1.0001
        src = slow(x)  # dispatched, not awaited
        jax_amem.swap(src, dst, progress=False)
        assert_holds(dst, src)


@pytest.mark.gpu
def test_gpu_copy_runs_on_pytorchs_current_stream(monkeypatch):
    """On a side stream made current: the swap's copy is queued on that very stream (no host
    wait for it before), ordered after what PyTorch queued there (a long sleep, then a fill of
    the destination) and before what it queues next."""
    gpu = jax.devices("gpu")[0]
    cuda = torch.device("cuda", gpu.local_hardware_id)
    src = _cuda_sources(64, 1 << 16, gpu)
    dst = {k: torch.zeros(1 << 16, device=cuda) for k in src}
    jax_amem.swap(src, dst, progress=False)
    side = torch.cuda.Stream(cuda)
    waited = []
    synchronize = direct._synchronize
    monkeypatch.setattr(direct, "_synchronize", lambda launched: (waited.extend(launched), synchronize(launched)))
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # tens of milliseconds of the side stream
        for t in dst.values():
            t.fill_(-1.0)
        jax_amem.swap(src, dst, progress=False)
        after = {k: t.clone() for k, t in dst.items()}  # queued after the swap on the same stream
    torch.cuda.synchronize(cuda)
    assert waited and {stream for _, stream in waited} == {side.cuda_stream}
    assert_holds(after, src)
    assert_holds(dst, src)
