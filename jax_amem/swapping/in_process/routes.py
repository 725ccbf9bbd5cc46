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
"""

from __future__ import annotations

import jax

from ...copy import segment_copy_many, segment_copy_to_addresses
from ..sources import prepare_view
from .schedule import Group

def choose(destination) -> tuple:
    """The route for `destination`, as part of every program's cache key: ("addresses",
    its addresses) for a destination written by address (moved tensors get a program of
    their own); else ("batched",)."""
    if destination.writes_by_address:
        return ("addresses", destination.addresses())
    return ("batched",)


def jitted(group: Group, views, route: str):
    """The jitted call of `group` on `route`: fn(source shards) -> tokens (addresses; None
    when PyTorch makes every copy of the group, torch_copies.py), or fn(source shards,
    donated buffers) -> the written buffers (batched). `views`: the plan's (src name, perm,
    dtype) per view."""
    if route == "addresses":
        return _to_addresses(group.chunks, views, group.targets) if group.chunks else None
    return _batched(group.chunks, views)


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


def _batched(chunks, views):
    """Sources in, destination buffers donated and returned written, one segment_copy_many
    per chunk (a buffer continued in a later chunk is that chunk's operand as written so far)."""

    def run(sources, destinations):
        out = list(destinations)
        prepared = _Views(sources, views)
        for chunk in chunks:
            written = segment_copy_many([prepared[k] for k in chunk.views], [out[b] for b in chunk.buffers],
                                        chunk.rows)
            for position, array in zip(chunk.buffers, written):
                out[position] = array
        return tuple(out)

    return jax.jit(run, donate_argnums=1)
