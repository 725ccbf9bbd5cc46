"""The plan: which bytes go from which source shard to which destination buffer.

This is the contract with the swap executor. A plan holds:

* `owners` (O, 2) int64: (process, device) of owner id i.
* `views`: list of (source name, perm, dtype name). View v of a source is the
  source shard as the sender prepares it: `shard.transpose(perm).astype(dtype)`,
  row-major. Every source byte offset refers to such a prepared shard.
* `transfers` (T, 7) int64, columns TRANSFER_COLUMNS: (src_owner, dst_owner,
  dst_tensor, view, block_begin, block_end, bytes). One row per (sending owner,
  receiving owner, destination buffer, source view). Sorted by (src_owner,
  dst_owner, dst_tensor, view): the rows of one sender->receiver pair are
  contiguous, so an executor packs them into one message in row order.
* `blocks` (B, 9) int64: see blocks.py. Rows block_begin:block_end of a
  transfer copy from the view's shard held by src_owner into the destination
  shard (the box `dst_layouts[name].shard_box(dst_owner)`) held by dst_owner.
  `plan.segments(i)` expands transfer i into (src_offset, dst_offset, bytes)
  rows for `jax_amem.segment_copy`.

Every destination element of every destination shard is written by exactly one
block row (`check()` proves it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from . import blocks as B
from .layout import Layout, Owner

TRANSFER_COLUMNS = ("src_owner", "dst_owner", "dst_tensor", "view", "block_begin", "block_end", "bytes")
SRC_OWNER, DST_OWNER, DST_TENSOR, VIEW, BLOCK_BEGIN, BLOCK_END, BYTES = range(7)


class PlanError(ValueError):
    """A plan does not write every destination element exactly once (a planner bug)."""


@dataclass(frozen=True, eq=False)
class Plan:
    key: str
    owners: np.ndarray
    src_layouts: dict[str, Layout]
    dst_layouts: dict[str, Layout]
    views: list[tuple[str, tuple[int, ...], str]]
    transfers: np.ndarray
    blocks: np.ndarray
    owner: Owner | None = None  # set on a rank's local plan
    planner: str = "native"

    # -- identity -----------------------------------------------------------------------------

    def __hash__(self):
        return hash((self.key, self.owner))

    def __eq__(self, other):
        return (isinstance(other, Plan) and self.key == other.key and self.owner == other.owner
                and np.array_equal(self.transfers, other.transfers)
                and np.array_equal(self.blocks, other.blocks))

    @property
    def dst_names(self) -> list[str]:
        return list(self.dst_layouts)

    @property
    def nbytes(self) -> int:
        """Bytes moved (each destination byte once)."""
        return int(self.transfers[:, BYTES].sum())

    def owner_of(self, owner_id: int) -> Owner:
        return Owner(*(int(x) for x in self.owners[owner_id]))

    def __str__(self):
        scope = f"rank {tuple(self.owner)}" if self.owner is not None else "global"
        pairs = len(np.unique(self.transfers[:, :2], axis=0)) if len(self.transfers) else 0
        strided = int((self.blocks[:, B.N1] > 1).sum()) if len(self.blocks) else 0
        return (f"Plan {self.key[:12]} ({scope}, {self.planner}): {len(self.src_layouts)} -> "
                f"{len(self.dst_layouts)} tensors, {len(self.owners)} owners, {self.nbytes / 2**20:.2f} MiB "
                f"in {len(self.transfers)} transfers over {pairs} owner pairs, {len(self.blocks)} blocks "
                f"({strided} strided)")

    __repr__ = __str__

    # -- slicing ------------------------------------------------------------------------------

    def owner_id(self, owner) -> int:
        owner = Owner(*owner)
        hits = np.nonzero((self.owners[:, 0] == owner.process) & (self.owners[:, 1] == owner.device))[0]
        if len(hits) == 0:
            raise KeyError(f"owner {tuple(owner)} holds no shard of any tensor of this plan "
                           f"({len(self.owners)} owners): check its process and device ids")
        return int(hits[0])

    def for_owner(self, owner) -> "Plan":
        """The transfers `owner` sends or receives (its local plan)."""
        i = self.owner_id(owner)
        keep = (self.transfers[:, SRC_OWNER] == i) | (self.transfers[:, DST_OWNER] == i)
        return self._subset(keep, Owner(*owner))

    def _subset(self, keep: np.ndarray, owner) -> "Plan":
        rows = self.transfers[keep]
        counts = rows[:, BLOCK_END] - rows[:, BLOCK_BEGIN]
        take = np.concatenate([np.arange(b, e) for b, e in rows[:, BLOCK_BEGIN:BLOCK_END + 1].tolist()]
                              or [np.zeros(0, np.int64)]).astype(np.int64)
        rows = rows.copy()
        rows[:, BLOCK_END] = np.cumsum(counts)
        rows[:, BLOCK_BEGIN] = rows[:, BLOCK_END] - counts
        return replace(self, transfers=rows, blocks=self.blocks[take], owner=owner)

    def segments(self, transfer: int) -> np.ndarray:
        """Transfer `transfer` as (src_offset, dst_offset, bytes) rows for segment_copy."""
        begin, end = self.transfers[transfer, BLOCK_BEGIN:BLOCK_END + 1]
        return B.expand(self.blocks[begin:end])

    def view_shard_shape(self, view: int, owner) -> tuple[int, ...]:
        """Shape of view `view`'s prepared source shard on `owner`."""
        name, perm, _ = self.views[view]
        _, size = self.src_layouts[name].shard_box(owner)
        return tuple(size[a] for a in perm)

    # -- the proof ----------------------------------------------------------------------------

    def check(self) -> "Plan":
        """Proves that every destination shard (of this plan's scope) is written exactly
        once and every block stays inside its source shard. Raises PlanError."""
        names = self.dst_names
        tensors = self.transfers[:, DST_TENSOR]
        dst_owner = self.transfers[:, DST_OWNER]
        order = np.lexsort((dst_owner, tensors))
        buffers = {}
        for t in order.tolist():
            key = (int(tensors[t]), int(dst_owner[t]))
            buffers.setdefault(key, []).append(t)
        mine = self.owner_id(self.owner) if self.owner is not None else None
        for (d, q), rows in buffers.items():
            self._check_sources(rows)
            if mine is None or q == mine:  # a local plan holds only part of what others receive
                self._check_buffer(names[d], self.owner_of(q), rows)
        want = [(d, q) for d, name in enumerate(names) for q in self._owners_of(name)
                if int(np.prod(self.dst_layouts[name].shard_box(self.owner_of(q))[1], dtype=np.int64))]
        missing = [(d, q) for d, q in want if (d, q) not in buffers]
        if missing:
            d, q = missing[0]
            raise PlanError(f"destination {names[d]!r}: the shard of owner {tuple(self.owner_of(q))} "
                            "receives nothing")
        return self

    def _owners_of(self, name: str):
        layout = self.dst_layouts[name]
        ids = [self.owner_id(o) for o in layout.owners]
        if self.owner is None:
            return ids
        mine = self.owner_id(self.owner)
        return [i for i in ids if i == mine]

    def _check_sources(self, rows) -> None:
        for t in rows:
            name, perm, dtype = self.views[int(self.transfers[t, VIEW])]
            src_owner = self.owner_of(int(self.transfers[t, SRC_OWNER]))
            if src_owner not in self.src_layouts[name].owner_index:
                raise PlanError(f"source {name!r}: owner {tuple(src_owner)} sends it but holds no shard")
            shape = self.view_shard_shape(int(self.transfers[t, VIEW]), src_owner)
            limit = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            blocks = self.blocks[self.transfers[t, BLOCK_BEGIN]:self.transfers[t, BLOCK_END]]
            last = blocks[:, B.SRC] + (blocks[:, B.N1] - 1) * blocks[:, B.SS1] \
                + (blocks[:, B.N0] - 1) * blocks[:, B.SS0] + blocks[:, B.RUN]
            if (blocks[:, B.SRC] < 0).any() or (last > limit).any():
                raise PlanError(f"source {name!r}: a block of owner {tuple(src_owner)} reads outside its "
                                f"{limit}-byte shard")

    def _check_buffer(self, name: str, owner: Owner, rows) -> None:
        layout = self.dst_layouts[name]
        _, shape = layout.shard_box(owner)
        itemsize = layout.dtype.itemsize
        total = int(np.prod(shape, dtype=np.int64))
        blocks = np.concatenate([self.blocks[self.transfers[t, BLOCK_BEGIN]:self.transfers[t, BLOCK_END]]
                                 for t in rows])
        written = int(B.block_bytes(blocks).sum())
        where = f"destination {name!r}, shard of owner {tuple(owner)}"
        if written != total * itemsize:
            raise PlanError(f"{where}: {written} bytes written for a {total * itemsize}-byte shard")
        boxes = [B.block_box(b, shape, itemsize) for b in blocks]
        if all(box is not None for box in boxes):
            starts = np.array([b[0] for b in boxes], dtype=np.int64).reshape(len(boxes), -1)
            ends = starts + np.array([b[1] for b in boxes], dtype=np.int64).reshape(len(boxes), -1)
            if len(boxes) > 1:
                hit = ((starts[:, None] < ends[None]) & (starts[None] < ends[:, None])).all(axis=2)
                np.fill_diagonal(hit, False)
                if hit.any():
                    raise PlanError(f"{where}: two blocks write the same elements")
            return  # disjoint boxes whose volumes sum to the shard: an exact tiling
        rows_ = B.expand(blocks)
        order = np.argsort(rows_[:, 1], kind="stable")
        starts, lengths = rows_[order, 1], rows_[order, 2]
        if starts[0] != 0 or (starts[1:] != starts[:-1] + lengths[:-1]).any():
            raise PlanError(f"{where}: blocks overlap or leave a gap")
