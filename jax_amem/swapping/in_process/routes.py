"""The routes: how a scheduled group (schedule.py) becomes one jitted call. Each prepares the
source views the group needs (transpose + cast, as the plan's `views` say) and copies:

- "addresses" (PyTorch tensors, another process's tensors over CUDA IPC): one
  `segment_copy_to_addresses` per chunk writes straight into the tensors' memory, at the
  addresses the destination gives (`data_ptr()`), on XLA's stream. Nothing is imported or
  donated, so a call creates no JAX arrays besides one token per chunk, and XLA:CPU writes in
  place too. Rows of at least jax_amem.copy.BULK_BYTES run as one driver copy each. The
  addresses are attributes of the custom calls, so a program serves one set of addresses:
  tensors that moved (a reloaded model) get a program of their own (the addresses are part of
  its cache key). The swap holds the tensors, checks every address against its tensor before
  the call, and blocks until the copy is done, so no address outlives its memory.
- "batched" (jax.Arrays): one `segment_copy_many` per chunk into donated buffers, one CUDA
  kernel launch each, for up to 512 source views and 512 destination buffers (measured on the
  H200: 2000 small arrays in 4 launches; docs/benchmarks.md).

Views with constant steps (a plan's `affines`): XLA prepares them transposed only, in the
source's dtype, and their rows run as affine rows (`affine_copy_to_addresses`,
`affine_copy_many`) beside the byte rows of the same chunk (swapping/affine_views.py).
"""

from __future__ import annotations

import jax

from ...affine_copy import affine_copy_many, affine_copy_to_addresses
from ...copy import segment_copy_many, segment_copy_to_addresses
from ..affine_views import prepared_views, split_rows
from ..sources import prepare_view
from .schedule import Group


def choose(destination) -> tuple:
    """The route for `destination`, as part of every program's cache key: ("addresses",
    its addresses) for a destination written by address (moved tensors get a program of
    their own); else ("batched",)."""
    if destination.writes_by_address:
        return ("addresses", destination.addresses())
    return ("batched",)


def jitted(group: Group, views, route: str, plan=None):
    """The jitted call of `group` on `route`: fn(source shards) -> tokens (addresses; None
    when PyTorch makes every copy of the group, torch_copies.py), or fn(source shards,
    donated buffers) -> the written buffers (batched). `views`: the plan's (src name, perm,
    dtype) per view; `plan`: read for views with constant steps."""
    affine = plan is not None and bool(plan.affines)
    if affine:
        views = prepared_views(plan)
    if route == "addresses":
        if not group.chunks:
            return None
        if affine:
            return _to_addresses_affine(group, views, plan)
        return _to_addresses(group.chunks, views, group.targets)
    return _batched(group.chunks, views, _chunk_splits(group, plan)) if affine else _batched(group.chunks, views)


def _slots(group: Group, keys):
    """(view, owner of the shard) per (source operand, view) key."""
    return [(view, group.sources[operand][1]) for operand, view in keys]


def _chunk_splits(group: Group, plan):
    return [split_rows(plan, _slots(group, chunk.views), chunk.rows) for chunk in group.chunks]


def _to_addresses_affine(group: Group, views, plan):
    """The address route with views with constant steps: per chunk, the byte rows and the
    affine rows as two custom calls on the same sources."""
    chunks, targets = group.chunks, group.targets
    splits = _chunk_splits(group, plan)
    dtypes = [plan.dst_layouts[name].dtype for name, _ in group.buffers]

    def run(sources):
        prepared = _Views(sources, views)
        tokens = []
        for chunk, split in zip(chunks, splits):
            srcs = [prepared[k] for k in chunk.views]
            addresses = [targets[b][0] for b in chunk.buffers]
            sizes = [targets[b][1] for b in chunk.buffers]
            if len(split.byte_rows):
                tokens.append(segment_copy_to_addresses(srcs, addresses, sizes, split.byte_rows))
            if split.table is not None:
                tokens.append(affine_copy_to_addresses(srcs, addresses, sizes, split.affine_rows, split.table,
                                                       [dtypes[b] for b in chunk.buffers]))
        return tuple(tokens)

    return jax.jit(run)


class _Views:
    """A call's prepared source views, each made once per call (traced inside the jit)."""

    def __init__(self, sources, views):
        self.sources, self.views, self.made = sources, views, {}

    def __getitem__(self, key):
        """(source operand, plan view) -> that operand transposed and cast as the view says."""
        if key not in self.made:
            self.made[key] = prepare_view(self.sources[key[0]], *self.views[key[1]][1:])
        return self.made[key]


def _to_addresses(chunks, views, targets):
    """Sources in, one token per chunk out; `targets[position]` is the (address, bytes) of
    the group's destination buffer at that position."""

    def run(sources):
        prepared = _Views(sources, views)
        return tuple(segment_copy_to_addresses([prepared[k] for k in chunk.views],
                                               [targets[b][0] for b in chunk.buffers],
                                               [targets[b][1] for b in chunk.buffers], chunk.rows)
                     for chunk in chunks)

    return jax.jit(run)


def _batched(chunks, views, splits=None):
    """Sources in, destination buffers donated and returned written, one segment_copy_many
    per chunk (a buffer continued in a later chunk is that chunk's operand as written so far);
    `splits`: per chunk, its rows split for views with constant steps (one affine_copy_many more)."""

    def run(sources, destinations):
        out = list(destinations)
        prepared = _Views(sources, views)
        for k, chunk in enumerate(chunks):
            srcs = [prepared[key] for key in chunk.views]
            split = splits[k] if splits is not None else None
            rows = chunk.rows if split is None else split.byte_rows
            if split is None or len(rows):
                written = segment_copy_many(srcs, [out[b] for b in chunk.buffers], rows)
                for position, array in zip(chunk.buffers, written):
                    out[position] = array
            if split is not None and split.table is not None:
                written = affine_copy_many(srcs, [out[b] for b in chunk.buffers], split.affine_rows, split.table)
                for position, array in zip(chunk.buffers, written):
                    out[position] = array
        return tuple(out)

    return jax.jit(run, donate_argnums=1)
