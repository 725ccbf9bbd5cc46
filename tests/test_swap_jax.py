"""JAX destinations (written by donation, equal to jax.device_put bit for bit), verification
of a corrupted destination, and zero-copy PyTorch views of JAX arrays."""

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_amem
from jax_amem import reshard
from jax_amem.swapping import SwapError, verify

torch = pytest.importorskip("torch")

DEVICES = jax.devices("cpu")[:8]  # cpu: collected on GPU machines too
TRAINER = Mesh(np.array(DEVICES).reshape(2, 4), ("fsdp", "tp"))
ROLLOUT = Mesh(np.array(DEVICES[::-1]).reshape(4, 2), ("dp", "tp"))  # other order, other split


def random_bits(shape, dtype, seed, quiet_nans=True):
    """Random bit patterns, compared as bytes. XLA's resharding quiets signalling NaNs (the
    swap copies them bit for bit), so for the device_put oracle NaNs become quiet ones."""
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    value = raw.view(dtype).reshape(shape).copy()
    floating = dtype.kind in "fV"  # ml_dtypes' bfloat16 and float8 have kind "V"
    if quiet_nans and floating:
        value[np.isnan(value.astype(np.float32))] = np.nan
    return value


def zeros(shape, dtype, sharding):
    """Buffers JAX owns alone (a CPU device_put of numpy may share the numpy memory, and a
    shared buffer cannot be donated in place)."""
    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)()


def as_bytes(array) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(array)).view(np.uint8)


TREE_SPECS = {  # name: (shape, trainer spec, rollout spec)
    "a": ((16, 24), P("fsdp", "tp"), P(None, "dp")),
    "b": ((8, 4, 6), P(None, "tp", "fsdp"), P("dp", None, "tp")),
    "c": ((32,), P(("fsdp", "tp")), P()),           # replicated on the rollout: every device written
    "d": ((), P(), P()),
}


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int8, np.uint16, ml_dtypes.float8_e4m3fn])
def test_jax_to_jax_across_meshes_equals_device_put_bit_for_bit(dtype):
    src, dst, want = {}, {}, {}
    for k, (name, (shape, s_spec, d_spec)) in enumerate(TREE_SPECS.items()):
        value = random_bits(shape, dtype, k)
        src[name] = jax.device_put(value, NamedSharding(TRAINER, s_spec))
        sharding = NamedSharding(ROLLOUT, d_spec)
        dst[name] = zeros(shape, dtype, sharding)
        want[name] = jax.device_put(src[name], sharding)
    pointers = {n: [s.data.unsafe_buffer_pointer() for s in a.addressable_shards] for n, a in dst.items()}
    report = jax_amem.swap(src, dst, verify=True)
    new = report.dst
    assert "not-in-place" not in report.transports
    assert all(a.is_deleted() for a in dst.values())  # donated
    for name in TREE_SPECS:
        assert new[name].sharding == want[name].sharding
        for got, expected in zip(new[name].addressable_shards, want[name].addressable_shards):
            assert got.device == expected.device
            assert np.array_equal(as_bytes(got.data), as_bytes(expected.data)), name
        # in place: each new shard is the old shard's memory
        assert [s.data.unsafe_buffer_pointer() for s in new[name].addressable_shards] == pointers[name]
    # every destination shard written once, replicas included
    assert report.bytes == sum(s.data.nbytes for a in want.values() for s in a.addressable_shards)


def test_signalling_nan_payloads_are_copied_bit_for_bit():
    value = random_bits((64, 16), ml_dtypes.bfloat16, 5, quiet_nans=False)
    bits = value.view(np.uint16)
    assert (((bits & 0x7FC0) == 0x7F80) & ((bits & 0x3F) != 0)).any()  # signalling NaNs present
    src = {"x": jax.device_put(value, NamedSharding(TRAINER, P("fsdp", "tp")))}
    dst = {"x": zeros((64, 16), jnp.bfloat16, NamedSharding(ROLLOUT, P("dp")))}
    new = jax_amem.swap(src, dst).dst["x"]
    for shard in new.addressable_shards:
        assert np.array_equal(as_bytes(shard.data), np.ascontiguousarray(value[shard.index]).view(np.uint8))


def test_a_jax_swap_into_its_own_result_again_and_a_pytree_of_lists():
    src = [jax.device_put(jnp.arange(48.0).reshape(8, 6), NamedSharding(TRAINER, P("fsdp"))),
           {"x": jax.device_put(jnp.ones(16, jnp.bfloat16), NamedSharding(TRAINER, P("tp")))}]
    dst = jax.tree.map(lambda x: zeros(x.shape, x.dtype, NamedSharding(ROLLOUT, P())), src)
    first = jax_amem.swap(src, dst)
    src2 = jax.tree.map(lambda x: x * 3, src)
    second = jax_amem.swap(src2, first.dst, version=41)
    third = jax_amem.swap(src2, second.dst)  # donates second.dst
    assert second.version == 41 and third.version == 42
    assert jax.tree.structure(third.dst) == jax.tree.structure(src)
    for got, want in zip(jax.tree.leaves(third.dst), jax.tree.leaves(src2)):
        assert np.array_equal(as_bytes(got), as_bytes(want))


def test_verify_names_the_first_corrupted_byte_of_a_torch_destination():
    src = {"w": jax.device_put(jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8),
                               NamedSharding(TRAINER, P("fsdp", "tp"))),
           "v": jax.device_put(jnp.arange(10, dtype=jnp.float32), DEVICES[3])}
    dst = {"w": torch.zeros(8, 64), "v": torch.zeros(10)}
    rules = [reshard.Rule.copy("w", transpose=(1, 0)), reshard.Rule.copy("v")]
    jax_amem.swap(src, dst, rules=rules, verify=True)
    assert verify(src, dst, rules=rules) == (64 * 8 + 10) * 4
    dst["w"].view(torch.uint8).reshape(-1)[4 * 70 + 2] ^= 1  # row 1, column 6 of the destination
    with pytest.raises(SwapError, match=r"destination 'w' .* byte 282 .*element \(1, 6\)") as caught:
        verify(src, dst, rules=rules)
    assert caught.value.mismatch.offset == 282 and caught.value.mismatch.source == "w"
    # the swap's own check finds it when the destination is corrupted behind its back
    jax_amem.swap(src, dst, rules=rules, verify=True)  # rewrites it: passes again


def test_verify_finds_a_corrupted_jax_shard():
    src = {"a": jax.device_put(jnp.arange(32, dtype=jnp.int32), NamedSharding(TRAINER, P(("fsdp", "tp"))))}
    dst = {"a": zeros(32, jnp.int32, NamedSharding(ROLLOUT, P("dp")))}
    new = jax_amem.swap(src, dst).dst
    assert verify(src, new) == 2 * 128  # two replicas of each shard on the rollout mesh
    broken = np.asarray(new["a"]).copy()
    broken[29] = -1
    bad = {"a": jax.device_put(broken, new["a"].sharding)}
    with pytest.raises(SwapError, match=r"'a' \(owner \(0, \d\)\) .* byte 20 of its shard \(element \(29,\)"):
        verify(src, bad)


def test_to_torch_gives_zero_copy_views_of_every_shard():
    x = jax.device_put(jnp.arange(64, dtype=jnp.float32).reshape(8, 8), NamedSharding(TRAINER, P("fsdp", "tp")))
    views = jax_amem.to_torch({"x": x})["x"]
    assert len(views) == 8
    for view, shard in zip(views, x.addressable_shards):
        assert view.device == shard.device and view.index == shard.index
        assert view.tensor.data_ptr() == shard.data.unsafe_buffer_pointer()
        assert np.array_equal(view.tensor.numpy(), np.asarray(x)[view.index])
    x.delete()
    with pytest.raises(SwapError, match="'x' was deleted"):
        jax_amem.to_torch({"x": x})
