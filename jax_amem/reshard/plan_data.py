"""The plan: which bytes go from which source shard to which destination buffer.

This is the contract with the swap executor. A plan holds:

* `owners` (O, 2) int64: (process, device) of owner id i.
* `views`: list of (source name, perm, dtype name). View v of a source is the
  source shard as the sender prepares it: `shard.transpose(perm).astype(dtype)`,
  row-major. Every source byte offset refers to such a prepared shard.
  `affines[v]` (when the plan has any): the view's constant steps (reshard/affine.py), or
  None; a view with steps is `affine.apply_numpy(shard.transpose(perm), dtype, ...)`, which
  the copy kernel computes from the transposed shard in the source's own dtype.
* `transfers` (T, 7) int64, columns TRANSFER_COLUMNS: (src_owner, dst_owner,
  dst_tensor, view, block_begin, block_end, bytes). One row per (sending owner,
  receiving owner, destination buffer, source view). Sorted by (src_owner,
  dst_owner, dst_tensor, view): the rows of one sender->receiver pair are
  contiguous, so an executor packs them into one message in row order.
* `blocks` (B, 9) int64: see blocks.py. Rows block_begin:block_end of a
  transfer copy from the view's shard held by src_owner into the destination
  shard (the box `dst_layouts[name].shard_box(dst_owner)`) held by dst_owner.
  `plan.segments(i)` expands transfer i into (src_offset, dst_offset, bytes)
  rows for `jax_amem.copy.segment_copy`.

Every destination element of every destination shard is written by exactly one
block row (`check()` proves it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import PlanError
from . import blocks as B
from .layout import Layout, Owner

TRANSFER_COLUMNS = ("src_owner", "dst_owner", "dst_tensor", "view", "block_begin", "block_end", "bytes")
SRC_OWNER, DST_OWNER, DST_TENSOR, VIEW, BLOCK_BEGIN, BLOCK_END, BYTES = range(7)


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
    affines: tuple = ()         # per view: its constant steps (Affine) or None; () when none has any

    def affine(self, view: int):
        """View `view`'s constant steps (reshard/affine.py), or None."""
        return self.affines[view] if view < len(self.affines) else None

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
                f"({strided} strided)" + (f", {sum(a is not None for a in self.affines)} views with constant steps"
                                          if self.affines else ""))

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
        once and every block stays inside its source shard. Raises PlanError.

        Vectorised: bounds and byte counts for all blocks at once; a buffer written by
        one block is exact when that block stays in bounds, does not overlap itself and
        writes the shard's byte count; buffers written by several blocks are checked
        as boxes (or, failing that, row by row).
        """
        t, blocks = self.transfers, self.blocks
        names = self.dst_names
        n = len(self.owners)
        dst_bytes_table, dst_layout_of = self._shard_bytes_table([self.dst_layouts[k] for k in names])
        src_names = list(self.src_layouts)
        src_index = {k: i for i, k in enumerate(src_names)}
        src_table, src_layout_of = self._shard_bytes_table([self.src_layouts[k] for k in src_names], elements=True)
        view_src = np.array([src_index[v[0]] for v in self.views], dtype=np.int64)
        view_item = np.array([np.dtype(v[2]).itemsize for v in self.views], dtype=np.int64)
        src_limit = src_table[src_layout_of[view_src[t[:, VIEW]]], t[:, SRC_OWNER]] * view_item[t[:, VIEW]]
        dst_limit = dst_bytes_table[dst_layout_of[t[:, DST_TENSOR]], t[:, DST_OWNER]]
        if (src_limit < 0).any():
            bad = int(np.nonzero(src_limit < 0)[0][0])
            raise PlanError(f"source {self.views[t[bad, VIEW]][0]!r}: owner "
                            f"{tuple(self.owner_of(t[bad, SRC_OWNER]))} sends it but holds no shard")
        if (dst_limit < 0).any():
            bad = int(np.nonzero(dst_limit < 0)[0][0])
            raise PlanError(f"destination {names[t[bad, DST_TENSOR]]!r}: owner "
                            f"{tuple(self.owner_of(t[bad, DST_OWNER]))} receives it but holds no shard")
        counts = t[:, BLOCK_END] - t[:, BLOCK_BEGIN]
        which = np.repeat(np.arange(len(t)), counts)
        extent = lambda off, s1, s0: blocks[:, off] + (blocks[:, B.N1] - 1) * blocks[:, s1] + (blocks[:, B.N0] - 1) * blocks[:, s0] \
            + blocks[:, B.RUN]
        for side, off, s1, s0, limit in (("source", B.SRC, B.SS1, B.SS0, src_limit),
                                         ("destination", B.DST, B.DS1, B.DS0, dst_limit)):
            bad = (blocks[:, off] < 0) | (blocks[:, s1] < 0) | (blocks[:, s0] < 0) \
                | (extent(off, s1, s0) > limit[which]) | (blocks[:, B.RUN] <= 0)
            if bad.any():
                row = int(which[np.nonzero(bad)[0][0]])
                raise PlanError(f"transfer {row} (destination {names[t[row, DST_TENSOR]]!r}): a block reaches "
                                f"outside its {side} shard of {int(limit[row])} bytes")
        # Byte counts per destination buffer, and the buffers that must receive.
        mine = self.owner_id(self.owner) if self.owner is not None else None
        keys = t[:, DST_TENSOR] * n + t[:, DST_OWNER]
        uniq, inverse = np.unique(keys, return_inverse=True)
        written = np.bincount(inverse, weights=t[:, BYTES], minlength=len(uniq)).astype(np.int64)
        want = dst_bytes_table[dst_layout_of[uniq // n], uniq % n]
        scope = np.ones(len(uniq), bool) if mine is None else (uniq % n == mine)
        wrong = scope & (written != want)
        if wrong.any():
            k = int(np.nonzero(wrong)[0][0])
            raise PlanError(f"destination {names[uniq[k] // n]!r}, shard of owner "
                            f"{tuple(self.owner_of(uniq[k] % n))}: {written[k]} bytes written for a "
                            f"{want[k]}-byte shard")
        self._check_all_buffers_present(uniq, dst_bytes_table, dst_layout_of, mine)
        # Overlaps: one block per buffer needs only a self-overlap test.
        blocks_per_key = np.bincount(inverse, weights=counts, minlength=len(uniq)).astype(np.int64)
        run, n1, n0 = blocks[:, B.RUN], blocks[:, B.N1], blocks[:, B.N0]
        self_overlap = ((n1 > 1) & (blocks[:, B.DS1] < run)) | \
            ((n0 > 1) & ((n1 - 1) * blocks[:, B.DS1] + run > blocks[:, B.DS0]))
        single = blocks_per_key[inverse[which]] == 1
        if (self_overlap & single).any():
            row = int(which[np.nonzero(self_overlap & single)[0][0]])
            raise PlanError(f"destination {names[t[row, DST_TENSOR]]!r}: a block overlaps itself")
        by_key = np.argsort(inverse, kind="stable")
        first = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=len(uniq)))])
        for k in np.nonzero(scope & (blocks_per_key > 1))[0].tolist():
            rows = by_key[first[k]:first[k + 1]].tolist()
            self._check_buffer(names[uniq[k] // n], self.owner_of(uniq[k] % n), rows)
        return self

    def _shard_bytes_table(self, layouts, elements: bool = False):
        """(distinct layouts x owners) shard sizes (bytes, or elements), -1 where an owner holds
        none; and the distinct-layout index of each tensor."""
        index_of, distinct = {}, []
        layout_of = np.zeros(len(layouts), dtype=np.int64)
        for i, layout in enumerate(layouts):
            layout_of[i] = index_of.setdefault(id(layout), len(distinct))
            if layout_of[i] == len(distinct):
                distinct.append(layout)
        owner_ids = {tuple(o): i for i, o in enumerate(self.owners.tolist())}
        table = np.full((len(distinct), len(self.owners)), -1, dtype=np.int64)
        for row, layout in enumerate(distinct):
            volumes = layout.sizes.prod(axis=1) if layout.ndim else np.ones(len(layout.starts), np.int64)
            scale = 1 if elements else layout.dtype.itemsize
            for owner, box in zip(layout.owners, layout.box_of_owner.tolist()):
                if tuple(owner) in owner_ids:
                    table[row, owner_ids[tuple(owner)]] = int(volumes[box]) * scale
        return table, layout_of

    def _check_all_buffers_present(self, present_keys, table, layout_of, mine) -> None:
        n = len(self.owners)
        per_layout = (table > 0) if mine is None else (table > 0) & (np.arange(n) == mine)
        expected = int(per_layout[layout_of].sum())
        in_scope = present_keys if mine is None else present_keys[present_keys % n == mine]
        if len(in_scope) == expected:
            return
        present = set(in_scope.tolist())
        for d, row in enumerate(layout_of.tolist()):
            for q in np.nonzero(per_layout[row])[0].tolist():
                if d * n + q not in present:
                    raise PlanError(f"destination {self.dst_names[d]!r}: the shard of owner "
                                    f"{tuple(self.owner_of(q))} receives nothing")

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
