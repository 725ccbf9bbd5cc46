"""Repeat swaps into PyTorch tensors (swapping/in_process/repeat.py): the fingerprint check lets
a training loop's swap (same tensors, new arrays of the same layouts) skip planning and jit's
checks, and sends everything else, the cases that must be refused above all, to the full path."""

import gc

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem.swapping import SwapError, forget
from jax_amem.swapping.destinations import describe
from jax_amem.swapping.in_process import repeat, run

torch = pytest.importorskip("torch")

step = jax.jit(lambda tree: jax.tree_util.tree_map(lambda x: x + 1, tree))


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


@pytest.fixture(autouse=True)
def clean():
    forget()
    yield
    forget()


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
    entry = repeat._entries.get(repeat.key_of(jax.tree_util.tree_structure(src), tuple(dst), run._how(None, None)))
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
