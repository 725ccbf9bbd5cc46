"""The planning problem as flat integer arrays: what both planners (native and reference) read.

Every tensor is padded to MAX_RANK dimensions with leading unit axes. That
leaves row-major byte offsets unchanged and aligns source and destination
axes from the right, which is how pieces relate them.

Distinct layouts are stored once and shared by the tensors using them (a
model of 70,000 tensors has a handful of layouts). Owners get dense ids in
sorted (process, device) order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .layout import MAX_RANK, Layout, LayoutError
from .lowering import aligned_source_size
from .rule_types import Piece

R = MAX_RANK
PLANNER_VERSION = b"jax-amem-reshard-1"


def pad(values, fill: int) -> list[int]:
    values = list(values)
    return [fill] * (R - len(values)) + values


@dataclass
class Problem:
    src_names: list[str]
    dst_names: list[str]
    src_layouts: list[Layout]
    dst_layouts: list[Layout]
    split_bytes: int
    owners: np.ndarray = field(init=False)           # (O, 2) process, device
    layouts: list[Layout] = field(init=False)        # distinct layouts
    arrays: dict[str, np.ndarray] = field(init=False)  # what the native planner reads
    view_keys: list[tuple[int, tuple[int, ...], str]] = field(init=False)  # (source, perm, dtype name)
    view_affines: list = field(init=False)           # per view: its constant steps (Affine) or None
    key: str = field(init=False)

    @classmethod
    def build(cls, sources: Mapping[str, Layout], destinations: Mapping[str, Layout],
              pieces: list[Piece], split_bytes: int) -> "Problem":
        self = cls(list(sources), list(destinations), list(sources.values()),
                   list(destinations.values()), int(split_bytes))
        self._index_layouts()
        self._index_pieces(pieces)
        self._compute_key()
        return self

    # -- layouts and owners -------------------------------------------------------------------

    def _index_layouts(self) -> None:
        by_object: dict[int, int] = {}
        by_digest: dict[bytes, int] = {}
        self.layouts = []

        def layout_id(layout: Layout) -> int:
            found = by_object.get(id(layout))
            if found is None:
                found = by_digest.setdefault(layout.digest, len(self.layouts))
                if found == len(self.layouts):
                    self.layouts.append(layout)
                by_object[id(layout)] = found
            return found

        src_layout = np.array([layout_id(l) for l in self.src_layouts], dtype=np.int64)
        dst_layout = np.array([layout_id(l) for l in self.dst_layouts], dtype=np.int64)
        checked = set()
        for name, layout, lid in zip(self.src_names, self.src_layouts, src_layout.tolist()):
            if lid not in checked:
                layout.require_tiling(name)
                checked.add(lid)
        all_owners = np.concatenate([np.array(l.owners, dtype=np.int64).reshape(-1, 2) for l in self.layouts]
                                    or [np.zeros((0, 2), np.int64)])
        self.owners = np.unique(all_owners, axis=0).reshape(-1, 2)
        if (self.owners < 0).any():
            raise LayoutError("owner process and device ids must be >= 0")
        owner_id = {tuple(o): i for i, o in enumerate(self.owners.tolist())}
        shape, box_begin, starts, sizes, rep_begin, rep_owner = [], [0], [], [], [0], []
        for layout in self.layouts:
            shape.append(pad(layout.shape, 1))
            ids = [owner_id[o] for o in layout.owners]
            for box, members in enumerate(layout.box_owners):
                starts.append(pad(layout.starts[box].tolist(), 0))
                sizes.append(pad(layout.sizes[box].tolist(), 1))
                rep_owner.extend(sorted(ids[m] for m in members))
                rep_begin.append(len(rep_owner))
            box_begin.append(len(starts))
        as_array = lambda v, cols=None: np.array(v, dtype=np.int64).reshape((-1, cols) if cols else -1)
        self.arrays = dict(
            owners=self.owners, layout_shape=as_array(shape, R), box_begin=as_array(box_begin),
            box_start=as_array(starts, R), box_size=as_array(sizes, R), rep_begin=as_array(rep_begin),
            rep_owner=as_array(rep_owner), src_layout=src_layout, dst_layout=dst_layout,
            dst_itemsize=as_array([l.dtype.itemsize for l in self.dst_layouts]))

    # -- pieces and views ---------------------------------------------------------------------

    def _index_pieces(self, pieces: list[Piece]) -> None:
        src_index = {n: i for i, n in enumerate(self.src_names)}
        dst_index = {n: i for i, n in enumerate(self.dst_names)}
        views: dict[tuple, int] = {}
        self.view_keys, self.view_affines = [], []
        view_src, view_perm, view_itemsize = [], [], []
        rows = []
        for p in pieces:
            s = src_index[p.src]
            layout = self.src_layouts[s]
            perm = tuple(range(layout.ndim)) if p.perm is None else tuple(int(a) for a in p.perm)
            dtype = np.dtype(p.dtype) if p.dtype is not None else layout.dtype
            key = (s, perm, dtype.name, p.affine)
            v = views.get(key)
            if v is None:
                v = views[key] = len(self.view_keys)
                self.view_keys.append(key[:3])
                self.view_affines.append(p.affine)
                view_src.append(s)
                view_perm.append(list(range(R - len(perm))) + [R - len(perm) + a for a in perm])
                view_itemsize.append(dtype.itemsize)
            aligned_source_size(p.size, layout.ndim, p.dst)  # raises on unfillable leading axes
            # Padded to R axes, one extent vector serves both sides (trailing axes aligned).
            rows.append([dst_index[p.dst], v] + pad(p.dst_start, 0) + pad(p.src_start, 0) + pad(p.size, 1))
        table = np.array(rows, dtype=np.int64).reshape(-1, 2 + 3 * R)
        self.arrays.update(
            view_src=np.array(view_src, dtype=np.int64), view_perm=np.array(view_perm, np.int64).reshape(-1, R),
            view_itemsize=np.array(view_itemsize, dtype=np.int64),
            piece_dst=np.ascontiguousarray(table[:, 0]), piece_view=np.ascontiguousarray(table[:, 1]),
            piece_dst_start=np.ascontiguousarray(table[:, 2:2 + R]),
            piece_src_start=np.ascontiguousarray(table[:, 2 + R:2 + 2 * R]),
            piece_size=np.ascontiguousarray(table[:, 2 + 2 * R:]))

    def _compute_key(self) -> None:
        h = hashlib.sha256(PLANNER_VERSION)
        h.update(repr((self.split_bytes, self.src_names, self.dst_names, self.view_keys)).encode())
        if any(a is not None for a in self.view_affines):  # plans without constants keep their keys
            h.update(repr(self.view_affines).encode())
        for layout in self.layouts:
            h.update(layout.digest)
        for name in sorted(self.arrays):
            h.update(name.encode())
            h.update(np.ascontiguousarray(self.arrays[name]).tobytes())
        self.key = h.hexdigest()[:32]

    # -- lookups ------------------------------------------------------------------------------

    def owner_id(self, owner) -> int:
        process, device = owner
        hits = np.nonzero((self.owners[:, 0] == process) & (self.owners[:, 1] == device))[0]
        if len(hits) == 0:
            raise LayoutError(f"owner {tuple(owner)} holds no shard of any source or destination tensor "
                              "of this plan: check the process and device ids")
        return int(hits[0])
