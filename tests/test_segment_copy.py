"""The batched segment copy FFI target: against numpy on CPU, and on the GPU."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jax
import jax.numpy as jnp

import jax_amem


def numpy_oracle(src: np.ndarray, dst: np.ndarray, segments) -> np.ndarray:
    out = dst.copy()
    src_bytes = src.reshape(-1).view(np.uint8)
    out_bytes = out.reshape(-1).view(np.uint8)
    for src_offset, dst_offset, nbytes in segments:
        out_bytes[dst_offset:dst_offset + nbytes] = src_bytes[src_offset:src_offset + nbytes]
    return out


@st.composite
def disjoint_segments(draw, src_bytes, dst_bytes):
    """Random segments whose destinations do not overlap."""
    cuts = sorted(draw(st.lists(st.integers(0, dst_bytes), min_size=0, max_size=12, unique=True)))
    bounds = [0] + cuts + [dst_bytes]
    segments = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        length = stop - start
        if length == 0 or length > src_bytes or not draw(st.booleans()):
            continue
        src_offset = draw(st.integers(0, src_bytes - length))
        segments.append((src_offset, start, length))
    return draw(st.permutations(segments))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), src_len=st.integers(1, 300), dst_len=st.integers(1, 300))
def test_matches_numpy_for_random_segments(data, src_len, dst_len):
    rng = np.random.default_rng(src_len * 1000 + dst_len)
    src = rng.integers(0, 256, src_len, dtype=np.uint8)
    dst = rng.integers(0, 256, dst_len, dtype=np.uint8)
    segments = data.draw(disjoint_segments(src_len, dst_len))
    got = jax_amem.copy.segment_copy(jnp.asarray(src), jnp.asarray(dst), segments)
    np.testing.assert_array_equal(np.asarray(got), numpy_oracle(src, dst, segments))


def test_mixed_dtypes_and_shapes_inside_jit_with_donation():
    src = jnp.arange(24, dtype=jnp.float32).reshape(4, 6)
    dst = jnp.full((3, 5), -1, dtype=jnp.int32)
    # Row 1 of src (6 floats = 24 bytes) into the start of dst; element 23 into the last slot.
    segments = [(24, 0, 24), (23 * 4, 14 * 4, 4)]
    expected = numpy_oracle(np.asarray(src), np.asarray(dst), segments)
    step = jax.jit(lambda s, d: jax_amem.copy.segment_copy(s, d, segments), donate_argnums=1)
    np.testing.assert_array_equal(np.asarray(step(src, dst)), expected)


def test_a_copy_between_two_arrays_is_the_many_target_with_one_buffer_a_side(monkeypatch):
    """One row type, one validation, one kernel: segment_copy is segment_copy_many([src], [dst])."""
    src, dst = jnp.arange(16, dtype=jnp.uint8), jnp.zeros(16, jnp.uint8)
    text = jax.jit(lambda s, d: jax_amem.copy.segment_copy(s, d, [(4, 0, 8)])).lower(src, dst).as_text()
    assert text.count("jax_amem_segment_copy_many") == 1 and text.count("custom_call") == 1, text
    calls = []
    many = jax_amem.copy.segment_copy_many
    monkeypatch.setattr(jax_amem.copy, "segment_copy_many", lambda *a: calls.append(a) or many(*a))
    got = jax_amem.copy.segment_copy(src, dst, [(4, 0, 8)])
    assert [len(c[0]) for c in calls] == [1] and calls[0][2].tolist() == [[0, 0, 4, 0, 8, 0]]
    np.testing.assert_array_equal(np.asarray(got), [4, 5, 6, 7, 8, 9, 10, 11] + [0] * 8)


def test_long_segments_are_split_into_pieces_and_copied_whole():
    n = 3 * jax_amem.copy.MAX_PIECE_BYTES + 40
    src = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    table = jax_amem.copy.prepare_segments([(0, 0, n)], n, n)
    assert len(table) == 4 and table[:, 2].sum() == n
    got = jax_amem.copy.segment_copy(jnp.asarray(src), jnp.zeros(n, jnp.uint8), [(0, 0, n)])
    np.testing.assert_array_equal(np.asarray(got), src)


def test_zero_segments_and_zero_size_buffers():
    src = jnp.zeros((0,), jnp.float32)
    dst = jnp.ones((0, 3), jnp.float32)
    assert jax_amem.copy.segment_copy(src, dst, np.zeros((0, 3), np.int64)).shape == (0, 3)
    dst = jnp.ones(4, jnp.float32)
    np.testing.assert_array_equal(np.asarray(jax_amem.copy.segment_copy(src, dst, [])), np.ones(4))


def test_offsets_beyond_32_bits_survive_the_table_encoding():
    table = jax_amem.copy.prepare_segments([(2**33 + 16, 2**34, 16)], 2**35, 2**35)
    assert table.tolist() == [[2**33 + 16, 2**34, 16]]


@pytest.mark.parametrize(
    "segments, message",
    [
        ([(0, 0, 0)], r"segment 0 .*bytes must be positive"),
        ([(0, 0, 8), (60, 0, 8)], r"segment 1 .*reads outside source buffer 0 of 64 bytes"),
        ([(0, 30, 4)], r"segment 0 .*writes outside destination buffer 0 of 32 bytes"),
        ([(-4, 0, 4)], r"segment 0 .*reads outside"),
        ([(0, 0, 8), (8, 4, 8)], r"segment 0 .* and segment 1 .* overlapping destination bytes"),
    ],
)
def test_bad_segments_name_the_row_and_leave_dst_untouched(segments, message):
    src = jnp.arange(64, dtype=jnp.uint8)
    dst = jnp.full(32, 7, jnp.uint8)
    with pytest.raises(ValueError, match=message):
        jax_amem.copy.segment_copy(src, dst, segments)
    np.testing.assert_array_equal(np.asarray(dst), np.full(32, 7))


def test_bad_table_shape_is_rejected():
    with pytest.raises(ValueError):
        jax_amem.copy.prepare_segments(np.zeros((2, 2), np.int64), 8, 8)


def test_sharded_destination_outside_shard_map_is_rejected():
    mesh = jax.make_mesh((len(jax.devices()),), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    dst = jax.device_put(jnp.zeros(8 * len(jax.devices()), jnp.uint8), sharding)
    if len(jax.devices()) == 1:
        pytest.skip("one device only")
    with pytest.raises(ValueError, match="sharded over"):
        jax_amem.copy.segment_copy(jnp.zeros(4, jnp.uint8), dst, [(0, 0, 4)])


@pytest.mark.gpu
def test_gpu_matches_cpu_inside_jit():
    gpu = jax.devices("cuda")[0]
    cpu = jax.devices("cpu")[0]
    rng = np.random.default_rng(1)
    src = rng.integers(0, 2**31, 3 * 1024 * 1024 + 5, dtype=np.int32)
    dst = rng.integers(0, 2**31, 2 * 1024 * 1024 + 3, dtype=np.int32)
    # Aligned, misaligned, long (split into pieces) and tiny segments together.
    segments = [(0, 0, 4 * 1024 * 1024), (4 * 1024 * 1024 + 3, 4 * 1024 * 1024 + 1, 1001),
                (12, 8 * 1024 * 1024 + 4, 8), (5, 8 * 1024 * 1024 + 1, 3)]
    step = jax.jit(lambda s, d: jax_amem.copy.segment_copy(s, d, segments), donate_argnums=1)
    on_gpu = step(jax.device_put(src, gpu), jax.device_put(dst, gpu))
    on_cpu = step(jax.device_put(src, cpu), jax.device_put(dst, cpu))
    assert on_gpu.devices() == {gpu}
    np.testing.assert_array_equal(np.asarray(on_gpu), np.asarray(on_cpu))
    np.testing.assert_array_equal(np.asarray(on_gpu), numpy_oracle(src, dst, segments))
