"""The host staging pool and the batched host copies behind pause (CPU)."""

import numpy as np
import pytest

from jax_amem._native import core
from jax_amem.memory import staging

ALIGN = core.memory.PLACEMENT_ALIGNMENT
CHUNK = core.memory.CHUNK_GRANULARITY
BLOCK = core.memory.BLOCK_BYTES


def test_placements_are_aligned_disjoint_and_reused_after_release():
    pool = core.memory.StagingPool(False)
    sizes = [10, 300, 0, 5, ALIGN]
    first = pool.place(sizes)
    assert all(a % ALIGN == 0 for a in first)
    assert [b - a for a, b in zip(first, first[1:])] == [ALIGN, 2 * ALIGN, 0, ALIGN]
    stats = pool.stats()
    assert stats.pop("grow_seconds") > 0
    assert stats == {"pinned": False, "method": "plain", "reserved_bytes": CHUNK,
                     "in_use_bytes": 5 * ALIGN, "high_water_bytes": 5 * ALIGN, "chunk_count": 1,
                     "chunk_allocations": 1, "numa_node": -1, "placement_failures": 0}
    pool.release_all()
    assert pool.place(sizes) == first  # same addresses: nothing new allocated
    assert pool.stats()["chunk_allocations"] == 1


def test_the_pool_grows_by_one_chunk_for_what_does_not_fit():
    pool = core.memory.StagingPool(False)
    pool.place([CHUNK // 2])
    pool.release_all()
    addresses = pool.place([CHUNK // 4, CHUNK, CHUNK // 2])
    stats = pool.stats()
    assert stats["chunk_count"] == 2 and stats["chunk_allocations"] == 2
    assert stats["reserved_bytes"] == CHUNK + 2 * CHUNK  # the rest (1.5 chunks) rounded up
    assert len(set(addresses)) == 3
    assert stats["high_water_bytes"] == CHUNK // 4 + CHUNK + CHUNK // 2


def test_growth_packs_blocks_of_at_most_one_gib_and_gives_a_larger_buffer_its_own():
    pool = core.memory.StagingPool(False)  # plain memory is mapped lazily: no RAM is touched
    addresses = pool.place([BLOCK // 2, BLOCK // 2, BLOCK // 2, 2 * BLOCK + 1])
    stats = pool.stats()
    assert stats["chunk_count"] == 3 and stats["chunk_allocations"] == 3
    assert stats["reserved_bytes"] == BLOCK + BLOCK // 2 + 2 * BLOCK + CHUNK
    assert addresses[1] - addresses[0] == BLOCK // 2  # the first two share one block
    pool.release_all()
    pool.free()


def test_reserve_grows_ahead_so_that_the_same_placement_makes_nothing():
    pool = core.memory.StagingPool(False)
    sizes = [3 * CHUNK // 2, 300, BLOCK // 2, BLOCK // 2 + ALIGN, 5]
    pool.reserve(sizes)
    reserved = pool.stats()
    assert reserved["in_use_bytes"] == 0 and reserved["chunk_allocations"] == 2
    pool.reserve(sizes)  # already there: nothing more
    addresses = pool.place(sizes)
    after = pool.stats()
    assert after["chunk_allocations"] == 2 and after["reserved_bytes"] == reserved["reserved_bytes"]
    assert len(set(addresses)) == len(sizes)
    pool.release_all()
    pool.free()


def test_reserve_then_place_makes_nothing_when_large_buffers_sit_between_small_ones():
    # A trainer's leaves alternate (a 1.2 GB embedding, 0.5 GB projections, its Adam moments):
    # the placement after reserve() walked past blocks reserve() had filled out of order and
    # pinned again inside the first pause (0.3 s of the Qwen3-1.7B preset on the H200).
    pool = core.memory.StagingPool(False)
    sizes = [BLOCK // 4, 2 * BLOCK, BLOCK // 4, BLOCK + 5, CHUNK, BLOCK // 2, 7, BLOCK]
    pool.reserve(sizes)
    reserved = pool.stats()
    addresses = pool.place(sizes)
    after = pool.stats()
    assert after["chunk_allocations"] == reserved["chunk_allocations"]
    assert after["reserved_bytes"] == reserved["reserved_bytes"]
    spans = sorted(zip(addresses, sizes))
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))  # disjoint
    pool.release_all()
    assert pool.place(sizes) == addresses  # every later pause: the same places
    pool.release_all()
    pool.free()


def test_an_unknown_pinned_method_is_refused_by_name_and_nothing_is_made():
    pool = core.memory.StagingPool(True, "bogus")
    with pytest.raises(RuntimeError, match="unknown pinned memory method 'bogus'.*'registered'"):
        pool.place([100])
    assert pool.stats()["reserved_bytes"] == 0


def test_free_is_refused_while_in_use_and_returns_everything_after():
    pool = core.memory.StagingPool(False)
    pool.place([1000])
    with pytest.raises(RuntimeError, match="resume\\(\\) before releasing"):
        pool.free()
    assert pool.stats()["reserved_bytes"] == CHUNK
    pool.release_all()
    pool.free()
    assert pool.stats()["reserved_bytes"] == 0 and pool.stats()["chunk_count"] == 0


def test_host_copies_round_trip_through_the_pool():
    pool = core.memory.StagingPool(False)
    src = np.random.default_rng(0).integers(0, 256, 12345, dtype=np.uint8)
    dst = np.zeros_like(src)
    (address,) = pool.place([src.nbytes])
    core.memory.copy_to_host(np.array([[-1, src.ctypes.data, address, src.nbytes]], np.int64))
    core.memory.copy_to_device(np.array([[-1, dst.ctypes.data, address, dst.nbytes]], np.int64))
    np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize("table, message", [
    (np.zeros((1, 3), np.int64), "shape \\(n, 4\\)"),
    (np.array([[-2, 0, 0, 1]], np.int64), "row 0 has a bad device ordinal"),
    (np.array([[-1, 0, 0, -5]], np.int64), "row 0 .*negative size"),
])
def test_bad_transfer_tables_are_rejected(table, message):
    with pytest.raises(ValueError, match=message):
        core.memory.copy_to_host(table)


def test_gpu_copies_without_a_driver_say_so():
    if core.cuda.driver_status()[0]:
        pytest.skip("a CUDA driver is present")
    with pytest.raises(RuntimeError, match="libcuda.so.1"):
        core.memory.copy_to_host(np.array([[0, 1, 2, 3]], np.int64))


def test_the_shared_pool_is_plain_host_memory_without_a_gpu_and_reports_sizes():
    if core.cuda.driver_status()[0]:
        pytest.skip("a CUDA driver is present")
    stats = staging.pool_stats()
    assert not stats.pinned
    assert "host staging pool" in str(stats)
    assert staging.human(3 * 2**20) == "3.0 MiB" and staging.human(12) == "12 B"
