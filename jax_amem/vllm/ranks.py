"""Each tensor-parallel rank's share of a layer group's rules.

The presets (and `from_function`) write rules for the whole destination tensor: a fused
tensor's rank blocks side by side (`Rule.groups = tp`), as vLLM's checkpoint loaders would
build it before slicing. Each rank of the engine holds one slice of it, as vLLM loads it:

* a tensor whose loaded shape equals the whole (norms, a replicated router) is the whole;
* otherwise exactly one axis is split: rank r holds `[r * n, r * n + rows)` of it, `n` its
  loaded extent there and `rows` the extent it reports (smaller only for a padded
  vocabulary's last real rows).

The rules are lowered to pieces once for the whole tensor, then every piece is cut to the
rank's box and moved to the rank's coordinates: each rank's staging gets its own slice from
the trainer's arrays, and nothing is gathered to full size. Pieces given with the rules (what a
Rule cannot say: MaxText's rotary reorder and query scaling, layers on scan axis 1) are whole-
tensor pieces too and take the same cut; a tensor written by pieces is as large as their
destination boxes reach. A cut keeps a piece's constant steps as they are: their vector
constants are indexed by source coordinates, which move with the cut's source region.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from ..reshard import Layout
from ..reshard.lowering import _part_view, lower
from ..reshard.rule_types import Piece, Rule
from .errors import VllmPlanError


def whole_shape(rule: Rule, sources: Mapping[str, Layout]) -> tuple[int, ...]:
    """The shape the rule's parts make, concatenated along its axis. A part replicated over k
    ranks (`Part.replicas`: a KV head when tp exceeds the KV heads) counts k times: every rank
    that holds it holds its own copy, so the ranks' slices together are that much larger."""
    views = [_part_view(part, rule.dst, sources, rule.origin)[2] for part in rule.parts]
    if not views[0]:
        return ()
    axis = rule.axis % len(views[0])
    extent = sum(v[axis] * getattr(part, "replicas", 1) for v, part in zip(views, rule.parts))
    return tuple(extent if i == axis else n for i, n in enumerate(views[0]))


def whole_shapes(rules: list, sources: Mapping[str, Layout]) -> dict[str, tuple[int, ...]]:
    """Each destination's whole shape: a Rule's from its parts (`whole_shape`); a tensor written
    by Pieces, the bounding extent of their destination boxes."""
    out: dict[str, tuple[int, ...]] = {}
    for rule in rules:
        if isinstance(rule, Rule):
            shape = whole_shape(rule, sources)
        else:
            shape = tuple(a + n for a, n in zip(rule.dst_start, rule.size))
        held = out.get(rule.dst, shape)
        # a piece of another rank is left to `lower`, which names it
        out[rule.dst] = tuple(max(a, b) for a, b in zip(held, shape)) if len(held) == len(shape) else held
    return out


def rank_box(name: str, whole: tuple[int, ...], loaded: tuple[int, ...], written: tuple[int, ...],
             rank: int, tp: int) -> tuple[int | None, int, int]:
    """(axis, start, rows) of rank `rank`'s slice of a tensor of shape `whole`; axis None when
    the rank holds it whole. VllmPlanError when no one-axis split of `whole` gives `loaded`."""
    if tuple(whole) == tuple(written):
        return None, 0, 0
    split = [a for a, (w, n) in enumerate(zip(whole, loaded)) if w != n]
    if len(whole) == len(loaded) and len(split) == 1:
        axis = split[0]
        per = loaded[axis]
        start = rank * per
        rows = max(0, min(per, whole[axis] - start))
        if per * tp >= whole[axis] > per * (tp - 1) and rows == written[axis] \
                and all(w == n for a, (w, n) in enumerate(zip(whole, written)) if a != axis):
            return axis, start, rows
    raise VllmPlanError(f"engine tensor {name!r}: rank {rank} of {tp} holds shape {tuple(loaded)} (writes "
                        f"{tuple(written)}), which is not a tensor-parallel slice of the {tuple(whole)} the rules "
                        "make: check the family and tp (a replicated KV head needs rules that write it)")


def cut(piece: Piece, axis: int, start: int, rows: int) -> Piece | None:
    """`piece` restricted to rows [start, start + rows) of destination axis `axis`, in the
    slice's coordinates; None when it lies outside. The source region moves with it (the
    piece's source axes are its destination axes aligned at the end)."""
    first, extent = piece.dst_start[axis], piece.size[axis]
    low, high = max(first, start), min(first + extent, start + rows)
    if low >= high:
        return None
    source_axis = axis + len(piece.src_start) - len(piece.size)
    src_start = list(piece.src_start)
    if source_axis >= 0:
        src_start[source_axis] += low - first
    dst_start, size = list(piece.dst_start), list(piece.size)
    dst_start[axis], size[axis] = low - start, high - low
    return dataclasses.replace(piece, dst_start=tuple(dst_start), size=tuple(size), src_start=tuple(src_start))


def rank_pieces(rules: list[Rule], sources: Mapping[str, Layout], tensors: list[dict], owner,
                rank: int, tp: int) -> list[Piece]:
    """Rank `rank`'s pieces for one group, from its whole-tensor `rules` (Rules, and Pieces where
    a Rule cannot say it: `lower` takes both): `tensors` is the rank's wire description of the
    group (name, shape as written, loaded shape, dtype)."""
    shapes = whole_shapes(rules, sources)
    wholes, boxes = {}, {}
    for t in tensors:
        whole = shapes.get(t["name"])
        if whole is None:
            raise VllmPlanError(f"no rule writes engine tensor {t['name']!r}")
        wholes[t["name"]] = Layout.single(whole, t["dtype"], owner)
        boxes[t["name"]] = rank_box(t["name"], whole, tuple(t["loaded"]), tuple(t["shape"]), rank, tp)
    out = []
    for piece in lower(rules, sources, wholes):
        axis, start, rows = boxes[piece.dst]
        piece = piece if axis is None else cut(piece, axis, start, rows)
        if piece is not None:
            out.append(piece)
    return out
