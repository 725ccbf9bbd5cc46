"""The batched copy between many buffers (one custom call, one CUDA launch): against numpy."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem.copy import MAX_BUFFERS_PER_SIDE, prepare_buffer_segments, segment_copy_many


def numpy_oracle(srcs, dsts, rows):
    outs = [d.copy() for d in dsts]
    for src_index, dst_index, src_offset, dst_offset, nbytes in rows:
        source = srcs[src_index].reshape(-1).view(np.uint8)
        target = outs[dst_index].reshape(-1).view(np.uint8)
        target[dst_offset:dst_offset + nbytes] = source[src_offset:src_offset + nbytes]
    return outs


@st.composite
def many_rows(draw, src_sizes, dst_sizes):
    rows = []
    for dst_index, size in enumerate(dst_sizes):
        cuts = sorted(draw(st.lists(st.integers(0, size), max_size=6, unique=True)))
        bounds = [0] + cuts + [size]
        for start, stop in zip(bounds[:-1], bounds[1:]):
            src_index = draw(st.integers(0, len(src_sizes) - 1))
            length = stop - start
            if length == 0 or length > src_sizes[src_index] or not draw(st.booleans()):
                continue
            rows.append((src_index, dst_index, draw(st.integers(0, src_sizes[src_index] - length)),
                         start, length))
    return draw(st.permutations(rows))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), src_sizes=st.lists(st.integers(1, 200), min_size=1, max_size=4),
       dst_sizes=st.lists(st.integers(1, 200), min_size=1, max_size=4))
def test_matches_numpy_for_random_rows_between_random_buffers(data, src_sizes, dst_sizes):
    rng = np.random.default_rng(sum(src_sizes) * 7 + sum(dst_sizes))
    srcs = [rng.integers(0, 256, n, dtype=np.uint8) for n in src_sizes]
    dsts = [rng.integers(0, 256, n, dtype=np.uint8) for n in dst_sizes]
    rows = data.draw(many_rows(src_sizes, dst_sizes))
    got = segment_copy_many([jnp.asarray(s) for s in srcs], [jnp.asarray(d) for d in dsts], rows)
    for g, want in zip(got, numpy_oracle(srcs, dsts, rows)):
        np.testing.assert_array_equal(np.asarray(g), want)


def test_mixed_dtypes_inside_jit_with_donation():
    a = jnp.arange(12, dtype=jnp.float32)
    b = jnp.arange(6, dtype=jnp.int16)
    x = jnp.full((2, 3), -1, jnp.float32)
    y = jnp.zeros(4, jnp.int16)
    rows = [(0, 0, 4, 0, 8), (1, 0, 0, 8, 4), (0, 1, 44, 0, 4), (1, 1, 10, 6, 2)]
    want = numpy_oracle([np.asarray(a), np.asarray(b)], [np.asarray(x), np.asarray(y)], rows)
    step = jax.jit(lambda a, b, x, y: segment_copy_many([a, b], [x, y], rows), donate_argnums=(2, 3))
    for g, w in zip(step(a, b, x, y), want):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), w.view(np.uint8))


def test_long_rows_are_split_and_copied_whole():
    n = 2 * jax_amem.copy.MAX_PIECE_BYTES + 24
    table = prepare_buffer_segments([(0, 0, 0, 0, n)], [n], [n])
    assert table.shape == (3, 6) and table[:, 4].sum() == n and (table[:, :2] == 0).all()
    src = np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8)
    (got,) = segment_copy_many([jnp.asarray(src)], [jnp.zeros(n, jnp.uint8)], [(0, 0, 0, 0, n)])
    np.testing.assert_array_equal(np.asarray(got), src)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([(0, 2, 0, 0, 4)], r"segment 0 .*buffer index out of range \(1 sources, 2 destinations\)"),
        ([(1, 0, 0, 0, 4)], r"buffer index out of range"),
        ([(0, 0, 60, 0, 8)], r"reads outside source buffer 0 of 64 bytes"),
        ([(0, 1, 0, 14, 4)], r"writes outside destination buffer 1 of 16 bytes"),
        ([(0, 0, 0, 0, 0)], r"bytes must be positive"),
        ([(0, 1, 0, 0, 8), (0, 1, 8, 4, 8)], r"write overlapping destination bytes"),
        ([(0, 0, 0, 0, 4, 1)], r"sixth column must be 0"),
    ],
)
def test_bad_rows_name_the_row_and_leave_destinations_untouched(rows, message):
    src = jnp.arange(64, dtype=jnp.uint8)
    dsts = [jnp.full(32, 7, jnp.uint8), jnp.full(16, 9, jnp.uint8)]
    with pytest.raises(ValueError, match=message):
        segment_copy_many([src], dsts, rows)
    np.testing.assert_array_equal(np.asarray(dsts[0]), np.full(32, 7))
    np.testing.assert_array_equal(np.asarray(dsts[1]), np.full(16, 9))


def test_rows_to_the_same_destination_may_come_from_different_sources():
    # Overlap is judged per destination buffer: the same offsets in two destinations are fine.
    rows = [(0, 0, 0, 0, 4), (1, 1, 0, 0, 4)]
    a, b = jnp.arange(4, dtype=jnp.uint8), jnp.arange(10, 14, dtype=jnp.uint8)
    x, y = segment_copy_many([a, b], [jnp.zeros(4, jnp.uint8), jnp.zeros(4, jnp.uint8)], rows)
    assert np.asarray(x).tolist() == [0, 1, 2, 3] and np.asarray(y).tolist() == [10, 11, 12, 13]


def test_too_many_buffers_is_refused_with_the_fix():
    sizes = [1] * (MAX_BUFFERS_PER_SIDE + 1)
    with pytest.raises(ValueError, match=f"at most {MAX_BUFFERS_PER_SIDE} .* split it"):
        prepare_buffer_segments(np.zeros((0, 6), np.int64), sizes, [1])


@pytest.mark.gpu
def test_gpu_matches_cpu_inside_jit():
    gpu, cpu = jax.devices("cuda")[0], jax.devices("cpu")[0]
    rng = np.random.default_rng(5)
    srcs = [rng.integers(0, 2**31, n, dtype=np.int32) for n in (1 << 20, 3001, 17)]
    dsts = [rng.integers(0, 2**31, n, dtype=np.int32) for n in (1 << 19, 5000)]
    rows = [(0, 0, 0, 0, 2 << 20), (1, 1, 4, 0, 12000 - 4), (2, 1, 3, 12000 - 4, 4),
            (0, 1, (1 << 22) - 4000, 12000, 3000)]
    step = jax.jit(lambda s, d: segment_copy_many(s, d, rows), donate_argnums=1)
    on_gpu = step([jax.device_put(s, gpu) for s in srcs], [jax.device_put(d, gpu) for d in dsts])
    on_cpu = step([jax.device_put(s, cpu) for s in srcs], [jax.device_put(d, cpu) for d in dsts])
    for g, c, want in zip(on_gpu, on_cpu, numpy_oracle(srcs, dsts, rows)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(c))
        np.testing.assert_array_equal(np.asarray(g), want)
