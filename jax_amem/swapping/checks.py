"""Checks on what a swap is given, run before the first byte moves (or the first buffer is
donated): each raises SwapError naming the argument or the destination and what to do.

Small functions the destinations (destinations.py), the front door and the IPC parser call,
so the fast path stays theirs: what runs on every swap is a few C-level passes over the
leaves or tensors; what needs more (every buffer's address) runs once per cached program.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Mapping

import numpy as np

from .. import _jax_compat
from .errors import SwapError

# ----------------------------------------------------------------------------- swap(...) arguments


def swap_arguments(rules, plan, verify, progress):
    """`rules` None or Rule/Piece objects, `plan` None or a reshard.Plan, `verify` and
    `progress` flags: a wrong kind is named here, not as an AttributeError deep in planning.
    Returns the rules as a list (a generator is read once, here)."""
    from ..reshard import Piece, Plan, Rule

    if plan is not None and rules is not None:
        raise SwapError("give rules or plan, not both: a plan already holds its rules (nothing was written)")
    if plan is not None and not isinstance(plan, Plan):
        raise SwapError(f"plan= must be a jax_amem.reshard.Plan (from jax_amem.reshard.plan(...)), got "
                        f"{_kind(plan)}: nothing was written")
    if rules is not None:
        if isinstance(rules, (str, bytes, Mapping)) or not isinstance(rules, Iterable):
            raise SwapError(f"rules= must be a list of jax_amem.reshard rules (Rule or Piece, e.g. "
                            f"jax_amem.reshard.rules.hf_llama(n)), got {_kind(rules)}: nothing was written")
        rules = list(rules)
        if not all(map(isinstance, rules, itertools.repeat((Rule, Piece)))):
            i, rule = next((i, r) for i, r in enumerate(rules) if not isinstance(r, (Rule, Piece)))
            raise SwapError(f"rules[{i}] is {_kind(rule)}, not a jax_amem.reshard Rule or Piece "
                            "(see jax_amem.reshard.rules): nothing was written")
    for name, value, none in (("verify", verify, ""), ("progress", progress, " or None (auto)")):
        if not (isinstance(value, (bool, np.bool_)) or (none and value is None)):
            raise SwapError(f"{name}= must be True or False{none}, got {_kind(value)}: nothing was written")
    return rules


def _kind(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


# ----------------------------------------------------------------------------- destinations as given


def not_a_sequence_of_tensors(dst) -> None:
    """Tensors given as a list or tuple, not by name: the swap needs the names."""
    from .torch_bridge import is_tensor

    if isinstance(dst, (list, tuple)) and any(map(is_tensor, dst)):
        raise SwapError(f"destination is a {type(dst).__name__} of {len(dst)} torch tensors: give them by name, "
                        "as a mapping (dict(model.named_parameters()) or model.state_dict())")


# ----------------------------------------------------------------------------- JAX destinations


def shards_of(array) -> list:
    """Every single-device array of `array`, in the order of `addressable_shards`."""
    arrays = _jax_compat.shard_arrays(array)  # fast; the public fallback below
    return list(arrays) if arrays is not None else [s.data for s in array.addressable_shards]


def _buffers(named_arrays) -> dict:
    """{address: name} of every buffer of the non-empty arrays (one per shard)."""
    out = {}
    for name, array in named_arrays:
        if array.size:  # an array's shards are all empty or all not (nbytes: 10x slower to read)
            for shard in shards_of(array):
                out.setdefault(shard.unsafe_buffer_pointer(), name)
    return out


def jax_destinations(names, leaves, sources) -> dict:
    """Before anything is donated: every destination a distinct live array whose buffers are
    its own: not named twice (a tied weight), not a source, sharing no buffer with another
    destination or a source (`jax.device_put(params, shardings)` returns the source's
    buffers where the sharding is equivalent), no deleted shard. Donating such a buffer
    twice, or a source's, fails inside XLA after earlier groups were donated. Returns
    {name: [single-device arrays]}: after a partial donation an array's shards can no longer
    be asked of it, so a swap that must hand them back keeps them from here. `sources` None:
    none in this process (the rollout's end of a cross-host swap)."""
    first = {}
    for name, leaf in zip(names, leaves):
        other = first.setdefault(id(leaf), name)
        if other != name:
            raise SwapError(f"destinations {other!r} and {name!r} are the same jax.Array (tied weights?): each "
                            "destination is donated, so give each array once and drop the other's rule "
                            "(nothing was donated)")
    source_arrays = {} if sources is None else sources.arrays
    source_ids = dict(zip(map(id, source_arrays.values()), source_arrays))
    for name, leaf in zip(names, leaves):
        if id(leaf) in source_ids:
            raise SwapError(f"destination {name!r} is source {source_ids[id(leaf)]!r} itself: the swap donates its "
                            "destinations, which would delete the source; give the rollout its own arrays "
                            "(e.g. jax.device_put(x, sharding, may_alias=False)); nothing was donated")
    mine, shards = {}, {}
    for name, leaf in zip(names, leaves):
        shards[name] = shards_of(leaf)
        if not leaf.size:
            continue  # no byte: never donated
        for k, shard in enumerate(shards[name]):
            try:
                address = shard.unsafe_buffer_pointer()
            except RuntimeError:  # deleted: one shard of an array can be (donated alone)
                raise SwapError(f"destination {name!r} has a deleted shard (its shard {k}; donated or freed): "
                                "pass live arrays (nothing was donated)") from None
            other = mine.setdefault(address, name)
            if other != name:
                raise SwapError(f"destinations {other!r} and {name!r} share a buffer on {shard.device}: each "
                                "destination is donated, so give each buffer once (nothing was donated)")
    theirs = _buffers(source_arrays.items())
    for address, name in mine.items():
        if address in theirs:
            raise SwapError(f"destination {name!r} shares a buffer with source {theirs[address]!r} (made with "
                            "jax.device_put(params, ...) for an equivalent sharding, which returns the source's "
                            "buffers?): the swap would donate, so delete, the source's memory. Give the rollout "
                            "arrays of its own: jax.device_put(x, sharding, may_alias=False) or x.copy() "
                            "(nothing was donated)")
    return shards


# ----------------------------------------------------------------------------- PyTorch destinations

_strided = operator.attrgetter("layout")


def torch_tensor_kinds(tensors: Mapping) -> None:
    """What a write of a tensor's memory by address cannot honour, named per tensor: a
    layout other than strided (sparse, mkldnn: no one row-major buffer), the conjugate or
    negative bit (a lazy `t.conj()` / `torch._neg_view(t)`: the memory is read back
    conjugated or negated, so the swap's bytes would not be what reads see)."""
    import torch

    values = tensors.values()
    if all(map(operator.is_, map(_strided, values), itertools.repeat(torch.strided))) and not (
            any(map(torch.Tensor.is_conj, values)) or any(map(torch.Tensor.is_neg, values))):
        return
    for name, tensor in tensors.items():
        if tensor.layout != torch.strided:
            raise SwapError(f"destination {name!r} is a {tensor.layout} tensor: the swap writes one dense "
                            "row-major buffer per tensor; give the dense tensor (t.to_dense()) and load it into "
                            "the sparse one after, or keep dense weights (nothing was written)")
        if tensor.is_conj() or tensor.is_neg():
            bit, fix = ("conjugate", "resolve_conj") if tensor.is_conj() else ("negative", "resolve_neg")
            raise SwapError(f"destination {name!r} has its {bit} bit set (a lazy view such as t.conj() or "
                            f"torch._neg_view(t)): its memory reads back transformed, so the swap's bytes would "
                            f"not be what PyTorch reads. Give the tensor itself, or t.{fix}() (a new tensor) "
                            "(nothing was written)")


def torch_not_jax_memory(named_ranges) -> None:
    """Destinations (name, address, nbytes) that lie in a live jax.Array's buffer: a
    `jax_amem.to_torch()` / `torch.from_dlpack(array)` view of a JAX array (JAX exports read
    only: jax.Arrays are immutable), or a tensor a JAX array imported zero-copy. Reads every
    live array's buffer addresses: run once per cached program, not per swap."""
    ranges = sorted((start, start + nbytes, name) for name, start, nbytes in named_ranges if nbytes > 0)
    if not ranges:
        return
    import jax

    starts = np.array([r[0] for r in ranges], np.int64)
    for array in jax.live_arrays():
        for shard in shards_of(array):
            try:
                nbytes = shard.nbytes
                start = shard.unsafe_buffer_pointer() if nbytes else 0
            except Exception:  # noqa: BLE001 - a buffer being deleted meanwhile: not a live one
                continue
            if not nbytes:
                continue
            k = int(np.searchsorted(starts, start + nbytes)) - 1  # the last destination starting before its end
            if k >= 0 and ranges[k][1] > start:  # destinations are disjoint (check_disjoint ran first)
                raise SwapError(f"destination {ranges[k][2]!r} is memory of a live jax.Array (shape "
                                f"{tuple(array.shape)}, {array.dtype}): a jax_amem.to_torch() or "
                                "torch.from_dlpack view of a JAX array, which is read only (jax.Arrays are "
                                "immutable). Swap into the JAX arrays themselves, or into tensors PyTorch "
                                "allocated (nothing was written)")


def mark_written(tensors) -> None:
    """What `copy_` does to a tensor it writes: bump its autograd version counter, so a graph
    that saved the old values (a parameter used in a forward pass) refuses backward() instead
    of using the new values silently. One C call for every tensor."""
    import torch

    torch.autograd.graph.increment_version(list(tensors))


# ----------------------------------------------------------------------------- IPC descriptors


def whole_number(entry_name: str, key: str, value) -> int:
    """A descriptor field that must be an int (JSON gives ints): SwapError naming the field."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise SwapError(f"descriptor entry {entry_name!r}: {key} is {_kind(value)}, not an int: give the "
                        "descriptor exactly as export_tensors made it")
    return int(value)


def shape_field(entry_name: str, value) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise SwapError(f"descriptor entry {entry_name!r}: shape is {_kind(value)}, not a list of ints: give the "
                        "descriptor exactly as export_tensors made it")
    return tuple(whole_number(entry_name, f"shape[{i}]", n) for i, n in enumerate(value))
