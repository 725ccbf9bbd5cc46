"""Layouts: analytic mesh layouts against JAX's own shard indices, PyTorch-side and explicit layouts."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_amem.reshard import Layout, LayoutError, Owner

MESH_SHAPES = [(8,), (4, 2), (2, 4), (2, 2, 2), (1, 8), (8, 1), (2, 1, 4)]


@st.composite
def mesh_and_spec(draw, rank):
    shape = draw(st.sampled_from(MESH_SHAPES))
    names = tuple("abc"[: len(shape)])
    order = draw(st.permutations(range(8)))
    unused = list(names)
    spec = []
    for _ in range(rank):
        if not unused or draw(st.booleans()):
            spec.append(None)
            continue
        axes = draw(st.lists(st.sampled_from(unused), min_size=1, max_size=len(unused), unique=True))
        unused = [a for a in unused if a not in axes]
        spec.append(axes[0] if len(axes) == 1 and draw(st.booleans()) else tuple(axes))
    mesh = Mesh(np.array(jax.devices())[list(order)].reshape(shape), names)
    return mesh, P(*spec)


def parts(mesh, spec, dim):
    entry = spec[dim] if dim < len(spec) else None
    names = () if entry is None else (entry,) if isinstance(entry, str) else entry
    return int(np.prod([mesh.shape[n] for n in names], dtype=np.int64))


@settings(max_examples=80, deadline=None)
@given(data=st.data(), rank=st.integers(0, 3))
def test_mesh_layout_matches_devices_indices_map(data, rank):
    mesh, spec = data.draw(mesh_and_spec(rank))
    shape = tuple(parts(mesh, spec, d) * data.draw(st.integers(0, 3)) for d in range(rank))
    sharding = NamedSharding(mesh, spec)
    layout = Layout.from_sharding(sharding, shape, np.float32)
    assert layout.tiles()
    for device, index in sharding.devices_indices_map(shape).items():
        want = tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape))
        assert layout.shard_slices((device.process_index, device.id)) == want


def test_uneven_splits_follow_ceil_chunks_like_torch_chunk():
    torch = pytest.importorskip("torch")  # the oracle; the rest of this file needs no torch
    owners = [(0, i) for i in range(4)]
    layout = Layout.tensor_parallel((5, 3), np.float32, 0, 4, owners)
    x = torch.arange(15).reshape(5, 3)
    chunks = list(torch.chunk(x, 4, dim=0))  # torch gives 3 chunks of ceil(5/4)=2 rows; the 4th rank is empty
    chunks += [x[5:]] * (4 - len(chunks))
    for owner, chunk in zip(owners, chunks):
        assert torch.equal(x[layout.shard_slices(owner)], chunk)
    assert layout.shard_box(owners[3]) == ((5, 0), (0, 3))
    assert layout.tiles()


def test_mesh_of_thousands_of_fake_devices_is_analytic():
    ids = np.arange(4096).reshape(16, 16, 16)
    layout = Layout.from_mesh(ids, ("fsdp", "expert", "tensor"), P("expert", "fsdp", "tensor"),
                              (384, 7168, 2048), ml_dtypes.bfloat16, devices_per_process=8)
    assert len(layout.owners) == 4096 and len(layout.starts) == 4096
    owner = Owner(4095 // 8, 4095)  # mesh coords (15, 15, 15)
    assert layout.shard_box(owner) == ((15 * 24, 15 * 448, 15 * 128), (24, 448, 128))
    assert layout.tiles()


def test_partially_replicated_layout_groups_replicas():
    ids = np.arange(8).reshape(2, 4)
    layout = Layout.from_mesh(ids, ("dp", "tp"), P(None, "tp"), (6, 8), np.float32)
    assert len(layout.starts) == 4 and layout.max_replicas == 2
    assert sorted(len(g) for g in layout.box_owners) == [2, 2, 2, 2]


def test_single_device_and_replicated_and_expert_layouts():
    device = jax.devices()[3]
    single = Layout.from_sharding(jax.sharding.SingleDeviceSharding(device), (4, 2), np.int8)
    assert single.owners == (Owner(device.process_index, 3),) and single.shard_box(single.owners[0]) == ((0, 0), (4, 2))
    rep = Layout.replicated((3,), np.float32, [(0, 0), (1, 8)])
    assert rep.max_replicas == 2 and rep.tiles()
    ep = Layout.expert_parallel((8, 4, 6), np.float32, ep=4, owners=[(0, i) for i in range(8)], tp_dim=2, tp=2)
    assert ep.shard_box((0, 3)) == ((2, 0, 3), (2, 4, 3))  # expert rank 1, tensor rank 1


def test_explicit_boxes_and_their_checks():
    layout = Layout.from_boxes((4, 4), np.float32, {(0, 0): ((0, 0), (4, 2)), (0, 1): ((0, 2), (4, 2))})
    assert layout.tiles()
    gap = Layout.from_boxes((4, 4), np.float32, {(0, 0): ((0, 0), (4, 2))})
    with pytest.raises(LayoutError, match=r"source tensor 'w'.*region \[0:4, 2:4\] is not held"):
        gap.require_tiling("w")
    with pytest.raises(LayoutError, match="outside the shape"):
        Layout.from_boxes((4, 4), np.float32, {(0, 0): ((0, 0), (5, 4))})
    with pytest.raises(LayoutError, match="appears twice"):
        Layout.replicated((2,), np.float32, [(0, 1), (0, 1)])
    with pytest.raises(LayoutError, match="not a multiple"):
        Layout.tensor_parallel((4,), np.float32, 0, 3, [(0, 0), (0, 1)])


def test_bad_partition_specs_name_the_problem():
    ids = np.arange(8).reshape(4, 2)
    with pytest.raises(LayoutError, match="does not have"):
        Layout.from_mesh(ids, ("a", "b"), P("c"), (8,), np.float32)
    with pytest.raises(LayoutError, match="twice"):
        Layout.from_mesh(ids, ("a", "b"), P("a", "a"), (8, 8), np.float32)
    with pytest.raises(LayoutError, match="rank 1"):
        Layout.from_mesh(ids, ("a", "b"), P("a", "b"), (8,), np.float32)
    with pytest.raises(LayoutError, match="give a process for every device"):
        Layout.from_mesh(ids, ("a", "b"), P("a"), (8,), np.float32, processes=np.zeros(3))


def test_layouts_compare_and_hash_by_content():
    a = Layout.tensor_parallel((8, 2), np.float32, 0, 2, [(0, 0), (0, 1)])
    b = Layout.from_boxes((8, 2), np.float32, {(0, 0): ((0, 0), (4, 2)), (0, 1): ((4, 0), (4, 2))})
    assert a == b and hash(a) == hash(b)
    assert a != a.with_dtype(ml_dtypes.bfloat16)
