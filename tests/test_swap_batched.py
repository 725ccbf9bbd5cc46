"""The batched route of JAX destinations (a few segment_copy_many calls per group): JAX to JAX
equals device_put, in place; ceil(buffers / 512) launches per group, chunks split at the limit
(a buffer spanning chunks included), error paths untouched.
PyTorch destinations always take the address route (test_swap_addresses.py), whose chunks are
these."""

import math

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_amem
from jax_amem import reshard
from jax_amem.copy import MAX_BUFFERS_PER_SIDE
from jax_amem.swapping import forget
from jax_amem.swapping.in_process import routes, schedule

import test_swap_errors as errors
import test_swap_jax as jaxdst
import test_swap_llama as llama

torch = pytest.importorskip("torch")


def tensor_bytes(tensors: dict) -> dict:
    return {name: t.detach().cpu().reshape(-1).view(torch.uint8).numpy().copy() for name, t in tensors.items()}


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn])
def test_jax_to_jax_batched_equals_device_put_in_place(dtype):
    src, dst, want = {}, {}, {}
    for k, (name, (shape, s_spec, d_spec)) in enumerate(jaxdst.TREE_SPECS.items()):
        src[name] = jax.device_put(jaxdst.random_bits(shape, dtype, k), NamedSharding(jaxdst.TRAINER, s_spec))
        sharding = NamedSharding(jaxdst.ROLLOUT, d_spec)
        dst[name] = jaxdst.zeros(shape, dtype, sharding)
        want[name] = jax.device_put(src[name], sharding)
    pointers = {n: [s.data.unsafe_buffer_pointer() for s in a.addressable_shards] for n, a in dst.items()}
    report = jax_amem.swap(src, dst, verify=True)
    assert report.batched and "not-in-place" not in report.transports
    assert report.calls == 8 and report.launches == report.calls  # one group per device, one chunk each
    assert all(a.is_deleted() for a in dst.values())
    for name in jaxdst.TREE_SPECS:
        new = report.dst[name]
        for got, expected in zip(new.addressable_shards, want[name].addressable_shards):
            assert np.array_equal(jaxdst.as_bytes(got.data), jaxdst.as_bytes(expected.data)), name
        assert [s.data.unsafe_buffer_pointer() for s in new.addressable_shards] == pointers[name]


def step(source, view, *rows):
    return schedule.Step(source, view, np.array(rows, np.int64).reshape(-1, 3))


def test_chunk_steps_keeps_each_side_within_the_limit_and_every_row():
    steps = [[step(0, 0, (0, 0, 4)), step(1, 0, (0, 4, 4))],      # buffer 0 reads views 0, 1
             [step(0, 0, (4, 0, 4))],                             # buffer 1 shares view 0
             [step(2, 1, (0, 0, 8), (8, 8, 8))],                  # buffer 2: one step, two rows
             [step(3, 0, (0, 0, 2)), step(4, 0, (0, 2, 2)), step(5, 0, (0, 4, 2))]]
    chunks = schedule.chunk_steps(steps, limit=2)
    seen = []
    for chunk in chunks:
        assert len(chunk.views) <= 2 and len(chunk.buffers) <= 2
        assert chunk.rows.dtype == np.int64 and chunk.rows.shape[1] == 6  # the copy's own rows
        for src, dst, *rest, reserved in chunk.rows.tolist():
            key, buffer = chunk.views[src], chunk.buffers[dst]
            seen.append((buffer, key, tuple(rest)))
            assert reserved == 0
    want = [(b, (s.source, s.view), tuple(r)) for b, ss in enumerate(steps) for s in ss for r in s.segments.tolist()]
    assert seen == want  # every row once, in the default path's order
    assert [c.buffers for c in chunks] == [(0, 1), (2, 3), (3,)]  # buffer 3 spans two chunks
    assert [c.views for c in chunks] == [((0, 0), (1, 0)), ((2, 1), (3, 0)), ((4, 0), (5, 0))]
    assert len(schedule.chunk_steps(steps)) == 1


def jax_destination():
    return {"w": jnp.zeros((8, 6), jnp.float32), "b": jnp.zeros(8, jnp.float32)}


def test_jax_destinations_take_the_batched_route_and_pytorch_ones_the_address_route():
    src = errors.sources()
    first = jax_amem.swap(src, jax_destination())
    assert first.route == "batched" and first.batched and first.launches == 1
    assert np.array_equal(first.dst["w"], np.arange(48.0).reshape(8, 6)) and np.array_equal(first.dst["b"], np.arange(8.0))
    torch_route = jax_amem.swap(src, errors.good_destination())
    assert torch_route.route == "addresses" and not torch_route.batched


@pytest.mark.parametrize("scenario", [
    errors.test_a_deleted_jax_destination_or_source,
    errors.test_plans_that_do_not_fit_the_inputs,
], ids=lambda f: f.__name__.removeprefix("test_"))
def test_error_paths_leave_the_destination_untouched_when_batched(scenario):
    scenario()  # each asserts its SwapError and that the destination did not change


@pytest.mark.gpu
def test_gpu_batched_many_small_jax_arrays_in_place():
    gpu = jax.devices("gpu")[0]
    count = 2000
    src = {f"t{i}": jax.device_put(jnp.full((33, 31), float(i), jnp.float32), gpu) for i in range(count)}
    dst = {name: jax.device_put(jnp.full((33, 31), jnp.nan, jnp.float32), gpu) for name in src}
    pointers = {name: a.unsafe_buffer_pointer() for name, a in dst.items()}
    for _ in range(2):  # the second writes into the first's results
        report = jax_amem.swap(src, dst, progress=False)
        groups = (schedule.GROUP_BUFFERS, count - schedule.GROUP_BUFFERS)  # 1024 and 976 buffers
        assert report.calls == 2 and report.launches == sum(math.ceil(n / MAX_BUFFERS_PER_SIDE) for n in groups)
        assert report.transports == {"device-local": report.bytes} and report.batched
        dst = report.dst  # a new dict, its keys sorted as pytrees sort them
        assert {name: a.unsafe_buffer_pointer() for name, a in dst.items()} == pointers
        assert all(np.array_equal(np.asarray(dst[f"t{i}"]), np.full((33, 31), float(i))) for i in range(count))
    forget()
