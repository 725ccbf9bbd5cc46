"""Staging buckets of the NCCL transport: how one (sender owner, receiver owner) pair's
transfers are packed into bounded contiguous buckets. A pure function of the global plan,
so the trainer and the rollout compute the same buckets, rows and order without talking.

The pair's transfers are taken in plan order (the plan sorts rows by (src_owner, dst_owner,
dst_tensor, view)), each transfer's segments in `plan.segments(i)` order, and laid end to
end in one byte stream: piece starts aligned to the pair's alignment `A` (the largest power
of two <= 16 dividing every offset, so the copy kernels keep their widest word on both ends;
padding < A per segment). Bucket k is stream bytes [k * B, (k + 1) * B); a segment crossing
a boundary is split there. A bucket is also closed early when a transfer would bring a 513th
distinct view (sender) or destination tensor (receiver): the copy kernels take at most
MAX_BUFFERS_PER_SIDE pointers per launch.

Per bucket: the sender's gather rows (view slot, 0, src_offset, bucket_offset, bytes, 0) and
the receiver's unpack rows (0, dst slot, bucket_offset, dst_offset, bytes, 0), BufferSegment
rows as `jax_amem.copy.segment_copy_many` takes them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ...reshard.plan_data import DST_OWNER, DST_TENSOR, SRC_OWNER, VIEW, Plan
from ..errors import SwapError

MIN_BUCKET_BYTES = 4096          # below this the per-bucket overhead dominates any link
DEFAULT_BUCKET_BYTES = 64 << 20  # two per peer in flight: 128 MiB of staging per peer and side
MAX_BUFFERS_PER_SIDE = 512       # the copy kernels' pointer table (src/copy/segments.h)
MAX_ALIGN = 16


@dataclass(frozen=True)
class Bucket:
    nbytes: int                 # bytes sent (the last piece's end; <= bucket_bytes)
    views: tuple[int, ...]      # plan view ids, by sender slot
    dst_tensors: tuple[int, ...]  # plan destination tensor ids, by receiver slot
    send_rows: np.ndarray       # (n, 6) int64: (view slot, 0, src_offset, bucket_offset, bytes, 0)
    recv_rows: np.ndarray       # (n, 6) int64: (0, dst slot, bucket_offset, dst_offset, bytes, 0)


@dataclass(frozen=True)
class PairPacking:
    src_owner: int
    dst_owner: int
    bucket_bytes: int
    alignment: int
    transfers: np.ndarray       # plan transfer ids of this pair, in plan order
    buckets: tuple[Bucket, ...]
    nbytes: int                 # payload: destination bytes written (each once)

    @property
    def wire_bytes(self) -> int:
        """Bytes on the network (payload plus alignment padding)."""
        return sum(b.nbytes for b in self.buckets)

    @property
    def digest(self) -> str:
        """Content hash of every bucket's rows: both sides compare it before a byte moves."""
        h = hashlib.sha256(f"{self.bucket_bytes}/{self.alignment}".encode())
        for b in self.buckets:
            h.update(np.array([b.nbytes, *b.views, -1, *b.dst_tensors], np.int64).tobytes())
            h.update(np.ascontiguousarray(b.send_rows).tobytes())
        return h.hexdigest()[:32]


def check_bucket_bytes(bucket_bytes) -> int:
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, (int, np.integer)):
        raise SwapError(f"bucket_bytes must be an int, got {bucket_bytes!r}")
    bucket_bytes = int(bucket_bytes)
    if bucket_bytes < MIN_BUCKET_BYTES or bucket_bytes % MAX_ALIGN:
        raise SwapError(f"bucket_bytes={bucket_bytes} is too small or unaligned: give a multiple of "
                        f"{MAX_ALIGN} of at least {MIN_BUCKET_BYTES} bytes (default "
                        f"{DEFAULT_BUCKET_BYTES >> 20} MiB; two buckets per peer are allocated)")
    return bucket_bytes


def pair_transfers(plan: Plan, src_owner: int, dst_owner: int) -> np.ndarray:
    t = plan.transfers
    return np.nonzero((t[:, SRC_OWNER] == src_owner) & (t[:, DST_OWNER] == dst_owner))[0]


def peers_of(plan: Plan, owner: int, role: str) -> list[int]:
    """Owner ids this owner sends to (role "sender") or receives from ("receiver"), sorted."""
    t = plan.transfers
    mine, theirs = (SRC_OWNER, DST_OWNER) if role == "sender" else (DST_OWNER, SRC_OWNER)
    return sorted(int(x) for x in np.unique(t[t[:, mine] == owner, theirs]))


def _alignment(segments: list[np.ndarray]) -> int:
    bits = MAX_ALIGN
    for s in segments:
        if len(s):
            bits |= int(np.bitwise_or.reduce(s[:, 0] | s[:, 1]))
    return bits & -bits  # lowest set bit, at most MAX_ALIGN


def pack_pair(plan: Plan, src_owner: int, dst_owner: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
              max_buffers: int = MAX_BUFFERS_PER_SIDE) -> PairPacking:
    """The buckets of owner `src_owner` -> `dst_owner` (plan owner ids). SwapError when the pair
    moves nothing (an owner missing from the plan)."""
    bucket_bytes = check_bucket_bytes(bucket_bytes)
    ids = pair_transfers(plan, src_owner, dst_owner)
    if len(ids) == 0:
        raise SwapError(f"the plan sends nothing from owner {_owner_text(plan, src_owner)} to owner "
                        f"{_owner_text(plan, dst_owner)}: check the link's ranks and the plan "
                        f"(peers of the sender: {[_owner_text(plan, o) for o in peers_of(plan, src_owner, 'sender')]})")
    segments = [plan.segments(int(i)) for i in ids]
    align = _alignment(segments)
    pieces = []   # per transfer: (bucket, bucket_offset, src_offset, dst_offset, bytes) arrays
    position = 0
    open_views: set[int] = set()
    open_dsts: set[int] = set()
    open_bucket = 0
    for i, seg in zip(ids.tolist(), segments):
        view, dst = int(plan.transfers[i, VIEW]), int(plan.transfers[i, DST_TENSOR])
        if position // bucket_bytes != open_bucket or position % bucket_bytes == 0:
            open_bucket, open_views, open_dsts = position // bucket_bytes, set(), set()
        if (view not in open_views and len(open_views) >= max_buffers) or \
                (dst not in open_dsts and len(open_dsts) >= max_buffers):
            position = -(-position // bucket_bytes) * bucket_bytes  # close the bucket early
            open_bucket, open_views, open_dsts = position // bucket_bytes, set(), set()
        padded = -(-seg[:, 2] // align) * align
        starts = position + np.concatenate([[0], np.cumsum(padded)[:-1]])
        position = int(starts[-1] + padded[-1])
        split = _split_at_boundaries(starts, seg, bucket_bytes)
        pieces.append((view, dst, split))
        last = int(split[-1, 0])
        if last != open_bucket:
            open_bucket, open_views, open_dsts = last, set(), set()
        open_views.add(view)
        open_dsts.add(dst)
    return PairPacking(src_owner, dst_owner, bucket_bytes, align, ids,
                       _buckets(pieces), int(sum(int(s[:, 2].sum()) for s in segments)))


def _split_at_boundaries(starts: np.ndarray, seg: np.ndarray, bucket_bytes: int) -> np.ndarray:
    """Rows (bucket, bucket_offset, src_offset, dst_offset, bytes), each inside one bucket."""
    ends = starts + seg[:, 2]
    first, last = starts // bucket_bytes, (ends - 1) // bucket_bytes
    count = last - first + 1
    row = np.repeat(np.arange(len(seg)), count)
    k = np.arange(len(row)) - np.repeat(np.cumsum(count) - count, count)  # piece within its row
    bucket = first[row] + k
    begin = np.maximum(starts[row], bucket * bucket_bytes)
    end = np.minimum(ends[row], (bucket + 1) * bucket_bytes)
    delta = begin - starts[row]
    return np.stack([bucket, begin - bucket * bucket_bytes, seg[row, 0] + delta,
                     seg[row, 1] + delta, end - begin], axis=1).astype(np.int64)


def _buckets(pieces) -> tuple[Bucket, ...]:
    views = np.concatenate([np.full(len(s), v, np.int64) for v, _, s in pieces])
    dsts = np.concatenate([np.full(len(s), d, np.int64) for _, d, s in pieces])
    rows = np.concatenate([s for _, _, s in pieces])
    out = []
    # Stream positions only grow, so each bucket's rows are one contiguous run.
    cuts = np.concatenate([[0], np.flatnonzero(np.diff(rows[:, 0])) + 1, [len(rows)]])
    for begin, end in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        r, v, d = rows[begin:end], views[begin:end], dsts[begin:end]
        view_ids, view_slot = _first_seen(v)
        dst_ids, dst_slot = _first_seen(d)
        zeros = np.zeros(len(r), np.int64)
        send = np.stack([view_slot, zeros, r[:, 2], r[:, 1], r[:, 4], zeros], axis=1)
        recv = np.stack([zeros, dst_slot, r[:, 1], r[:, 3], r[:, 4], zeros], axis=1)
        out.append(Bucket(int((r[:, 1] + r[:, 4]).max()), view_ids, dst_ids, send, recv))
    return tuple(out)


def _first_seen(ids: np.ndarray) -> tuple[tuple[int, ...], np.ndarray]:
    """Distinct ids in order of first appearance, and each entry's slot among them."""
    uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(uniq), np.int64)
    rank[order] = np.arange(len(uniq))
    return tuple(int(x) for x in uniq[order]), rank[inverse.reshape(-1)]


def _owner_text(plan: Plan, owner: int) -> str:
    if 0 <= owner < len(plan.owners):
        return f"{owner} {tuple(int(x) for x in plan.owners[owner])}"
    return f"{owner} (not in the plan's {len(plan.owners)} owners)"
