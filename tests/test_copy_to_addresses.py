"""The copy into memory XLA does not own, by address (segment_copy_to_addresses): against
numpy, into PyTorch tensors and numpy buffers; long rows (bulk, one driver copy each on CUDA)
and short rows give the same bytes; every bad input refused before a byte moves."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jax
import jax.numpy as jnp

from jax_amem import copy as amem_copy
from jax_amem.copy import MAX_BUFFERS_PER_SIDE, segment_copy_to_addresses

from test_segment_copy_many import many_rows, numpy_oracle


def address(buffer: np.ndarray) -> int:
    return buffer.ctypes.data


def run(srcs, dsts, rows, **kwargs):
    token = segment_copy_to_addresses([jnp.asarray(s) for s in srcs], [address(d) for d in dsts],
                                      [d.nbytes for d in dsts], rows, **kwargs)
    jax.block_until_ready(token)
    return token


@settings(max_examples=40, deadline=None)
@given(data=st.data(), src_sizes=st.lists(st.integers(1, 200), min_size=1, max_size=4),
       dst_sizes=st.lists(st.integers(1, 200), min_size=1, max_size=4), bulk=st.sampled_from([1, 16, 64, 1 << 20]))
def test_matches_numpy_for_random_rows_whatever_is_bulk(data, src_sizes, dst_sizes, bulk):
    rng = np.random.default_rng(sum(src_sizes) * 7 + sum(dst_sizes))
    srcs = [rng.integers(0, 256, n, dtype=np.uint8) for n in src_sizes]
    dsts = [rng.integers(0, 256, n, dtype=np.uint8) for n in dst_sizes]
    rows = data.draw(many_rows(src_sizes, dst_sizes))
    want = numpy_oracle(srcs, dsts, rows)
    run(srcs, dsts, rows, bulk_bytes=bulk)
    for got, expected in zip(dsts, want):
        np.testing.assert_array_equal(got, expected)


def test_bulk_rows_stay_whole_and_the_others_are_split_into_pieces():
    prepare = amem_copy.core.copy.prepare_address_rows
    rows = np.array([[0, 0, 0, 0, 8, 0], [0, 1, 8, 0, 3, 0], [1, 0, 0, 8, 16, 0]], np.int64)
    bulk, pieces = prepare(rows, [16, 16], [24, 3], 8, 16)
    assert bulk.tolist() == [[0, 0, 0, 0, 8, 0], [1, 0, 0, 8, 16, 0]] and pieces.tolist() == [[0, 1, 8, 0, 3, 0]]
    bulk, pieces = prepare(np.array([[0, 0, 0, 0, 40, 0]], np.int64), [40], [40], 64, 16)
    assert bulk.shape == (0, 6)
    assert pieces.tolist() == [[0, 0, 0, 0, 16, 0], [0, 0, 16, 16, 16, 0], [0, 0, 32, 32, 8, 0]]


@settings(max_examples=40, deadline=None)
@given(data=st.data(), src_sizes=st.lists(st.integers(1, 200), min_size=1, max_size=4),
       dst_sizes=st.lists(st.integers(1, 200), min_size=1, max_size=4), piece=st.sampled_from([16, 32, 1 << 20]),
       bulk_bytes=st.sampled_from([1, 16, 64, 1 << 20]))
def test_the_rows_of_a_copy_by_address_are_the_rows_preparing_them_gives(data, src_sizes, dst_sizes, piece,
                                                                          bulk_bytes):
    """Bulk: the validated rows of at least bulk_bytes, whole, in order; pieces: the others as
    prepare_buffer_segments splits them."""
    rows = amem_copy.prepare_buffer_segments(data.draw(many_rows(src_sizes, dst_sizes)), src_sizes, dst_sizes,
                                             max_piece=1 << 62)
    bulk, pieces = amem_copy.core.copy.prepare_address_rows(rows, src_sizes, dst_sizes, bulk_bytes, piece)
    long = rows[:, 4] >= bulk_bytes
    np.testing.assert_array_equal(bulk.reshape(-1, 6), rows[long])
    np.testing.assert_array_equal(pieces.reshape(-1, 6),
                                  amem_copy.prepare_buffer_segments(rows[~long], src_sizes, dst_sizes, piece))


def test_the_rows_are_validated_once_per_call(monkeypatch):
    """One native call validates the rows as one table and splits them (bulk whole, the others
    into pieces); nothing validates them again."""
    calls = []
    prepare, validate = amem_copy.core.copy.prepare_address_rows, amem_copy.core.copy.prepare_buffer_segments
    monkeypatch.setattr(amem_copy.core.copy, "prepare_address_rows",
                        lambda *a, **k: calls.append("address rows") or prepare(*a, **k))
    monkeypatch.setattr(amem_copy.core.copy, "prepare_buffer_segments",
                        lambda *a, **k: calls.append("buffer segments") or validate(*a, **k))
    src, dst = np.arange(64, dtype=np.uint8), np.zeros(64, np.uint8)
    run([src], [dst], [(0, 0, 0, 0, 40), (0, 0, 40, 40, 24)], bulk_bytes=32)
    np.testing.assert_array_equal(dst, src)
    assert calls == ["address rows"]


def test_into_torch_tensors_inside_jit_many_dtypes():
    torch = pytest.importorskip("torch")
    a = jnp.arange(12, dtype=jnp.float32)
    b = jnp.arange(6, dtype=jnp.int16)
    x = torch.full((2, 3), -1.0)
    y = torch.zeros(4, dtype=torch.int16)
    rows = [(0, 0, 4, 0, 8), (1, 0, 0, 8, 4), (0, 1, 44, 0, 4), (1, 1, 10, 6, 2)]
    want = numpy_oracle([np.asarray(a), np.asarray(b)], [x.numpy().copy(), y.numpy().copy()], rows)
    step = jax.jit(lambda a, b: segment_copy_to_addresses([a, b], [x.data_ptr(), y.data_ptr()],
                                                          [x.nbytes, y.nbytes], rows))
    for _ in range(2):  # the second run writes the same bytes again
        jax.block_until_ready(step(a, b))
        assert x.numpy().tobytes() == want[0].tobytes() and y.numpy().tobytes() == want[1].tobytes()


def test_long_rows_are_one_bulk_copy_or_many_pieces_with_the_same_bytes():
    n = 2 * amem_copy.MAX_PIECE_BYTES + 24
    src = np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8)
    for bulk in (None, n, n + 1):  # default (BULK_BYTES > n: pieces), bulk at exactly n, pieces again
        dst = np.zeros(n, np.uint8)
        run([src], [dst], [(0, 0, 0, 0, n)], bulk_bytes=bulk)
        np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([(0, 2, 0, 0, 4)], r"segment 0 .*buffer index out of range \(1 sources, 2 destinations\)"),
        ([(0, 0, 60, 0, 8)], r"reads outside source buffer 0 of 64 bytes"),
        ([(0, 1, 0, 14, 4)], r"writes outside destination buffer 1 of 16 bytes"),
        ([(0, 0, 0, 0, 0)], r"bytes must be positive"),
        ([(0, 1, 0, 0, 8), (0, 1, 8, 4, 8)], r"write overlapping destination bytes"),
        ([(0, 1, 0, 0, 12), (0, 1, 0, 8, 8)], r"write overlapping destination bytes"),  # bulk and short
    ],
)
def test_bad_rows_name_the_row_and_leave_destinations_untouched(rows, message):
    src = np.arange(64, dtype=np.uint8)
    dsts = [np.full(32, 7, np.uint8), np.full(16, 9, np.uint8)]
    with pytest.raises(ValueError, match=message):
        run([src], dsts, rows, bulk_bytes=10)
    assert (dsts[0] == 7).all() and (dsts[1] == 9).all()


def test_bad_calls_are_refused_with_the_fix():
    src = jnp.zeros(8, jnp.uint8)
    with pytest.raises(ValueError, match="2 addresses but 1 destination sizes"):
        segment_copy_to_addresses([src], [1, 2], [8], [])
    with pytest.raises(ValueError, match="at least one source array"):
        segment_copy_to_addresses([], [1], [8], [])
    many = MAX_BUFFERS_PER_SIDE + 1
    with pytest.raises(ValueError, match=f"at most {MAX_BUFFERS_PER_SIDE} of each per call; split"):
        segment_copy_to_addresses([src], list(range(1, many + 1)), [8] * many, [])


@pytest.mark.gpu
def test_gpu_into_torch_cuda_tensors_bulk_and_kernel_rows():
    torch = pytest.importorskip("torch")
    gpu = jax.devices("cuda")[0]
    rng = np.random.default_rng(5)
    srcs = [rng.integers(0, 2**31, n, dtype=np.int32) for n in (3 << 20, 3001, 17)]
    dsts = [rng.integers(0, 2**31, n, dtype=np.int32) for n in (3 << 20, 5000)]
    # A 12 MiB row (bulk: one cuMemcpyAsync), rows of a few KiB and an unaligned one (kernel).
    rows = [(0, 0, 0, 0, 12 << 20), (1, 1, 4, 0, 12000 - 4), (2, 1, 3, 12000 - 4, 4),
            (0, 1, (12 << 20) - 4000, 12000, 3000)]
    want = numpy_oracle(srcs, dsts, rows)
    tensors = [torch.from_numpy(d).to(f"cuda:{gpu.local_hardware_id}") for d in dsts]
    step = jax.jit(lambda s: segment_copy_to_addresses(s, [t.data_ptr() for t in tensors],
                                                       [t.nbytes for t in tensors], rows))
    torch.cuda.synchronize()
    jax.block_until_ready(step([jax.device_put(s, gpu) for s in srcs]))
    for t, expected in zip(tensors, want):
        np.testing.assert_array_equal(t.cpu().numpy(), expected)


_FOREIGN_TABLE = r"""
import numpy as np, jax, jax.numpy as jnp, torch
from jax_amem import _ffi
_ffi.register_targets()
gpu = jax.devices("gpu")[0]
dst = torch.full((64,), 7.0, device=f"cuda:{gpu.local_hardware_id}")
src = jax.device_put(jnp.arange(64, dtype=jnp.float32), gpu)
# Rows (src, dst, src offset, dst offset, bytes, 0) naming a destination and a source the call
# lacks: a table not made by jax_amem.copy, which validates every table it builds.
rows = np.array([[0, 1, 0, 0, 256, 0], [3, 0, 0, 0, 256, 0]], np.int64).view(np.uint32)
call = jax.ffi.ffi_call(_ffi.SEGMENT_COPY_TO_ADDRESSES, jax.ShapeDtypeStruct((), np.uint8))
step = jax.jit(lambda s: call(jnp.asarray(rows), s, addresses=np.array([dst.data_ptr()], np.int64),
                              destination_bytes=np.array([256], np.int64), bulk=np.zeros(0, np.int64)))
torch.cuda.synchronize()
jax.block_until_ready(step(src))
torch.cuda.synchronize()
assert torch.equal(dst.cpu(), torch.full((64,), 7.0)), dst
print("RESULT ok", flush=True)
"""


@pytest.mark.gpu
def test_gpu_a_table_naming_buffers_the_call_lacks_is_skipped_not_a_fault():
    """The kernel gets the call's pointers by value, the slots past them zero: a row naming one
    of those slots is skipped instead of writing through a null pointer (an illegal address
    that kills the CUDA context). In a process of its own: before the fix it faulted."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    out = subprocess.run([sys.executable, "-P", "-c", _FOREIGN_TABLE], capture_output=True, text=True, env=env,
                         timeout=300)
    assert "RESULT ok" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
