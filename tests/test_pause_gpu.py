"""Whole-process pause on the GPU: training continues bit-identically after PyTorch used the memory.

Run on the GPU machine (`bash scripts/gpu_test.sh`, or `pytest -m gpu tests/test_pause_gpu.py`).
jax_amem is imported first (tests/conftest.py), so XLA runs the cuda_async allocator.
"""

import functools
import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem._native import core

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("never_left_paused")]
MiB = 2**20




def free_bytes(ordinal=0) -> int:
    return core.cuda.mem_get_info(ordinal)[0]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@functools.lru_cache(maxsize=None)
def training(width=4096, depth=6, batch=512):
    """A Flax MLP with Adam; one jitted (donating) step, shared by every run so both
    runs use the same compiled program."""
    nn = pytest.importorskip("flax.linen")
    optax = pytest.importorskip("optax")

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(depth):
                x = nn.relu(nn.Dense(width)(x))
            return nn.Dense(1)(x)

    model, tx = MLP(), optax.adam(1e-3)
    data_key = jax.random.key(1)
    x = jax.random.normal(data_key, (batch, width))
    y = jnp.sum(x[:, :8], axis=1, keepdims=True)

    def init():
        params = model.init(jax.random.key(0), x)
        return params, tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return init, step


def host_leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def test_training_continues_bit_identically_after_torch_used_the_freed_memory():
    torch = pytest.importorskip("torch")
    init, step = training()

    def unpaused_run():
        params, opt_state = init()
        losses = []
        for _ in range(6):
            params, opt_state, loss = step(params, opt_state)
            losses.append(float(loss))
        return losses, host_leaves((params, opt_state))

    reference_losses, reference = unpaused_run()
    if unpaused_run()[0] != reference_losses:
        pytest.skip("two unpaused runs differ: XLA is not deterministic here "
                    "(set XLA_FLAGS=--xla_gpu_deterministic_ops=true)")

    params, opt_state = init()
    losses = []
    for _ in range(3):
        params, opt_state, loss = step(params, opt_state)
        losses.append(float(loss))
    free_before = free_bytes()
    info = jax_amem.pause(keep=(params, opt_state))
    assert info.pool_returned, info.pool_note
    assert info.bytes_freed >= info.bytes_kept > 1000 * MiB
    # PyTorch takes more than was free before the pause: only the freed memory makes it fit.
    grab = free_before + info.bytes_freed // 2
    tensor = torch.empty(grab, dtype=torch.uint8, device="cuda")
    tensor.fill_(7)
    assert int(tensor[-1]) == 7 and int(tensor[::4096].sum()) == 7 * len(tensor[::4096])
    del tensor
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

    params, opt_state = jax_amem.resume().keep
    for _ in range(3):
        params, opt_state, loss = step(params, opt_state)
        losses.append(float(loss))
    assert losses == reference_losses
    for got, want in zip(host_leaves((params, opt_state)), reference):
        np.testing.assert_array_equal(np.atleast_1d(got).view(np.uint8),
                                      np.atleast_1d(want).view(np.uint8))


def test_one_hundred_cycles_do_not_grow_device_or_host_memory():
    state = {f"w{i}": jnp.full((16, MiB), i, jnp.float32) for i in range(4)}  # 256 MiB
    expected = {k: np.asarray(v[:, :3]) for k, v in state.items()}
    paused_free, resumed_free, rss, pools = [], [], [], []
    for cycle in range(100):
        info = jax_amem.pause(keep=state)
        paused_free.append(info.device_free_after[0])
        pools.append(jax_amem.memory.pool_stats())
        state = jax_amem.resume().keep
        jax.block_until_ready(state)
        resumed_free.append(free_bytes())
        rss.append(rss_bytes())
    # After a warm-up, neither the device nor the host holds more with every cycle.
    assert min(paused_free[5:]) >= paused_free[5] - 16 * MiB
    assert min(resumed_free[5:]) >= resumed_free[5] - 16 * MiB
    assert max(rss[5:]) <= rss[5] + 64 * MiB
    assert {p.chunk_allocations for p in pools} == {pools[0].chunk_allocations}
    assert paused_free[-1] - resumed_free[-1] >= 256 * MiB  # the state really left the GPU
    for k, v in state.items():
        np.testing.assert_array_equal(np.asarray(v[:, :3]), expected[k])


DTYPES = [jnp.bool_, jnp.int4, jnp.uint4, jnp.int8, jnp.uint16, jnp.int32, jnp.float16,
          jnp.bfloat16, jnp.float32, jnp.complex64, jnp.float8_e4m3fn]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_bit_identically_on_the_gpu(dtype):
    rng = np.random.default_rng(0)
    if np.dtype(dtype) == np.bool_:
        host = rng.integers(0, 2, (257, 33)).astype(bool)
    elif np.dtype(dtype).name in ("int4", "uint4"):
        info = jnp.iinfo(dtype)
        host = rng.integers(int(info.min), int(info.max) + 1, (257, 33)).astype(dtype)
    else:
        host = rng.integers(0, 256, 257 * 33 * np.dtype(dtype).itemsize,
                            dtype=np.uint8).view(dtype).reshape(257, 33)
    x = jax.device_put(host, jax.devices()[0])
    jax_amem.pause(keep=[x])
    (restored,) = jax_amem.resume().keep
    got = np.asarray(restored)
    if got.dtype.name in ("int4", "uint4"):
        np.testing.assert_array_equal(got.astype(np.int8), host.astype(np.int8))
    else:
        np.testing.assert_array_equal(got.view(np.uint8), host.view(np.uint8))


def test_offload_through_the_reused_pinned_pool_is_fast():
    state = [jnp.ones((256, MiB), jnp.float32)]  # 1 GiB
    for _ in range(2):  # the first pause pins the pool; the second reuses it
        info = jax_amem.pause(keep=state)
        restored = jax_amem.resume()
        state = restored.keep
    assert jax_amem.memory.pool_stats().pinned
    assert info.offload_gb_per_s > 10 and restored.reload_gb_per_s > 10, (info, restored)


def test_memory_report_attributes_the_kept_arrays_and_their_release():
    state = [jnp.ones((64, MiB), jnp.float32)]  # 256 MiB
    before = jax_amem.memory_report(keep=state)
    gpu = before.devices[0]
    assert gpu.categories["arrays kept"] == 256 * MiB
    assert all(v >= 0 for v in gpu.categories.values()), gpu.categories
    jax_amem.pause(keep=state)
    try:
        after = jax_amem.memory_report()
    finally:
        state = jax_amem.resume().keep
    print(before, after, sep="\n\n")
    assert after.paused and after.host_kept_bytes == 256 * MiB
    assert after.devices[0].categories["arrays kept"] == 0
    assert after.devices[0].free_bytes - gpu.free_bytes >= 256 * MiB
    assert "arrays kept" in str(after) and "GPU 0" in str(after)


@pytest.mark.multigpu
def test_arrays_sharded_over_two_gpus_come_back_on_both():
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    x = jax.device_put(jnp.arange(2 * MiB, dtype=jnp.float32), sharding)
    replicated = jax.device_put(jnp.arange(1000.0), jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()))
    info = jax_amem.pause(keep=[x, replicated])
    assert set(info.device_free_after) == {0, 1}
    x2, r2 = jax_amem.resume().keep
    assert x2.sharding == sharding and r2.sharding == replicated.sharding
    np.testing.assert_array_equal(np.asarray(x2), np.arange(2 * MiB, dtype=np.float32))
    for shard in r2.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), np.arange(1000.0))
