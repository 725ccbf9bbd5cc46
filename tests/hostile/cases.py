"""Hostile and bad input, one function per case, run in child processes by
tests/test_hostile_inputs.py (a crash there is a failing test, not a dead test run).

A case returns the exception the library raised (None when the call is meant to succeed) after
checking that nothing was lost or written: it raises AssertionError itself when the state is
wrong. `python -P tests/hostile/cases.py NAME...` runs the named cases here and prints one JSON
line per case: {"case", "error", "classes", "message"} or {"case", "failed": traceback}.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import numpy as np  # noqa: E402

CASES = {}


def case(function):
    CASES[function.__name__] = function
    return function


def attempt(call):
    """The exception `call()` raises, or None."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the parent judges the class and message
        return error
    return None


def _jax():
    import jax
    import jax.numpy as jnp

    return jax, jnp


def _mesh():
    jax, _ = _jax()
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices("cpu")[:8]).reshape(2, 4), ("a", "b"))


def _sharded(value, *spec):
    jax, _ = _jax()
    from jax.sharding import NamedSharding, PartitionSpec as P

    return jax.device_put(value, NamedSharding(_mesh(), P(*spec)))


# ----------------------------------------------------------------------------- swap: PyTorch destinations


def _torch_swap(dst, src=None, **kwargs):
    """The error of swapping into `dst`, after checking every strided tensor kept its bytes."""
    import jax_amem
    import torch

    _, jnp = _jax()
    src = src if src is not None else {"w": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)}
    before = ({k: v.detach().resolve_conj().resolve_neg().clone() for k, v in dst.items()
               if torch.is_tensor(v) and v.layout == torch.strided and v.untyped_storage().nbytes()}
              if isinstance(dst, dict) else {})  # (cloning a tensor whose storage was freed kills PyTorch)
    error = attempt(lambda: jax_amem.swap(src, dst, **kwargs))
    for name, old in before.items():
        assert torch.equal(dst[name].detach().resolve_conj().resolve_neg(), old), f"{name} was written"
    return error


@case
def torch_source_names_collide():
    """Source leaves {"a/b": x} and {"a": {"b": y}} are both named 'a/b': the swap wrote one of them
    into 'a/b' silently (the names no longer lined up with the leaves)."""
    import torch

    _, jnp = _jax()
    src = {"a/b": jnp.full((2, 3), 1.0), "a": {"b": jnp.full((2, 3), 2.0)}}
    return _torch_swap({"a/b": torch.zeros(2, 3)}, src)


@case
def torch_conj_view():
    import torch

    _, jnp = _jax()
    return _torch_swap({"w": torch.zeros(2, 3, dtype=torch.complex64).conj()},
                       src={"w": jnp.full((2, 3), 1 + 2j, jnp.complex64)})


@case
def torch_neg_view():
    import torch

    return _torch_swap({"w": torch._neg_view(torch.zeros(2, 3))})


@case
def torch_requires_grad_in_a_graph():
    """copy_ semantics: the swap succeeds, and backward() on the old graph then refuses."""
    import jax_amem
    import torch

    _, jnp = _jax()
    w = torch.zeros(2, 3, requires_grad=True)
    loss = (w * torch.ones(3, requires_grad=True)).sum()
    jax_amem.swap({"w": jnp.ones((2, 3))}, {"w": w})
    assert torch.equal(w.detach(), torch.ones(2, 3))
    return attempt(loss.backward)


@case
def torch_view_of_a_jax_array():
    import jax_amem

    _, jnp = _jax()
    target = jnp.zeros((2, 3))
    error = _torch_swap({"w": jax_amem.to_torch({"w": target})["w"][0].tensor})
    assert not np.asarray(target).any(), "the jax.Array was written"
    return error


@case
def torch_sparse():
    import torch

    return _torch_swap({"w": torch.zeros(2, 3).to_sparse()})


@case
def torch_tensors_as_a_list():
    import torch

    return _torch_swap([torch.zeros(2, 3)])


@case
def torch_plan_is_a_string():
    import torch

    return _torch_swap({"w": torch.zeros(2, 3)}, plan="hello")


@case
def torch_rules_are_strings():
    import torch

    return _torch_swap({"w": torch.zeros(2, 3)}, rules=["hello"])


@case
def torch_two_names_one_storage():
    import torch

    _, jnp = _jax()
    t = torch.zeros(2, 3)
    return _torch_swap({"w": t, "v": t}, src={"w": jnp.ones((2, 3)), "v": jnp.ones((2, 3))})


@case
def torch_freed_storage():
    import torch

    t = torch.zeros(2, 3)
    t.untyped_storage().resize_(0)
    return _torch_swap({"w": t})


@case
def torch_tensor_metadata_generated():
    """hypothesis over dtype, shape, strides (transposed), storage offset, requires_grad and
    conj/neg: each swap either writes exactly the source's values or raises SwapError leaving
    the tensor's bytes as they were."""
    import jax_amem
    import torch
    from hypothesis import HealthCheck, given, settings, strategies as st

    from jax_amem.swapping import SwapError

    _, jnp = _jax()
    dtypes = [torch.float32, torch.bfloat16, torch.int8, torch.float16, torch.complex64, torch.int32]

    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(dtypes), st.lists(st.integers(0, 5), min_size=1, max_size=3), st.booleans(),
           st.integers(0, 3), st.booleans(), st.sampled_from(["plain", "conj", "neg"]),
           st.sampled_from([None, "src_shape", "other_dtype"]))
    def check(dtype, shape, transpose, offset, grad, bit, mismatch):
        shape = tuple(shape)
        count = int(np.prod(shape))
        base = torch.zeros(count + offset, dtype=dtype)
        t = base[offset:].view(shape)
        if transpose and t.ndim > 1:
            t = t.transpose(0, 1)
        if bit == "conj" and dtype.is_complex:
            t = t.conj()
        elif bit == "neg":
            t = torch._neg_view(t)
        if grad and (dtype.is_floating_point or dtype.is_complex):
            t.requires_grad_(True)
        want_shape = tuple(t.shape) if mismatch != "src_shape" else tuple(t.shape) + (1,)
        np_dtype = jnp.dtype(str(dtype).removeprefix("torch.")) if mismatch != "other_dtype" else jnp.int16
        values = (np.arange(int(np.prod(want_shape))) % 7 + 1).astype(np_dtype).reshape(want_shape)
        before = base.clone()
        error = attempt(lambda: jax_amem.swap({"w": jnp.asarray(values)}, {"w": t}))
        if error is None:
            got = t.detach().resolve_conj().resolve_neg()
            got = got.float().numpy() if dtype == torch.bfloat16 else got.numpy()
            assert np.array_equal(got, values.astype(got.dtype)), (dtype, shape, transpose, bit)
        else:
            assert isinstance(error, SwapError), repr(error)
            assert torch.equal(base, before), "refused, yet written"

    check()
    return None


# ----------------------------------------------------------------------------- swap: JAX destinations


def _jax_swap(src, dst):
    """The error of swapping into `dst`, after checking every destination is alive and unchanged."""
    import jax_amem

    leaves = dict(dst)
    before = {k: np.asarray(v) for k, v in leaves.items()}
    error = attempt(lambda: jax_amem.swap(src, dst))
    dead = [k for k, v in leaves.items() if v.is_deleted()]
    assert not dead, f"destinations lost: {dead[:5]} ({len(dead)})"
    for name, old in before.items():
        assert np.array_equal(np.asarray(leaves[name]), old), f"{name} changed"
    return error


@case
def jax_destination_names_collide():
    """Destination leaves {"a/b": x} and {"a": {"b": y}}: one name for two arrays."""
    _, jnp = _jax()
    dst = {"a/b": jnp.zeros(4) + 0, "a": {"b": jnp.zeros(4) + 0}}
    before = [np.asarray(v) for v in (dst["a/b"], dst["a"]["b"])]
    import jax_amem

    error = attempt(lambda: jax_amem.swap({"a/b": jnp.ones(4), "x": jnp.ones(4)}, dst))
    assert not dst["a/b"].is_deleted() and not dst["a"]["b"].is_deleted(), "a destination was lost"
    assert all(np.array_equal(np.asarray(v), b) for v, b in zip((dst["a/b"], dst["a"]["b"]), before))
    return error


@case
def jax_same_array_twice():
    _, jnp = _jax()
    tied = jnp.zeros(4)
    return _jax_swap({"a": jnp.ones(4), "b": jnp.ones(4)}, {"a": tied, "b": tied})


@case
def jax_1030_destinations_one_tied_pair():
    _, jnp = _jax()
    src = {f"p{i:04d}": jnp.full(2, float(i)) for i in range(1030)}
    dst = {f"p{i:04d}": jnp.zeros(2) for i in range(1029)}
    dst["p1029"] = dst["p0000"]
    return _jax_swap(src, dst)


@case
def jax_destination_is_a_source():
    _, jnp = _jax()
    src = {"a": jnp.ones(4), "b": jnp.ones(4)}
    error = _jax_swap(src, {"a": src["a"], "b": jnp.zeros(4)})
    assert not src["a"].is_deleted()
    return error


@case
def jax_rollout_made_by_device_put_shares_source_buffers():
    jax, jnp = _jax()
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    src = {"w": _sharded(jnp.arange(32.0).reshape(4, 8), "a", "b")}
    other = Mesh(_mesh().devices, ("x", "y"))
    rollout = jax.device_put(src, {"w": NamedSharding(other, P("x", "y"))})
    error = _jax_swap(src, rollout)
    assert not src["w"].is_deleted()
    return error


@case
def jax_deleted_destination():
    _, jnp = _jax()
    import jax_amem

    x = jnp.zeros(4)
    x.delete()
    return attempt(lambda: jax_amem.swap({"x": jnp.ones(4)}, {"x": x}))


@case
def jax_wrong_shape_and_dtype():
    _, jnp = _jax()
    return _jax_swap({"x": jnp.ones(4)}, {"x": jnp.zeros(5, jnp.int32)})


@case
def jax_zero_size_destination_made_by_jit():
    """Succeeds: the zero-size array is kept as it is, the other 19 are written."""
    import jax_amem

    jax, jnp = _jax()
    from jax.sharding import NamedSharding, PartitionSpec as P

    src = {f"p{i:02d}": jnp.full((4, 4), float(i)) for i in range(19)}
    src["z"] = jnp.zeros((0, 4))
    dst = {f"p{i:02d}": _sharded(jnp.zeros((4, 4)), None, "b") for i in range(19)}
    dst["z"] = jax.jit(lambda: jnp.zeros((0, 4)), out_shardings=NamedSharding(_mesh(), P(None, "b")))()
    new = jax_amem.swap(src, dst).dst
    for i in range(19):
        assert np.array_equal(np.asarray(new[f"p{i:02d}"]), np.full((4, 4), float(i)))
    assert new["z"].shape == (0, 4)
    return None


# ----------------------------------------------------------------------------- the three copy targets


def _copy_src_dst():
    _, jnp = _jax()
    return jnp.arange(16, dtype=jnp.uint8), jnp.zeros(16, jnp.uint8)


def _segment_copy(rows):
    """The error of segment_copy(16 bytes -> 16 bytes, rows); the destination must stay zero."""
    from jax_amem.copy import segment_copy

    src, dst = _copy_src_dst()
    error = attempt(lambda: np.asarray(segment_copy(src, dst, rows)))
    assert not np.asarray(dst).any()
    return error


def _segment_copy_many(rows):
    from jax_amem.copy import segment_copy_many

    src, dst = _copy_src_dst()
    return attempt(lambda: segment_copy_many([src], [dst], rows))


@case
def copy_segment_out_of_bounds():
    return _segment_copy([(0, 10, 8)])


@case
def copy_segment_negative_and_overflowing():
    errors = [_segment_copy(rows)
              for rows in ([(-1, 0, 4)], [(0, 0, -4)], [(2**62, 0, 2**62)], [(0, 0, 8), (0, 4, 8)])]
    assert all(isinstance(e, ValueError) for e in errors), errors
    return errors[-1]


@case
def copy_segment_float_rows():
    return _segment_copy([(4.7, 0, 8.9)])


@case
def copy_segment_five_columns():
    return _segment_copy([(0, 0, 4, 0, 0), (4, 4, 4, 0, 0), (8, 8, 4, 0, 0)])


@case
def copy_segment_tables_generated():
    """hypothesis over (src_offset, dst_offset, bytes) tables: accepted tables write exactly what
    a numpy oracle writes; the others raise ValueError; none crashes the process."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from jax_amem.copy import segment_copy

    _, jnp = _jax()
    src = np.arange(64, dtype=np.uint8)
    n = st.integers(-4, 72)

    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(n, n, n), max_size=6))
    def check(rows):
        dst = np.full(64, 255, np.uint8)
        inside = all(0 <= s and 0 <= d and b > 0 and s + b <= 64 and d + b <= 64 for s, d, b in rows)
        spans = sorted((d, d + b) for _, d, b in rows)
        disjoint = all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        error = attempt(lambda: np.asarray(segment_copy(jnp.asarray(src), jnp.asarray(dst), rows)))
        if inside and disjoint:
            assert error is None, (rows, error)
            want = dst.copy()
            for s, d, b in rows:
                want[d:d + b] = src[s:s + b]
            assert np.array_equal(np.asarray(segment_copy(jnp.asarray(src), jnp.asarray(dst), rows)), want)
        else:
            assert isinstance(error, ValueError) or (error is None and not rows), (rows, error)

    check()
    return None


@case
def copy_many_out_of_bounds():
    return _segment_copy_many([(0, 0, 0, 12, 8)])


@case
def copy_many_buffer_index_out_of_range():
    return _segment_copy_many([(1, 0, 0, 0, 4)])


@case
def copy_many_float_rows():
    return _segment_copy_many([(0, 0, 0.5, 0, 4)])


def _to_address(address, nbytes=16, rows=((0, 0, 0, 0, 8),)):
    from jax_amem.copy import segment_copy_to_addresses

    src, _ = _copy_src_dst()
    return attempt(lambda: np.asarray(segment_copy_to_addresses([src], [address], [nbytes], list(rows))))


@case
def copy_to_address_0x1000():
    return _to_address(0x1000)


@case
def copy_to_address_negative():
    return _to_address(-8)


@case
def copy_to_address_rows_past_the_size():
    target = np.zeros(16, np.uint8)
    error = _to_address(target.ctypes.data, 16, [(0, 0, 0, 12, 8)])
    assert not target.any()
    return error


@case
def copy_to_address_float_address():
    target = np.zeros(16, np.uint8)
    return _to_address(float(target.ctypes.data))


@case
def copy_to_address_past_the_allocation_cuda():
    """On CUDA: rows that end past the device allocation holding the address (a destination size
    larger than the tensor's memory) are refused; the bytes after the buffer stay as they were."""
    jax, jnp = _jax()
    from jax_amem.copy import segment_copy_to_addresses

    gpu = jax.devices("gpu")[0]
    src = jax.device_put(jnp.arange(64, dtype=jnp.uint8), gpu)
    target = jax.device_put(jnp.zeros(1 << 20, jnp.uint8), gpu)
    address = target.unsafe_buffer_pointer()
    size = 1 << 40  # far past any allocation
    return attempt(lambda: np.asarray(segment_copy_to_addresses([src], [address], [size],
                                                                [(0, 0, 0, size - 64, 64)])))


# ----------------------------------------------------------------------------- plan


@case
def plan_rules_not_rules():
    import jax_amem

    _, jnp = _jax()
    return attempt(lambda: jax_amem.plan({"w": jnp.ones(4)}, {"w": jnp.ones(4)}, ["hello"]))


@case
def plan_bytes_overflow_int64():
    import jax_amem
    from jax_amem import Layout, Owner

    owner = Owner(0, 0)
    huge = Layout.single((2**61, 8), np.float32, owner)
    return attempt(lambda: jax_amem.plan({"w": huge}, {"w": huge}))


@case
def plan_shape_mismatch():
    import jax_amem

    _, jnp = _jax()
    return attempt(lambda: jax_amem.plan({"w": jnp.ones(4)}, {"w": jnp.ones(5)}))


# ----------------------------------------------------------------------------- pause / resume


@case
def pause_resume_without_pause():
    import jax_amem

    return attempt(jax_amem.resume)


@case
def pause_twice():
    import jax_amem

    _, jnp = _jax()
    x = jnp.arange(8.0)
    jax_amem.pause(keep={"x": x})
    try:
        return attempt(lambda: jax_amem.pause(keep={"y": jnp.ones(2)}))
    finally:
        back = jax_amem.resume()
        assert np.array_equal(np.asarray(back.keep["x"]), np.arange(8.0))


@case
def pause_keep_not_arrays():
    import jax_amem

    error = attempt(lambda: jax_amem.pause(keep={"x": "not an array"}))
    assert not jax_amem.is_paused()
    return error


@case
def pause_nccl_flag_is_a_string():
    """nccl="no" is a true string: it paused NCCL (collectively) where the caller meant not to."""
    import jax_amem

    _, jnp = _jax()
    x = jnp.arange(8.0)
    error = attempt(lambda: jax_amem.pause(keep={"x": x}, nccl="no"))
    assert not jax_amem.is_paused() and not x.is_deleted()
    return error


@case
def pause_with_jax_on_cpu():
    """Succeeds: pause, paused(), resume() and the report with JAX on its CPU platform (on a GPU
    host these were killed by SIGSEGV)."""
    import jax_amem

    _, jnp = _jax()
    x = jnp.arange(1024.0)
    jax_amem.pause(keep={"x": x})
    str(jax_amem.memory_report())
    back = jax_amem.resume()
    with jax_amem.paused(keep=back.keep) as p:
        str(jax_amem.memory_report())
    assert np.array_equal(np.asarray(p.keep["x"]), np.arange(1024.0))
    return None


# ----------------------------------------------------------------------------- nccl (a fake NCCL in the child)


def _nccl_with_one_communicator():
    import ctypes

    from jax_amem import nccl

    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]

    lib = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD)
    uid = UniqueId()
    uid.internal = b"hostile"
    comm = ctypes.c_void_p()
    assert lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
    (row,) = nccl.communicators()
    return nccl, row.id


def _nccl_ids(transform):
    nccl, cid = _nccl_with_one_communicator()
    error = attempt(lambda: nccl.pause(ids=transform(cid), agree=False) if "agree" in nccl.pause.__code__.co_varnames
                    else nccl.pause(ids=transform(cid)))
    states = [c.state for c in nccl.communicators()]
    assert states == ["active"], f"a refused pause changed the communicators: {states}"
    return error


@case
def nccl_ids_twice():
    return _nccl_ids(lambda cid: [cid, cid])


@case
def nccl_ids_negative():
    return _nccl_ids(lambda cid: [-cid])


@case
def nccl_ids_past_2_to_the_64():
    return _nccl_ids(lambda cid: [2**64 + cid])


@case
def nccl_paused_with_no_communicators():
    from jax_amem import nccl

    def run():
        with nccl.paused():
            pass
    return attempt(run)


# ----------------------------------------------------------------------------- IPC descriptors


def _descriptor(**changes):
    entry = {"handle": os.urandom(64).hex(), "offset": 0, "nbytes": 24, "allocation_bytes": 512, "shape": [2, 3],
             "dtype": "float32", "device": 0, "pci_bus_id": "0000:00:00.0", **changes}
    return {"format": 1, "host": socket.gethostname(), "pid": os.getppid(), "tensors": {"w": entry}}


def _parse(**changes):
    from jax_amem.swapping.same_host.ipc import parse_descriptor

    return attempt(lambda: parse_descriptor(_descriptor(**changes)))


@case
def ipc_shape_none():
    return _parse(shape=None)


@case
def ipc_allocation_bytes_lots():
    return _parse(allocation_bytes="lots")


@case
def ipc_bytes_outside_the_allocation():
    return _parse(offset=500)


@case
def ipc_not_a_descriptor():
    from jax_amem.swapping.same_host.ipc import parse_descriptor

    return attempt(lambda: parse_descriptor(["tensors"]))


# ----------------------------------------------------------------------------- issue 24: newer surfaces


@case
def to_torch_writes_are_refused_before_any_byte():
    """A write into a to_torch view changed the immutable jax.Array. Every PyTorch way of
    writing in place is now refused (ReadOnlyViewError) with the array's bytes as they were;
    copies (.clone(), v + 1) stay ordinary tensors."""
    import jax_amem
    import torch
    import torch.nn.functional as F

    jax, _ = _jax()
    writes = {
        "add_": lambda t: t.add_(1), "setitem": lambda t: t.__setitem__(0, 5.0),
        "out=": lambda t: torch.add(t, 1, out=t), "copy_": lambda t: t.copy_(torch.ones(6)),
        "view then add_": lambda t: t.view(2, 3).add_(1), "slice fill_": lambda t: t[1:].fill_(7),
        "detach then add_": lambda t: t.detach().add_(1), "+=": lambda t: t.__iadd__(1),
        "split then mul_": lambda t: t.split(2)[1].mul_(3), "relu inplace": lambda t: F.relu(t, inplace=True),
        "nn.init.zeros_": lambda t: torch.nn.init.zeros_(t), "out= of another op": lambda t: torch.mul(
            torch.ones(6), 2, out=t), "under inference_mode": lambda t: _in_inference_mode(t.add_, 1),
        "under no_grad": lambda t: _under(torch.no_grad(), t.sub_, 1),
    }
    errors = []
    for name, write in writes.items():
        x = jax.device_put(np.arange(6.0, dtype=np.float32) - 2)
        view = jax_amem.to_torch({"w": x})["w"][0].tensor
        error = attempt(lambda: write(view))
        assert np.array_equal(np.asarray(x), np.arange(6.0, dtype=np.float32) - 2), f"{name} wrote the jax.Array"
        assert type(error).__name__ == "ReadOnlyViewError", f"{name}: {error!r}"
        errors.append(error)
    x = jax.device_put(np.arange(6.0, dtype=np.float32))
    view = jax_amem.to_torch({"w": x})["w"][0].tensor
    if not view.is_cuda:
        numpy_view = view.numpy()
        assert not numpy_view.flags.writeable and attempt(lambda: numpy_view.__setitem__(0, 9)) is not None
    import copy
    import io
    import pickle

    saved = io.BytesIO()
    torch.save(view, saved)
    saved.seek(0)
    # Copies are memory of their own: ordinary tensors a caller may write.
    for mine in (view.clone(), copy.deepcopy(view), pickle.loads(pickle.dumps(view)), torch.load(saved)):
        mine.add_(1)
        assert type(mine) is torch.Tensor and torch.equal(mine.cpu(), torch.arange(6.0) + 1), mine
    assert type(view + 1) is torch.Tensor and float(view.sum()) == 15.0
    assert np.array_equal(np.asarray(x), np.arange(6.0))
    return errors[0]


def _under(context, call, *args):
    with context:
        return call(*args)


def _in_inference_mode(call, *args):
    import torch

    return _under(torch.inference_mode(), call, *args)


@case
def to_torch_inference_mode_alone_writes_then_refuses():
    """Why the views are not torch.inference_mode() tensors: PyTorch checks an inference tensor
    after the kernel ran, so add_ writes the jax.Array's bytes and only then raises."""
    import torch

    jax, _ = _jax()
    x = jax.device_put(np.zeros(4, np.float32))
    with torch.inference_mode():
        view = torch.from_dlpack(x)
    error = attempt(lambda: view.add_(1))
    assert isinstance(error, RuntimeError) and "Inplace update to inference tensor" in str(error), error
    assert np.array_equal(np.asarray(x), np.ones(4)), "PyTorch now refuses before writing: see read_only_view.py"
# ----------------------------------------------------------------------------- presets and from_function
# (issues 23 and 24: preset options and tree layouts refused at preset(), from_function outputs)


def _maxtext_llama(scan_axis=1, layers=2, d=16, heads=4, kv=2, hd=4, f=24, vocab=32, qk_norm=False):
    """A MaxText Llama tree, every layer tensor stacked on `scan_axis` (MaxText's param_scan_axis);
    `qk_norm`: with Qwen3's query and key norms (a Qwen3 tree)."""
    from jax_amem.reshard import names_tree

    def stacked(*shape):
        return np.moveaxis(np.ones((layers, *shape), np.float32), 0, scan_axis)
    a, m = "decoder/layers/self_attention/", "decoder/layers/mlp/"
    norms = {a + "query_norm/scale": stacked(hd), a + "key_norm/scale": stacked(hd)} if qk_norm else {}
    return names_tree({a + "query/kernel": stacked(d, heads, hd), a + "key/kernel": stacked(d, kv, hd),
                       a + "value/kernel": stacked(d, kv, hd), a + "out/kernel": stacked(heads, hd, d), **norms,
                       "decoder/layers/pre_self_attention_layer_norm/scale": stacked(d),
                       "decoder/layers/post_self_attention_layer_norm/scale": stacked(d),
                       m + "wi_0/kernel": stacked(d, f), m + "wi_1/kernel": stacked(d, f), m + "wo/kernel": stacked(f, d),
                       "token_embedder/embedding": np.ones((vocab, d), np.float32),
                       "decoder/decoder_norm/scale": np.ones((d,), np.float32),
                       "decoder/logits_dense/kernel": np.ones((d, vocab), np.float32)})


def _preset(family="llama", tree=None, **options):
    from jax_amem import rules

    options.setdefault("source", "maxtext")
    return attempt(lambda: rules.preset(family, _maxtext_llama() if tree is None else tree, **options))


@case
def preset_tp_3_for_4_query_heads():
    return _preset(layout="vllm", tp=3)


@case
def preset_tp_zero():
    return _preset(layout="vllm", tp=0)


@case
def preset_tp_negative():
    return _preset(layout="vllm", tp=-2)


@case
def preset_tp_a_string():
    return _preset(layout="vllm", tp="2")


@case
def preset_tp_with_the_hf_layout():
    return _preset(layout="hf", tp=3)


@case
def preset_qwen3_layers_on_axis_1():
    """MaxText's default layout: the preset plans 2 layers (it read d_model=16 as the count before)."""
    from jax_amem import rules

    got = rules.qwen3(_maxtext_llama(scan_axis=1, qk_norm=True), source="maxtext")
    layers = {r.dst.split(".")[2] for r in got if r.dst.startswith("model.layers.")}
    assert layers == {"0", "1"}, layers
    return None


@case
def to_torch_names_collide():
    """to_torch refused colliding names with LayoutError, its other refusals with SwapError."""
    import jax_amem

    _, jnp = _jax()
    return attempt(lambda: jax_amem.to_torch({"a/b": jnp.ones(2), "a": {"b": jnp.ones(2)}}))


def _int_and_str_keys():
    _, jnp = _jax()
    return {0: jnp.ones(2), "0": jnp.full(2, 2.0)}


@case
def swap_source_keys_0_and_str_0():
    """A source tree with keys 0 and '0': JAX's raw "Comparator raised exception while sorting"."""
    import torch

    return _torch_swap({"0": torch.zeros(2)}, _int_and_str_keys())


@case
def swap_source_keys_0_and_str_0_after_a_swap():
    """The same after a good swap (the repeat path flattens the source first)."""
    import jax_amem
    import torch

    _, jnp = _jax()
    dst = {"0": torch.zeros(2)}
    jax_amem.swap({"0": jnp.ones(2)}, dst)
    jax_amem.swap({"0": jnp.ones(2)}, dst)
    return _torch_swap(dst, _int_and_str_keys())


@case
def plan_keys_0_and_str_0():
    import jax_amem

    keys = _int_and_str_keys()
    return attempt(lambda: jax_amem.plan(keys, keys))


@case
def pause_keep_keys_0_and_str_0():
    import jax_amem

    keep = _int_and_str_keys()
    error = attempt(lambda: jax_amem.pause(keep=keep))
    assert not jax_amem.is_paused() and not any(x.is_deleted() for x in keep.values())
    return error


@case
def to_torch_keys_0_and_str_0():
    import jax_amem

    return attempt(lambda: jax_amem.to_torch(_int_and_str_keys()))


@case
def plan_sources_not_a_tree_of_arrays():
    """plan(sources=a string): a raw TypeError, outside the family."""
    import jax_amem

    _, jnp = _jax()
    return attempt(lambda: jax_amem.plan("weights", {"w": jnp.ones(4)}))


@case
def plan_split_bytes_a_string():
    import jax_amem

    _, jnp = _jax()
    return attempt(lambda: jax_amem.plan({"w": jnp.ones(4)}, {"w": jnp.ones(4)}, split_bytes="1MB"))


@case
def plan_owner_not_a_pair():
    import jax_amem

    _, jnp = _jax()
    return attempt(lambda: jax_amem.plan({"w": jnp.ones(4)}, {"w": jnp.ones(4)}, owner=3))


@case
def errors_one_family():
    """RuleError, TraceError, LayoutError, PlanError were ValueErrors outside JaxAmemError; an NCCL
    failure inside pause() was no PauseError."""
    import jax_amem
    from jax_amem.nccl import NcclPauseError
    from jax_amem.reshard import LayoutError, PlanError, RuleError
    from jax_amem.reshard.rules import TraceError

    outside = [e.__name__ for e in (RuleError, TraceError, LayoutError, PlanError, NcclPauseError)
               if not issubclass(e, jax_amem.JaxAmemError)]
    assert not outside, f"outside the family: {outside}"
    assert issubclass(NcclPauseError, jax_amem.PauseError)
    assert all(issubclass(e, ValueError) for e in (RuleError, TraceError, LayoutError, PlanError))
    return None


@case
def old_layout_segment_copy():
    """jax_amem.segment_copy (moved to jax_amem.copy): a bare AttributeError before."""
    import jax_amem

    return attempt(lambda: jax_amem.segment_copy)


@case
def old_layout_swap_package():
    """`from jax_amem.swap import to_torch`: "No module named 'jax_amem.swap'" before."""
    def old():
        from jax_amem.swap import to_torch  # noqa: F401
    return attempt(old)


def _demo(argv):
    """The demo's command line up to the run: the run itself must not start (a run here would take
    minutes and lose its figures at the end)."""
    from jax_amem import __main__ as cli
    from jax_amem.demo import cli as demo_cli

    def started(*_args, **_kwargs):
        raise AssertionError(f"demo {' '.join(map(repr, argv))} started the run instead of refusing")
    demo_cli.main_real_size = started
    import jax_amem.demo.loop as loop
    loop.run = started
    try:
        cli.main(["demo", "--no-progress", *argv])
    except SystemExit as error:
        return error
    return None


@case
def demo_json_empty_path():
    """`demo --json ''` (an unset shell variable) ran and wrote no figures, and said nothing."""
    error = _demo(["--preset", "qwen3-tiny", "--json", ""])
    assert error is not None and error.code not in (0, None)
    return error


@case
def demo_json_a_directory():
    """`demo --json <folder>` passed the check; the run then ended in IsADirectoryError."""
    import tempfile

    folder = tempfile.mkdtemp()
    error = _demo(["--preset", "qwen3-tiny", "--json", folder])
    assert error is not None and error.code not in (0, None)
    return error


@case
def demo_rollout_where_jax_can_write():
    """JAX on its CPU platform where PyTorch sees CUDA (JAX_PLATFORMS=cpu on a GPU host): the
    rollout went to cuda:0, which JAX cannot write. It must go where the trainer's JAX can.
    (PyTorch's CUDA answer is set here: this host may have no GPU; on one, gpu_demo_* runs it.)"""
    import torch

    from jax_amem.demo import rollout

    jax, _ = _jax()
    assert jax.devices()[0].platform == "cpu"
    torch.cuda.is_available = lambda: True
    device = rollout.torch_device()
    assert device.type == "cpu", f"the rollout goes to {device} while JAX runs on its CPU"
    return None


@case
def gpu_demo_qwen3_tiny_with_jax_on_cpu():
    """On a GPU host with JAX_PLATFORMS=cpu: the whole qwen3-tiny demo runs (it died with a SwapError)."""
    import subprocess

    done = subprocess.run([sys.executable, "-P", "-m", "jax_amem", "demo", "--preset", "qwen3-tiny", "--iterations",
                           "1", "--no-progress"], capture_output=True, text=True, timeout=540,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert " on cpu, first swap" in done.stdout, done.stdout[-2000:]
    return None


@case
def nccl_pause_whose_destroy_fails():
    """A teardown that fails: the pause's error only said "ncclCommDestroy failed", then resume()
    said "nothing to resume". It must name the broken communicator and recover()."""
    nccl, cid = _nccl_with_one_communicator()
    os.environ["FAKE_FAIL_DESTROY"] = "1"
    try:
        error = attempt(lambda: nccl.pause("recreate", teardown="destroy", agree=False))
    finally:
        del os.environ["FAKE_FAIL_DESTROY"]
    assert [c.state for c in nccl.communicators()] == ["broken"]
    assert f"id {cid}" in str(error), str(error)
    assert [c.state for c in nccl.recover()] == ["active"]
    return error


@case
def nccl_process_pause_whose_destroy_fails():
    """The same through jax_amem.pause(): a PauseError (as its docstring says), arrays intact."""
    import jax_amem

    _nccl_with_one_communicator()
    _, jnp = _jax()
    x = jnp.arange(8.0)
    os.environ["FAKE_FAIL_DESTROY"] = "1"
    try:
        error = attempt(lambda: jax_amem.pause(keep={"x": x}))
    finally:
        del os.environ["FAKE_FAIL_DESTROY"]
    assert not jax_amem.is_paused() and not x.is_deleted()
    assert np.array_equal(np.asarray(x), np.arange(8.0))
    return error


@case
def preset_layer_axis_not_found():
    tree = _maxtext_llama(scan_axis=1, qk_norm=True)
    tree["decoder"]["layers"]["mlp"]["wo"]["kernel"] = np.ones((24, 3, 16), np.float32)
    return _preset("qwen3", tree)


@case
def preset_llama_maxtext_query_scaling():
    """MaxText's Llama exporter scales the query kernel (x.astype(float32) * float32(sqrt(8)),
    cast back to bfloat16) before its RoPE reorder and reshape: the preset does it in the copy.
    Zeros of both signs, infinities, NaN, values that overflow to infinity once scaled and the
    smallest normals come out as the exporter's bits (subnormals are flushed on the CPU, as
    XLA:CPU flushes them: docs/reshard.md)."""
    import jax
    import ml_dtypes
    import torch

    import jax_amem
    from jax_amem import rules

    tree = _maxtext_llama(heads=2, kv=1, hd=8)
    query = tree["decoder"]["layers"]["self_attention"]["query"]
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1.2e-38, 1.5, -2.0, 1e38], np.float32)
    query["kernel"] = np.resize(edges, query["kernel"].shape).astype(ml_dtypes.bfloat16)
    tree = jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16), tree)
    name = "model.layers.1.self_attn.q_proj.weight"
    pieces = [p for p in rules.llama(tree, source="maxtext") if getattr(p, "dst", None) == name]
    destination = {name: torch.zeros(16, 16, dtype=torch.bfloat16)}
    jax_amem.swap(jax.device_put(tree), destination, rules=pieces)
    x = query["kernel"][:, 1]                                      # layer 1 (layers on axis 1)
    with np.errstate(over="ignore"):
        x = (x.astype(np.float32) * np.float32(np.sqrt(8))).astype(x.dtype)
    x = np.concatenate((x[..., ::2], x[..., 1::2]), axis=-1).reshape(16, 16).T
    got = destination[name].view(torch.int16).numpy()
    assert np.array_equal(got, x.view(np.int16)), (got, x.view(np.int16))
    assert np.isinf(x.astype(np.float32)).sum() > np.isinf(query["kernel"][:, 1].astype(np.float32)).sum()
    return None


@case
def preset_llama_maxtext_integer_queries():
    """An integer query kernel cannot be scaled in the copy: refused at preset(), naming it."""
    tree = _maxtext_llama()
    query = tree["decoder"]["layers"]["self_attention"]["query"]
    query["kernel"] = query["kernel"].astype(np.int32)
    return _preset(tree=tree)


@case
def preset_gemma2_maxtext_norm_offsets():
    return _preset("gemma2", _maxtext_llama())


@case
def from_function_returns_a_bare_array():
    from jax_amem import rules

    return attempt(lambda: rules.from_function(lambda p: p["w"].T, {"w": np.ones((2, 3), np.float32)}))


@case
def from_function_returns_a_list():
    from jax_amem import rules

    return attempt(lambda: rules.from_function(lambda p: [p["w"], p["w"]], {"w": np.ones((2, 3), np.float32)}))


@case
def vllm_connect_bad_arguments():
    """jax_amem.vllm.connect refuses what is not an engine set up for it, and a tree with both or
    neither of family= and rules=, before anything reaches vLLM: each a family error."""
    from types import SimpleNamespace

    import jax_amem
    from jax_amem import vllm

    def llm(backend):
        config = SimpleNamespace(weight_transfer_config=None if backend is None else SimpleNamespace(backend=backend))
        return SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=config))

    params = {"w": np.zeros((2, 2), np.float32)}
    calls = {"not an LLM": lambda: vllm.connect("an LLM", params, family="llama"),
             "None": lambda: vllm.connect(None, params, family="llama"),
             "no backend": lambda: vllm.connect(llm(None), params, family="llama"),
             "another backend": lambda: vllm.connect(llm("nccl"), params, family="llama"),
             "neither": lambda: vllm.connect(llm("jax_amem"), params),
             "both": lambda: vllm.connect(llm("jax_amem"), params, family="llama", rules=[])}
    errors = {name: attempt(call) for name, call in calls.items()}
    kinds = {name: type(error).__name__ for name, error in errors.items()}
    assert all(isinstance(e, jax_amem.JaxAmemError) for e in errors.values()), kinds
    assert kinds == {"not an LLM": "VllmBackendError", "None": "VllmBackendError", "no backend": "VllmBackendError",
                     "another backend": "VllmBackendError", "neither": "VllmPlanError", "both": "VllmPlanError"}, kinds
    assert "connect takes a vllm.LLM, not str" in str(errors["not an LLM"])
    return errors["both"]


# ----------------------------------------------------------------------------- the child's main


def describe(error) -> dict:
    if error is None:
        return {"error": None, "classes": [], "message": ""}
    return {"error": type(error).__name__, "classes": [c.__name__ for c in type(error).__mro__],
            "message": str(error)}


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run with -P: this folder is not on the path
from generated import GENERATED  # noqa: E402 - hypothesis over trees, names, rules and layouts
from every_verb import every_public_verb_raises_only_family_errors  # noqa: E402 - the sweep of docs/api.md

CASES.update(GENERATED)
CASES["every_public_verb_raises_only_family_errors"] = every_public_verb_raises_only_family_errors


def main(names) -> int:
    import jax_amem  # noqa: F401 - first, as users do

    for name in names:
        try:
            line = {"case": name, **describe(CASES[name]())}
        except BaseException:  # noqa: BLE001 - a case's own assertion, or an error it did not expect
            line = {"case": name, "failed": traceback.format_exc()[-3000:]}
        print("CASE " + json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
