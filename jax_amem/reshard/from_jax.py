"""Layouts from JAX: meshes + PartitionSpecs computed analytically, shardings, parameter trees.

The mesh computation needs only an array of device ids and the axis names, so
a layout over thousands of devices is computed without those devices.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .layout import Layout, LayoutError


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


def mesh_layout(device_ids, axis_names, spec, shape, dtype, processes=None,
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


def sharding_layout(sharding, shape, dtype) -> Layout:
    import jax

    shape = tuple(int(n) for n in shape)
    if isinstance(sharding, jax.sharding.NamedSharding):
        devices = np.asarray(sharding.mesh.devices)
        ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(devices)
        procs = np.vectorize(lambda d: d.process_index, otypes=[np.int64])(devices)
        return mesh_layout(ids, sharding.mesh.axis_names, sharding.spec, shape, dtype, processes=procs)
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


def tree_names(tree) -> dict[str, Any]:
    """Flattens a pytree into `{"a/b/0": leaf}` with '/'-joined keys (dict keys,
    attribute names, sequence indices)."""
    import jax

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = []
        for key in path:
            for attr in ("key", "name", "idx"):
                if hasattr(key, attr):
                    parts.append(str(getattr(key, attr)))
                    break
            else:
                parts.append(str(key))
        out["/".join(parts)] = leaf
    return out


def names_tree(flat: dict) -> dict:
    """The inverse of `tree_names` for nested dicts: `{"a/b": x}` -> `{"a": {"b": x}}`
    (e.g. a `{name: Layout}` mapping made a tree, for `rules.from_function`)."""
    tree: dict = {}
    for path, leaf in flat.items():
        node = tree
        *parents, last = path.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = leaf
    return tree


def layouts_of(tree) -> dict[str, Layout]:
    """`{name: Layout}` for a pytree of jax.Arrays (or ShapeDtypeStructs with a sharding)."""
    out = {}
    for name, leaf in tree_names(tree).items():
        if isinstance(leaf, Layout):
            out[name] = leaf
            continue
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            raise LayoutError(f"tree leaf {name!r} has no sharding: give jax.Arrays, "
                              "ShapeDtypeStructs with a sharding, or Layouts")
        out[name] = sharding_layout(sharding, leaf.shape, leaf.dtype)
    return out
