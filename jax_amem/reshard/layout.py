"""Layouts: how one logical tensor (global shape, dtype) is split among owners.

An owner is `(process, device)`. `process` says which host-level process holds
the shard (the planner treats two owners with the same process as linked by
NVLink, different processes as linked by the network); `device` is a global
device id. Give the same `(process, device)` to the same GPU on the trainer and
the rollout side and the planner sees copies that never leave the device.

A layout is stored as its distinct boxes (offset and size per dimension) and,
for each owner, which box it holds. Replicas are owners holding the same box.
Uneven splits follow JAX's (and `torch.chunk`'s) rule: every shard has
`ceil(n / parts)` elements, so the last shards are smaller or empty.
"""

from __future__ import annotations

import functools
import hashlib
import operator
from typing import Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import LayoutError

MAX_RANK = 8  # the native planner pads every tensor to this many dimensions


class Owner(NamedTuple):
    """Who holds a shard: a host-level process and a global device id."""

    process: int
    device: int


def _as_owner(owner) -> Owner:
    if isinstance(owner, Owner):
        return owner
    try:
        process, device = owner
        return Owner(operator.index(process), operator.index(device))
    except (TypeError, ValueError):
        raise LayoutError(f"owner {owner!r} must be a (process, device) pair of ints") from None


def _owners(owners, what: str) -> list[Owner]:
    """A list of owners; LayoutError for anything that is not an iterable of (process, device) pairs."""
    if isinstance(owners, (str, bytes)) or not hasattr(owners, "__iter__"):
        raise LayoutError(f"{what}: owners={owners!r:.60} is not a list of (process, device) pairs")
    return [_as_owner(o) for o in owners]


def _ints(values, what: str) -> tuple[int, ...]:
    """A shape, an offset or a size as a tuple of ints; LayoutError for anything else (2.5, '3')."""
    try:
        return tuple(operator.index(n) for n in values)
    except TypeError:
        raise LayoutError(f"{what} {values!r} must be a sequence of ints") from None


def _dtype(dtype) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError:
        raise LayoutError(f"dtype {dtype!r} is not a dtype numpy knows (e.g. 'float32', jnp.bfloat16)") from None


class Layout:
    """How one tensor of `shape` and `dtype` is split among owners.

    Build one with a constructor (`from_sharding`, `from_mesh`, `tensor_parallel`,
    `expert_parallel`, `replicated`, `from_boxes`, `single`) rather than directly.
    Layouts are immutable, hashable and compared by content.
    """

    def __init__(self, shape, dtype, owners, starts, sizes, box_of_owner):
        self.shape = _ints(shape, "shape")
        self.dtype = _dtype(dtype)
        self.owners = tuple(_owners(owners, "Layout"))
        try:
            self.starts = _box_array(starts, len(self.shape))
            self.sizes = _box_array(sizes, len(self.shape))
            self.box_of_owner = np.ascontiguousarray(box_of_owner, dtype=np.int64).reshape(-1)
        except (TypeError, ValueError, OverflowError) as error:
            raise LayoutError(f"Layout: starts, sizes and box_of_owner are int64 arrays, one row of {len(self.shape)} "
                              f"per box and one box per owner ({error}); build layouts with Layout.single, "
                              "replicated, tensor_parallel or from_boxes") from None
        self._validate()
        for array in (self.starts, self.sizes, self.box_of_owner):
            array.flags.writeable = False

    # -- checks -------------------------------------------------------------------------------

    def _validate(self) -> None:
        if len(self.shape) > MAX_RANK:
            raise LayoutError(f"tensors of rank {len(self.shape)} are not supported (at most {MAX_RANK})")
        if any(n < 0 for n in self.shape):
            raise LayoutError(f"negative dimension in shape {self.shape}")
        if len(set(self.owners)) != len(self.owners):
            seen, repeated = set(), None
            for owner in self.owners:
                if owner in seen:
                    repeated = owner
                    break
                seen.add(owner)
            raise LayoutError(f"owner {repeated} appears twice; each owner holds one shard of a tensor")
        if len(self.box_of_owner) != len(self.owners):
            raise LayoutError("box_of_owner must give one box per owner")
        if len(self.owners) and (self.box_of_owner.min() < 0 or self.box_of_owner.max() >= len(self.starts)):
            raise LayoutError("box_of_owner names a box that does not exist")
        unheld = sorted(set(range(len(self.starts))) - set(self.box_of_owner.tolist()))
        if unheld:  # e.g. Layout.replicated(shape, dtype, owners=[]): the planner would divide by its 0 replicas
            raise LayoutError(f"box {self.box_text(unheld[0])} is held by no owner (owners: {list(self.owners)}): "
                              "give every box at least one owner")
        shape = np.array(self.shape, dtype=np.int64)
        if (self.starts < 0).any() or (self.sizes < 0).any() or (self.starts + self.sizes > shape).any():
            bad = int(np.nonzero(((self.starts < 0) | (self.sizes < 0)
                                  | (self.starts + self.sizes > shape)).any(axis=1))[0][0])
            raise LayoutError(f"box {self.box_text(bad)} is outside the shape {self.shape}")

    @functools.cached_property
    def digest(self) -> bytes:
        """A content hash: equal layouts have equal digests."""
        h = hashlib.sha256()
        h.update(repr((self.shape, self.dtype.str, self.dtype.name)).encode())
        h.update(np.array(self.owners, dtype=np.int64).tobytes())
        h.update(self.starts.tobytes())
        h.update(self.sizes.tobytes())
        h.update(self.box_of_owner.tobytes())
        return h.digest()

    def __eq__(self, other):
        return isinstance(other, Layout) and self.digest == other.digest

    def __hash__(self):
        return hash(self.digest)

    def __repr__(self):
        return (f"Layout(shape={self.shape}, dtype={self.dtype.name}, owners={len(self.owners)}, "
                f"boxes={len(self.starts)}, replicas<={self.max_replicas})")

    # -- views --------------------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @functools.cached_property
    def box_owners(self) -> tuple[tuple[int, ...], ...]:
        """For each distinct box, the indices (into `owners`) of the owners holding it."""
        groups: list[list[int]] = [[] for _ in range(len(self.starts))]
        for index, box in enumerate(self.box_of_owner.tolist()):
            groups[box].append(index)
        return tuple(tuple(g) for g in groups)

    @property
    def max_replicas(self) -> int:
        return max((len(g) for g in self.box_owners), default=0)

    def box_text(self, box: int) -> str:
        return _region_text(self.starts[box], self.sizes[box])

    def shard_box(self, owner) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(offset, shape) of the shard `owner` holds. KeyError if it holds none."""
        index = self.owner_index[_as_owner(owner)]
        box = int(self.box_of_owner[index])
        return tuple(self.starts[box].tolist()), tuple(self.sizes[box].tolist())

    def shard_slices(self, owner) -> tuple[slice, ...]:
        start, size = self.shard_box(owner)
        return tuple(slice(a, a + n) for a, n in zip(start, size))

    @functools.cached_property
    def owner_index(self) -> dict[Owner, int]:
        return {owner: i for i, owner in enumerate(self.owners)}

    def with_dtype(self, dtype) -> "Layout":
        return Layout(self.shape, dtype, self.owners, self.starts, self.sizes, self.box_of_owner)

    def tiles(self) -> bool:
        """True when the non-empty distinct boxes cover every element exactly once.

        A source layout must tile its tensor, so that each element has one box
        and the replicas of that box are the owners that can send it.
        """
        return self._tiling_problem is None

    @functools.cached_property
    def _tiling_problem(self) -> str | None:
        keep = self.sizes.prod(axis=1) > 0 if self.ndim else np.ones(len(self.starts), bool)
        starts, sizes = self.starts[keep], self.sizes[keep]
        total = int(np.prod(self.shape, dtype=np.int64))
        covered = int(sizes.prod(axis=1).sum()) if self.ndim else int(keep.sum())
        if total == 0:
            return None
        cuts = [np.unique(np.concatenate([[0, self.shape[d]], starts[:, d], starts[:, d] + sizes[:, d]]))
                for d in range(self.ndim)]
        cells = int(np.prod([len(c) - 1 for c in cuts], dtype=np.int64))
        if cells > 1 << 22:  # a pathological explicit layout: fall back to volumes only
            return None if covered == total else f"boxes cover {covered} of {total} elements"
        count = np.zeros([len(c) - 1 for c in cuts], dtype=np.int32)
        for start, size in zip(starts, sizes):
            index = tuple(slice(np.searchsorted(c, a), np.searchsorted(c, a + n))
                          for c, a, n in zip(cuts, start.tolist(), size.tolist()))
            count[index] += 1
        if (count == 1).all():
            return None
        bad = tuple(int(i) for i in np.argwhere(count != 1)[0])
        start = [int(c[i]) for c, i in zip(cuts, bad)]
        size = [int(c[i + 1] - c[i]) for c, i in zip(cuts, bad)]
        how = "is not held by any owner" if count[bad] == 0 else f"is held by {count[bad]} different boxes"
        return f"region {_region_text(start, size)} {how}"

    def require_tiling(self, name: str) -> None:
        problem = self._tiling_problem
        if problem is not None:
            raise LayoutError(f"source tensor {name!r}: its layout does not tile the tensor: {problem}. "
                              "A source layout must hold every element in exactly one distinct box "
                              "(replicas hold the same box).")

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def from_boxes(cls, shape, dtype, boxes: Mapping) -> "Layout":
        """Explicit shards: `{owner: (offset, shape)}`; equal boxes are replicas."""
        shape = _ints(shape, "shape")
        owners, box_of_owner, distinct = [], [], {}
        if not isinstance(boxes, Mapping):
            raise LayoutError(f"boxes must be a mapping {{owner: (offset, size)}}, got {type(boxes).__name__}")
        for owner, box in boxes.items():
            if not (isinstance(box, (tuple, list)) and len(box) == 2):
                raise LayoutError(f"the box of owner {owner} must be an (offset, size) pair, got {box!r}")
            offset, size = _ints(box[0], f"offset of owner {owner}"), _ints(box[1], f"size of owner {owner}")
            if len(offset) != len(shape) or len(size) != len(shape):
                raise LayoutError(f"box {offset}/{size} of owner {owner} has the wrong rank for shape {shape}")
            owners.append(_as_owner(owner))
            box_of_owner.append(distinct.setdefault((offset, size), len(distinct)))
        keys = list(distinct)
        starts = [k[0] for k in keys] or np.zeros((0, len(shape)))
        sizes = [k[1] for k in keys] or np.zeros((0, len(shape)))
        return cls(shape, dtype, owners, starts, sizes, box_of_owner)

    @classmethod
    def single(cls, shape, dtype, owner) -> "Layout":
        """The whole tensor on one owner."""
        shape = _ints(shape, "shape")
        return cls.from_boxes(shape, dtype, {_as_owner(owner): ((0,) * len(shape), shape)})

    @classmethod
    def replicated(cls, shape, dtype, owners: Iterable) -> "Layout":
        """Every owner holds the whole tensor."""
        owners = _owners(owners, "replicated")
        shape = _ints(shape, "shape")
        return cls(shape, dtype, owners, [(0,) * len(shape)], [shape], [0] * len(owners))

    @classmethod
    def tensor_parallel(cls, shape, dtype, dim: int, tp: int, owners: Sequence) -> "Layout":
        """PyTorch-style tensor parallelism: `dim` split into `tp` chunks.

        `owners` lists ranks in order; when it holds `k * tp` owners they form
        `k` replicas of the tensor-parallel group (owners[j*tp + r] is rank r of
        replica j), as data-parallel rollout replicas do.
        """
        return _split_layout(shape, dtype, owners, {_ints((dim,), "tensor_parallel: dimension")[0]: tp},
                             what="tensor_parallel")

    @classmethod
    def expert_parallel(cls, shape, dtype, ep: int, owners: Sequence, dim: int = 0,
                        tp_dim: int | None = None, tp: int = 1) -> "Layout":
        """Experts (axis `dim`, default 0) split over `ep` ranks, optionally each expert's
        `tp_dim` split over `tp` ranks inside an expert-parallel rank. Owners are
        ordered replica-major, then expert rank, then tensor rank."""
        splits = {dim: ep}
        if tp_dim is not None:
            if tp_dim == dim:
                raise LayoutError("tp_dim must differ from the expert dimension")
            splits[tp_dim] = tp
        return _split_layout(shape, dtype, owners, splits, what="expert_parallel")

    @classmethod
    def from_mesh(cls, device_ids, axis_names, spec, shape, dtype, processes=None,
                  devices_per_process: int | None = None) -> "Layout":
        """A JAX mesh + PartitionSpec layout, computed from an array of device ids.

        `device_ids` has the mesh's shape; the devices need not exist, so layouts
        over thousands of devices can be planned anywhere. `processes` (same
        shape) gives each device's process; else `device // devices_per_process`;
        else process 0 for all.
        """
        return _mesh_layout(device_ids, axis_names, spec, shape, dtype, processes, devices_per_process)

    @classmethod
    def from_sharding(cls, sharding, shape, dtype) -> "Layout":
        """The layout of a JAX sharding (NamedSharding analytically, any other through
        `devices_indices_map`)."""
        return _sharding_layout(sharding, shape, dtype)

    @classmethod
    def of(cls, array) -> "Layout":
        """The layout of a jax.Array (or anything with .shape, .dtype and .sharding)."""
        return cls.from_sharding(array.sharding, array.shape, array.dtype)


def _box_array(values, ndim: int) -> np.ndarray:
    """(boxes, ndim) int64; a rank-0 tensor has boxes with no coordinates."""
    array = np.asarray(values, dtype=np.int64)
    count = array.shape[0] if array.ndim >= 1 else 0
    return np.ascontiguousarray(array.reshape(count, ndim))


def _region_text(start, size) -> str:
    return "[" + ", ".join(f"{int(a)}:{int(a) + int(n)}" for a, n in zip(start, size)) + "]"


def region_text(start, size) -> str:
    """`[a:b, c:d]`: how errors name a region of a tensor."""
    return _region_text(start, size)


def _split_layout(shape, dtype, owners, splits: dict[int, int], what: str) -> "Layout":
    shape = _ints(shape, f"{what}: shape")
    owners = _owners(owners, what)
    splits = dict(zip(_ints(splits, f"{what}: dimension"), _ints(splits.values(), f"{what}: split count")))
    if any(count >= 2**31 for count in splits.values()):
        raise LayoutError(f"{what}: split counts {list(splits.values())} are more shards than any tensor has")
    parts = int(np.prod(list(splits.values()), dtype=np.int64))
    for dim, count in splits.items():
        if not -len(shape) <= dim < len(shape):
            raise LayoutError(f"{what}: dimension {dim} does not exist in shape {shape}")
        if count < 1:
            raise LayoutError(f"{what}: split count must be >= 1, got {count}")
    if parts == 0 or len(owners) % parts:
        raise LayoutError(f"{what}: {len(owners)} owners is not a multiple of the {parts} shards")
    replicas = len(owners) // parts
    ids = np.arange(len(owners)).reshape((replicas,) + tuple(splits.values()))
    names = ("replica",) + tuple(f"split{d}" for d in splits)
    spec = [None] * len(shape)
    for dim in splits:
        spec[dim % len(shape)] = f"split{dim}"
    base = _mesh_layout(ids, names, tuple(spec), shape, dtype, processes=np.zeros_like(ids))
    # _mesh_layout lists owners in the mesh's row-major order, which is `owners`' order here.
    return Layout(shape, dtype, owners, base.starts, base.sizes, base.box_of_owner)


# -- from JAX meshes and shardings: the mesh computation needs only an array of device ids and
# the axis names, so a layout over thousands of devices is computed without those devices.

def _spec_axes(spec, ndim: int, axis_names: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The mesh axes that split each tensor dimension, checked."""
    entries = tuple(spec) if spec is not None else ()
    if len(entries) > ndim:
        raise LayoutError(f"PartitionSpec {spec} has {len(entries)} entries for a tensor of rank {ndim}")
    used: set[str] = set()
    axes = []
    for dim in range(ndim):
        entry = entries[dim] if dim < len(entries) else None
        if entry is None:
            names: tuple = ()
        elif isinstance(entry, str):
            names = (entry,)
        elif isinstance(entry, (tuple, list)):
            names = tuple(entry)
        else:
            raise LayoutError(f"PartitionSpec {spec}: entry {entry!r} for dimension {dim} is not a mesh "
                              "axis name, a tuple of them, or None (UNCONSTRAINED specs have no layout)")
        for name in names:
            if name not in axis_names:
                raise LayoutError(f"PartitionSpec {spec} names mesh axis {name!r}, which the mesh "
                                  f"(axes {axis_names}) does not have")
            if name in used:
                raise LayoutError(f"PartitionSpec {spec} uses mesh axis {name!r} twice")
            used.add(name)
        axes.append(names)
    return axes


def _mesh_layout(device_ids, axis_names, spec, shape, dtype, processes=None,
                 devices_per_process: int | None = None) -> Layout:
    ids = np.asarray(device_ids, dtype=np.int64)
    axis_names = tuple(axis_names)
    if ids.ndim != len(axis_names):
        raise LayoutError(f"mesh of shape {ids.shape} needs {ids.ndim} axis names, got {axis_names}")
    if len(np.unique(ids)) != ids.size:
        raise LayoutError("the mesh names a device id twice")
    if processes is not None:
        procs = np.asarray(processes, dtype=np.int64)
        if procs.shape != ids.shape:
            raise LayoutError(f"processes has shape {procs.shape}; the mesh has shape {ids.shape}: "
                              "give a process for every device of the mesh")
    elif devices_per_process:
        procs = ids // int(devices_per_process)
    else:
        procs = np.zeros_like(ids)
    shape = tuple(int(n) for n in shape)
    sizes_of_axis = dict(zip(axis_names, ids.shape))
    coords = np.indices(ids.shape).reshape(ids.ndim, -1).T  # (devices, mesh axes), row-major
    n = ids.size
    starts = np.zeros((n, len(shape)), dtype=np.int64)
    extents = np.zeros((n, len(shape)), dtype=np.int64)
    for dim, names in enumerate(_spec_axes(spec, len(shape), axis_names)):
        index = np.zeros(n, dtype=np.int64)
        parts = 1
        for name in names:  # the first named axis is the most significant
            axis = axis_names.index(name)
            index = index * sizes_of_axis[name] + coords[:, axis]
            parts *= sizes_of_axis[name]
        chunk = -(-shape[dim] // parts) if parts else 0
        lo = np.minimum(index * chunk, shape[dim])
        starts[:, dim] = lo
        extents[:, dim] = np.minimum(lo + chunk, shape[dim]) - lo
    if not shape:  # a scalar: one box, every device a replica
        boxes, box_of_owner = np.zeros((1, 0), np.int64), np.zeros(n, np.int64)
    else:
        boxes, box_of_owner = np.unique(np.concatenate([starts, extents], axis=1), axis=0,
                                        return_inverse=True)
    owners = list(zip(procs.reshape(-1).tolist(), ids.reshape(-1).tolist()))
    return Layout(shape, dtype, owners, boxes[:, :len(shape)], boxes[:, len(shape):],
                  np.asarray(box_of_owner).reshape(-1))


def _sharding_layout(sharding, shape, dtype) -> Layout:
    import jax

    shape = tuple(int(n) for n in shape)
    if isinstance(sharding, jax.sharding.NamedSharding):
        devices = np.asarray(sharding.mesh.devices)
        ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(devices)
        procs = np.vectorize(lambda d: d.process_index, otypes=[np.int64])(devices)
        return _mesh_layout(ids, sharding.mesh.axis_names, sharding.spec, shape, dtype, processes=procs)
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        (device,) = sharding.device_set
        return Layout.single(shape, dtype, (device.process_index, device.id))
    boxes = {}
    for device, index in sharding.devices_indices_map(shape).items():
        start, size = [], []
        for s, n in zip(index, shape):
            lo, hi, _ = s.indices(n)
            start.append(lo)
            size.append(max(hi - lo, 0))
        boxes[(device.process_index, device.id)] = (start, size)
    return Layout.from_boxes(shape, dtype, boxes)
