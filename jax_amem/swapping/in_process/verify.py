"""Verification: per segment, a checksum of the source region (the sender's prepared view)
against one of the destination region; the first mismatch is named by tensor, owner and
byte offset. Runs on the host (both sides are copied there): a debugging aid, not a fast path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...reshard.numpy_exec import prepare_view
from ...reshard.plan_data import DST_OWNER, DST_TENSOR, SRC_OWNER, VIEW
from ..errors import SwapError

CHUNK = 1 << 22  # bytes checksummed per vectorised step (bounds host memory)


@dataclass(frozen=True)
class Mismatch:
    name: str
    owner: tuple
    offset: int          # byte offset in the destination shard
    index: tuple         # element index in the global tensor
    source: str
    src_offset: int      # byte offset in the source view

    def __str__(self):
        return (f"verify: destination {self.name!r} (owner {self.owner}) differs from source {self.source!r} at "
                f"byte {self.offset} of its shard (element {self.index} of the tensor; byte {self.src_offset} of "
                "the source view)")


def checksums(data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Position-weighted byte sums (mod 2**64) of the runs data[o:o+n]: a changed byte or
    two swapped bytes change the sum."""
    starts = np.cumsum(lengths) - lengths
    within = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
    values = data[np.repeat(offsets, lengths) + within].astype(np.uint64)
    return np.add.reduceat(values * (within.astype(np.uint64) + 1), starts)


def _split(rows: np.ndarray) -> np.ndarray:
    """Rows longer than CHUNK cut into CHUNK-long rows."""
    pieces = np.maximum(1, -(-rows[:, 2] // CHUNK))
    if (pieces == 1).all():
        return rows
    which = np.repeat(np.arange(len(rows)), pieces)
    k = np.arange(len(which)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    out = rows[which].copy()
    out[:, 0] += k * CHUNK
    out[:, 1] += k * CHUNK
    out[:, 2] = np.minimum(CHUNK, rows[which, 2] - k * CHUNK)
    return out


def first_mismatch(program, sources, destination, process: int):
    """The first Mismatch in plan order of what `program` wrote from `sources` (Sources: the
    shards, read back to the host) into `destination` (its `host_bytes(name, owner)`, uint8),
    or None."""
    plan = program.plan
    names, prepared = plan.dst_names, {}
    wanted = {b for g in program.groups for b in g.buffers}
    for i, row in enumerate(plan.transfers.tolist()):
        dst_owner, src_owner = plan.owner_of(row[DST_OWNER]), plan.owner_of(row[SRC_OWNER])
        name = names[row[DST_TENSOR]]
        if (name, dst_owner) not in wanted:
            continue
        src_name, perm, dtype = plan.views[row[VIEW]]
        key = (row[VIEW], src_owner)
        if key not in prepared:
            box_start, _ = plan.src_layouts[src_name].shard_box(src_owner)
            prepared[key] = prepare_view(np.asarray(sources.shard(src_name, src_owner)), perm, dtype,
                                         plan.affine(row[VIEW]), box_start).reshape(-1).view(np.uint8)
        src, dst = prepared[key], destination.host_bytes(name, dst_owner)
        rows = _split(plan.segments(i))
        bounds = np.cumsum(rows[:, 2])
        begin = 0
        while begin < len(rows):
            end = max(begin + 1, int(np.searchsorted(bounds, bounds[begin] - rows[begin, 2] + CHUNK, "right")))
            part = rows[begin:end]
            bad = np.nonzero(checksums(src, part[:, 0], part[:, 2]) != checksums(dst, part[:, 1], part[:, 2]))[0]
            if len(bad):
                s, d, n = part[bad[0]].tolist()
                k = int(np.nonzero(src[s:s + n] != dst[d:d + n])[0][0])
                return _mismatch(plan, name, dst_owner, d + k, src_name, s + k)
            begin = end
    return None


def _mismatch(plan, name, owner, offset, source, src_offset) -> Mismatch:
    layout = plan.dst_layouts[name]
    start, shape = layout.shard_box(owner)
    local = np.unravel_index(offset // layout.dtype.itemsize, shape) if shape else ()
    index = tuple(int(a) + int(b) for a, b in zip(start, local))
    return Mismatch(name, tuple(owner), int(offset), index, source, int(src_offset))


def raise_on_mismatch(mismatch) -> None:
    if mismatch is not None:
        error = SwapError(str(mismatch))
        error.mismatch = mismatch
        raise error
