"""Pause/resume round trips through host memory: bit-exact, same sharding, every dtype (CPU)."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_amem

DTYPES = [jnp.bool_, jnp.int4, jnp.uint4, jnp.int8, jnp.uint8, jnp.int16, jnp.uint16, jnp.int32,
          jnp.uint32, jnp.float16, jnp.bfloat16, jnp.float32, jnp.complex64,
          jnp.float8_e4m3fn, jnp.float8_e5m2]


pytestmark = pytest.mark.usefixtures("never_left_paused")


def random_array(dtype, shape, seed):
    """Every bit pattern the dtype allows: NaN payloads, -0.0, infinities, subnormals."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype.itemsize == 1 and dtype.name in ("int4", "uint4"):
        info = jnp.iinfo(dtype)
        return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)
    raw = rng.integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def bits(x) -> np.ndarray:
    """The array's values as comparable integers (NaN == NaN when the bits match)."""
    host = np.asarray(x)
    if host.dtype.name in ("int4", "uint4"):
        return host.astype(np.int8)
    return host.view(np.uint8)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_comes_back_bit_identical(dtype):
    host = random_array(dtype, (3, 37), seed=np.dtype(dtype).num)
    x = jnp.asarray(host)
    expected = bits(x)
    info = jax_amem.pause(keep={"x": x})
    assert info.arrays_kept == 1 and x.is_deleted()
    restored = jax_amem.resume().keep["x"]
    assert restored.dtype == dtype and restored.shape == (3, 37)
    np.testing.assert_array_equal(bits(restored), expected)


def mesh():
    return jax.make_mesh((4, 2), ("a", "b"))


@pytest.mark.parametrize("spec", [P("a", None), P(None, "b"), P(("a", "b")), P(), P("b", "a")],
                         ids=str)
def test_sharded_arrays_come_back_with_the_same_sharding_and_shards(spec):
    sharding = NamedSharding(mesh(), spec)
    host = random_array(jnp.bfloat16, (16, 8), seed=7)
    x = jax.device_put(host, sharding)
    per_device = {s.device: bits(s.data) for s in x.addressable_shards}
    distinct = {tuple((i.start, i.stop) for i in s.index) for s in x.addressable_shards}
    shard_bytes, fmt = x.addressable_shards[0].data.nbytes, x.format
    info = jax_amem.pause(keep=[x])
    # Replicas are stored once: one host copy per distinct shard.
    assert info.bytes_offloaded == len(distinct) * shard_bytes
    assert info.bytes_kept == 8 * shard_bytes
    (restored,) = jax_amem.resume().keep
    assert restored.sharding == sharding and restored.format == fmt
    assert {s.device: bits(s.data).tobytes() for s in restored.addressable_shards} == \
        {d: b.tobytes() for d, b in per_device.items()}
    np.testing.assert_array_equal(bits(restored), bits(host))


def test_a_training_state_tree_keeps_structure_weak_types_commitment_and_keys():
    sharding = NamedSharding(mesh(), P("a"))
    state = {
        "params": {"w": jax.device_put(jnp.arange(32.0).reshape(8, 4), sharding),
                   "b": jnp.zeros(4, jnp.bfloat16)},
        "step": jnp.asarray(3),             # weak-typed int, uncommitted
        "lr": jnp.asarray(0.5),             # weak-typed float
        "rng": jax.random.key(42),          # a typed PRNG key
        "on_device_5": jax.device_put(jnp.ones(3, jnp.int8), jax.devices()[5]),
        "empty": jnp.zeros((0, 4)),
        "nothing": None,
    }
    def describe(x):
        return x.shape, x.dtype, x.sharding, x.committed, getattr(x, "weak_type", None)

    before = jax.tree.map(describe, state)
    values = jax.tree.map(lambda x: np.asarray(jax.random.key_data(x) if
                                               jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended)
                                               else x), state)
    jax_amem.pause(keep=state)
    restored = jax_amem.resume().keep
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    assert jax.tree.map(describe, restored) == before
    assert restored["step"].weak_type and not restored["params"]["w"].weak_type
    np.testing.assert_array_equal(jax.random.key_data(restored["rng"]), values["rng"])
    for key in ("step", "lr", "on_device_5", "empty"):
        np.testing.assert_array_equal(np.asarray(restored[key]), values[key])
    # The restored key still drives the same random stream.
    np.testing.assert_array_equal(jax.random.normal(restored["rng"], (3,)),
                                  jax.random.normal(jax.random.key(42), (3,)))
    # Weak types promote as before: weak f32 * bf16 stays bf16.
    assert (restored["lr"] * restored["params"]["b"]).dtype == jnp.bfloat16


def test_dropped_arrays_come_back_zero_filled_with_their_sharding():
    sharding = NamedSharding(mesh(), P("a", "b"))
    cache = {"k": jax.device_put(jnp.full((8, 8), 7.0), sharding), "flags": jnp.ones(5, bool)}
    info = jax_amem.pause(drop=cache)
    assert info.arrays_dropped == 2 and info.bytes_offloaded == 0
    assert info.bytes_dropped == 8 * 8 * 4 + 5
    restored = jax_amem.resume()
    assert restored.keep is None
    assert restored.drop["k"].sharding == sharding
    np.testing.assert_array_equal(np.asarray(restored.drop["k"]), np.zeros((8, 8)))
    np.testing.assert_array_equal(np.asarray(restored.drop["flags"]), np.zeros(5, bool))


def test_the_same_array_twice_in_a_tree_is_stored_once_and_comes_back_as_one_object():
    tied = jnp.arange(6.0)
    info = jax_amem.pause(keep={"embed": tied, "unembed": tied})
    assert info.arrays_kept == 1 and info.bytes_offloaded == 24
    keep = jax_amem.resume().keep
    assert keep["embed"] is keep["unembed"]
    np.testing.assert_array_equal(np.asarray(keep["embed"]), np.arange(6.0))


def test_the_staging_pool_is_reused_across_cycles():
    x = jnp.arange(100_000, dtype=jnp.float32)
    expected = bits(x)
    for cycle in range(5):
        jax_amem.pause(keep=[x])
        if cycle == 0:
            first = jax_amem.memory.pool_stats()
        (x,) = jax_amem.resume().keep
    stats = jax_amem.memory.pool_stats()
    assert stats.in_use_bytes == 0
    assert stats.chunk_allocations == first.chunk_allocations
    assert stats.reserved_bytes == first.reserved_bytes
    assert stats.high_water_bytes >= 400_000
    np.testing.assert_array_equal(bits(x), expected)


def test_restored_arrays_work_in_jit_with_donation():
    sharding = NamedSharding(mesh(), P("a"))
    x = jax.device_put(jnp.arange(16.0), sharding)
    step = jax.jit(lambda v: v * 2, donate_argnums=0)
    x = step(x)
    jax_amem.pause(keep=x)
    x = jax_amem.resume().keep
    x = step(x)
    np.testing.assert_array_equal(np.asarray(x), np.arange(16.0) * 4)
