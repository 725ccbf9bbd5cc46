"""Plans against the oracle: executing a plan with numpy copies over the source shards gives
exactly the shards of `jax.device_put(x, dst_sharding)`. Native and reference planners agree,
per-rank plans equal the global plan's slices, and `check()` proves coverage."""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_amem import reshard
from jax_amem.reshard import Layout, Owner, numpy_exec, simulate

from test_reshard_layouts import mesh_and_spec, parts

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.float16,
          ml_dtypes.bfloat16, np.float32, np.complex64, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
          ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz]


def random_array(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    raw = rng.integers(0, 256, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def same_bytes(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def assert_plan_moves(src_array, want_array, plan, name="tensor"):
    out = numpy_exec.execute(plan, numpy_exec.shards_of(name, src_array))
    for key, shard in numpy_exec.shards_of(name, want_array).items():
        assert same_bytes(out[key], shard), key


def assert_planners_agree(planner: reshard.Planner):
    native = planner.plan(cache=False).check()
    reference = planner.plan(planner="reference", cache=False)
    np.testing.assert_array_equal(native.transfers, reference.transfers)
    np.testing.assert_array_equal(native.blocks, reference.blocks)
    for owner in map(tuple, native.owners.tolist()):
        local = planner.plan(owner=owner, cache=False)
        assert local == native.for_owner(owner), owner
        local.check()
    return native


@settings(max_examples=60, deadline=None)
@given(data=st.data(), rank=st.integers(0, 3), dtype=st.sampled_from(DTYPES),
       split=st.sampled_from([1, 64, 1 << 20]))
def test_random_sharding_pairs_match_device_put(data, rank, dtype, split):
    src_mesh, src_spec = data.draw(mesh_and_spec(rank), label="source")
    dst_mesh, dst_spec = data.draw(mesh_and_spec(rank), label="destination")
    shape = tuple(math.lcm(parts(src_mesh, src_spec, d), parts(dst_mesh, dst_spec, d))
                  * data.draw(st.integers(0, 2)) for d in range(rank))
    x = random_array(shape, dtype, seed=hash((shape, str(src_spec))) & 0xFFFF)
    src = jax.device_put(x, NamedSharding(src_mesh, src_spec))
    want = jax.device_put(x, NamedSharding(dst_mesh, dst_spec))
    planner = reshard.Planner(Layout.of(src), Layout.of(want), split_bytes=split)
    plan = assert_planners_agree(planner)
    assert plan.nbytes == sum(s.data.nbytes for s in want.addressable_shards)  # zero redundant bytes
    assert_plan_moves(src, want, plan)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(0, 11), cols=st.integers(1, 5), tp_src=st.integers(1, 8), tp_dst=st.integers(1, 8),
       dim=st.integers(0, 1))
def test_uneven_tensor_parallel_splits(rows, cols, tp_src, tp_dst, dim):
    shape = (rows, cols)
    owners = [Owner(i // 4, i) for i in range(8)]
    src = Layout.tensor_parallel(shape, np.float32, dim, tp_src, owners[: tp_src * (8 // tp_src)])
    dst = Layout.tensor_parallel(shape, np.float32, 1 - dim, tp_dst, owners[: tp_dst * (8 // tp_dst)])
    x = random_array(shape, np.float32, seed=rows * 100 + cols)
    plan = assert_planners_agree(reshard.Planner(src, dst, split_bytes=8))
    sources = {("tensor", o): x[src.shard_slices(o)] for o in src.owners}
    out = numpy_exec.execute(plan, sources)
    for o in dst.owners:
        assert same_bytes(out[("tensor", o)], np.ascontiguousarray(x[dst.shard_slices(o)]))


@pytest.mark.parametrize("shape", [(), (0,), (1,), (1, 1, 1), (0, 4), (8, 0, 2)])
def test_edge_shapes(shape):
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
    spec = P(*(["a", "b", None][: len(shape)])) if all(n % 4 == 0 for n in shape[:1]) else P()
    x = random_array(shape, np.float32, seed=len(shape))
    src = jax.device_put(x, NamedSharding(mesh, P()))
    want = jax.device_put(x, NamedSharding(mesh, spec))
    plan = assert_planners_agree(reshard.Planner(Layout.of(src), Layout.of(want)))
    assert_plan_moves(src, want, plan)


def test_replicated_source_is_balanced_and_local_first():
    # 8 replicas, destination split 8 ways with two rollout replicas on other hosts.
    shape = (64, 256)
    src_owners = [Owner(i // 4, i) for i in range(8)]
    dst_owners = [Owner(2 + i // 4, 8 + i) for i in range(8)]
    src = Layout.replicated(shape, np.float32, src_owners)
    dst = Layout.tensor_parallel(shape, np.float32, 0, 4, dst_owners)
    plan = reshard.plan(src, dst, split_bytes=1024, cache=False).check()
    sim = simulate(plan)
    assert sim.bytes_by_class == {"device": 0, "nvlink": 0, "network": 64 * 256 * 4 * 2}
    assert sim.egress_max_over_mean == pytest.approx(1.0, abs=0.01)
    # Same-device copies are preferred to any link.
    colocated = Layout.tensor_parallel(shape, np.float32, 0, 8, src_owners)
    local = reshard.plan(src, colocated, cache=False)
    assert simulate(local).bytes_by_class == {"device": 64 * 256 * 4, "nvlink": 0, "network": 0}


def test_simulator_predicts_the_busiest_link():
    src = Layout.single((1000,), np.uint8, (0, 0))
    dst = Layout.from_boxes((1000,), np.uint8, {(0, 1): ((0,), (600,)), (1, 2): ((600,), (400,))})
    sim = simulate(reshard.plan(src, dst, cache=False), reshard.Bandwidths(device=1e12, nvlink=100.0, network=10.0))
    assert sim.busiest == ((1, 2), "network", "in") or sim.busiest == ((0, 0), "network", "out")
    assert sim.seconds == pytest.approx(400 / 10.0)
    assert sim.bytes_by_class == {"device": 0, "nvlink": 600, "network": 400}


def test_segments_feed_segment_copy_rows():
    src = Layout.tensor_parallel((6, 8), np.int32, 1, 2, [(0, 0), (0, 1)])
    dst = Layout.single((6, 8), np.int32, (0, 2))
    plan = reshard.plan(src, dst, cache=False)
    assert len(plan.blocks) == 2 and (plan.blocks[:, 3] == 6).all()  # one 2-D block per source shard
    rows = plan.segments(0)
    assert rows.shape == (6, 3) and (rows[:, 2] == 16).all()


def test_plans_are_cached_deterministic_and_printable():
    reshard.clear_cache()
    src = Layout.tensor_parallel((16, 4), np.float32, 0, 4, [(0, i) for i in range(4)])
    dst = Layout.tensor_parallel((16, 4), np.float32, 1, 2, [(0, i) for i in range(4, 6)])
    first = reshard.plan(src, dst)
    assert reshard.plan(src, dst) is first and reshard.cache_info()["entries"] == 1
    again = reshard.plan(src, dst, cache=False)
    assert again == first and hash(again) == hash(first) and again is not first
    assert "global" in str(first) and "1 -> 1 tensors" in str(first)
    other = reshard.plan(src, dst, split_bytes=7, cache=False)
    assert other.key != first.key
