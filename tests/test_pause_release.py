"""Pause without a garbage-collection tax: deterministic release, reserve() ahead, bit-identical back.

CPU tests of the logic (release() with injected probes) and of the real path on XLA CPU devices;
the GPU test checks the same on the device's memory pool.
"""

import gc

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_amem
from jax_amem.memory import release as releasing, staging

pytestmark = pytest.mark.usefixtures("never_left_paused")


class Device:
    """A fake device: bytes in use per probe, and what each collection frees."""

    def __init__(self, readings, freed_by_generation=None):
        self.readings = list(readings)
        self.freed = dict(freed_by_generation or {})
        self.trims = 0
        self.collected = []

    def in_use(self, ordinal):
        return self.readings[0]

    def trim(self, ordinal):
        self.trims += 1

    def collect(self, generation):
        self.collected.append(generation)
        self.readings[0] -= self.freed.get(generation, 0)


def run(device, limit, **kw):
    return releasing.release([0], {0: limit}, device.in_use, device.trim, device.collect,
                             settle_s=0, **kw)


def test_no_collection_when_deleting_the_arrays_freed_their_bytes():
    device = Device([100])
    assert run(device, limit=100) == releasing.Released(0, {})
    assert device.collected == [] and device.trims == 1


def test_a_generation_0_collection_only_when_a_buffer_is_still_held():
    device = Device([140], freed_by_generation={0: 40})
    assert run(device, limit=100) == releasing.Released(1, {})
    assert device.collected == [0]


def test_a_full_collection_only_when_generation_0_was_not_enough():
    device = Device([140], freed_by_generation={0: 10, 2: 30})
    assert run(device, limit=100) == releasing.Released(2, {})
    assert device.collected == [0, 2]


def test_what_no_collection_frees_is_reported_per_device():
    device = Device([140])
    assert run(device, limit=100) == releasing.Released(2, {0: 40})


def test_an_allocator_that_cannot_count_is_neither_checked_nor_collected():
    collected = []
    released = releasing.release([0, 1], {}, lambda o: None, lambda o: None, collected.append)
    assert released == releasing.Released(0, {}) and collected == []


def test_a_late_free_is_waited_for_rather_than_collected():
    readings = iter([140, 120, 100])
    collected = []
    released = releasing.release([0], {0: 100}, lambda o: next(readings), lambda o: None,
                                 collected.append, settle_s=0)
    assert released == releasing.Released(0, {}) and collected == []


# ----------------------------------------------------------------- the real path (XLA CPU or GPU)

def state(seed=0):
    rng = np.random.default_rng(seed)
    mesh = jax.make_mesh((len(jax.devices()),), ("x",))
    sharded = NamedSharding(mesh, P("x"))
    raw = rng.integers(0, 2**32, (8 * len(jax.devices()), 33), dtype=np.uint32)
    return {
        "w": jax.device_put(raw.view(np.float32), sharded),  # NaN payloads, -0.0, subnormals
        "b": jnp.asarray(rng.standard_normal(17).astype(jnp.bfloat16)),
        "step": jnp.int32(7),
        "key": jax.random.key(3),
    }


def host_bits(tree):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended)
                       else x).tobytes() for x in jax.tree.leaves(tree)]


def buffers(arrays) -> set:
    """(device, address) of every live buffer of `arrays` (key arrays through their key data)."""
    found = set()
    for x in arrays:
        if x.is_deleted():
            continue
        data = jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended) else x
        found |= {(s.device.id, s.data.unsafe_buffer_pointer()) for s in data.addressable_shards}
    return found


class CollectionLog:
    """Every garbage collection while active (automatic ones switched off, so only calls count)."""

    def __enter__(self):
        self.starts = []
        self._was_enabled = gc.isenabled()
        gc.disable()
        gc.callbacks.append(self._record)
        return self

    def _record(self, phase, info):
        if phase == "start":
            self.starts.append(info["generation"])

    def __exit__(self, *exc):
        gc.callbacks.remove(self._record)
        if self._was_enabled:
            gc.enable()


def test_pause_releases_every_buffer_without_collecting_and_comes_back_bit_identical():
    keep = state()
    drop = {"cache": jnp.ones((64, 8), jnp.bfloat16)}
    expected = host_bits(keep)
    ours = jax.tree.leaves((keep, drop))
    held = buffers(ours)
    assert held <= buffers(jax.live_arrays())
    with CollectionLog() as log:
        info = jax_amem.pause(keep=keep, drop=drop)
        live_after = buffers(jax.live_arrays())
    assert log.starts == [] and info.collections == 0
    # None of our buffers is alive in JAX's runtime, though the Python objects are still referenced.
    assert all(x.is_deleted() for x in ours) and not (held & live_after)
    assert info.release_seconds >= 0 and info.staging_seconds >= info.allocate_seconds >= 0
    restored = jax_amem.resume()
    assert host_bits(restored.keep) == expected
    assert restored.keep["w"].sharding == keep["w"].sharding
    assert jax.random.key_impl(restored.keep["key"]) == jax.random.key_impl(keep["key"])
    assert not np.asarray(restored.drop["cache"]).any()


def test_reserve_ahead_leaves_the_pause_nothing_to_allocate_and_keeps_the_arrays():
    jax_amem.process_pause._wait_for_reservations()
    staging.release_pinned_pool()
    keep = state(1)
    expected = host_bits(keep)
    reservation = jax_amem.reserve(keep=keep, drop={"c": jnp.zeros(5)}, wait=True)
    assert reservation.done() and reservation.pool_seconds > 0 and reservation.compile_seconds >= 0
    assert not any(x.is_deleted() for x in jax.tree.leaves(keep))
    before = staging.pool_stats()
    assert before.reserved_bytes >= reservation.bytes > 0 and before.in_use_bytes == 0
    info = jax_amem.pause(keep=keep)
    after = staging.pool_stats()
    assert info.allocate_seconds == 0
    assert after.chunk_allocations == before.chunk_allocations
    assert after.reserved_bytes == before.reserved_bytes
    assert host_bits(jax_amem.resume().keep) == expected


def test_reserve_runs_in_the_background_and_pause_waits_for_its_pool():
    staging.release_pinned_pool()
    keep = {"a": jnp.arange(4096.0), "b": jnp.ones((300, 7), jnp.int8)}
    expected = host_bits(keep)
    reservation = jax_amem.reserve(keep)
    info = jax_amem.pause(keep=keep)  # takes the pool's growth lock after the reservation
    assert info.collections == 0
    assert host_bits(jax_amem.resume().keep) == expected
    assert reservation.wait().done()


def test_reserve_refuses_what_pause_refuses_and_names_the_leaf():
    with pytest.raises(jax_amem.PauseError, match=r"keep\['lr'\] is a builtins.float"):
        jax_amem.reserve(keep={"lr": 0.1})
    x = jnp.ones(3)
    with pytest.raises(jax_amem.PauseError, match=r"keep\[0\] and drop\[0\]"):
        jax_amem.reserve(keep=[x], drop=[x])


@pytest.mark.gpu
def test_on_the_gpu_the_pool_returns_without_a_collection_after_reserve():
    keep = {f"w{i}": jnp.full((1 << 20,), i, jnp.float32) for i in range(32)}  # 128 MiB
    expected = host_bits(keep)
    jax_amem.reserve(keep, wait=True)
    with CollectionLog() as log:
        info = jax_amem.pause(keep=keep)
    assert log.starts == [] and info.collections == 0 and info.allocate_seconds == 0
    assert info.pool_returned and info.bytes_freed >= 128 * 2**20
    assert staging.pool_stats().pinned
    assert host_bits(jax_amem.resume().keep) == expected
