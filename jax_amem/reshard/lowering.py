"""Lowers rules to pieces and proves that the pieces tile every destination.

Every error names the destination tensor and the region at fault.
"""

from __future__ import annotations

import difflib
import functools
import numbers
from collections import defaultdict
from typing import Iterable, Mapping

import numpy as np

from ..errors import RuleError
from . import fragments as F
from .affine import AffineError
from .from_jax import nested_names_hint
from .layout import Layout, region_text
from .rule_checks import checked_piece, in_range
from .rule_types import Part, Piece, Rule


def closest(name: str, names, what: str) -> str:
    """'; closest <what> names: ...' (edit distance), or '' when none is near."""
    near = difflib.get_close_matches(name, list(names), n=3, cutoff=0.6)
    return f"; closest {what} names: {', '.join(map(repr, near))}" if near else ""


def _by(origin: str) -> str:
    return f" (rule from {origin})" if origin else ""


def _part_view(part: Part, dst: str, sources: Mapping[str, Layout], origin: str = ""):
    """(source layout, full permutation, transformed shape after the fixed indices)."""
    if part.src not in sources:
        raise RuleError(f"destination {dst!r}{_by(origin)}: expected source {part.src!r}, which is not "
                        f"among the {len(sources)} source tensors{closest(part.src, sources, 'source')}")
    layout = sources[part.src]
    k = len(part.index)
    if k > layout.ndim:
        raise RuleError(f"destination {dst!r}: index {part.index} has more axes than source "
                        f"{part.src!r} of shape {layout.shape}")
    for axis, (i, n) in enumerate(zip(part.index, layout.shape)):
        if not 0 <= i < n:
            raise RuleError(f"destination {dst!r}: index {part.index} is outside source "
                            f"{part.src!r} of shape {layout.shape} (axis {axis})")
    rest = layout.shape[k:]
    inner = tuple(range(len(rest))) if part.transpose is None else tuple(part.transpose)
    if sorted(inner) != list(range(len(rest))):
        raise RuleError(f"destination {dst!r}: transpose {part.transpose} is not a permutation of the "
                        f"{len(rest)} axes of source {part.src!r} after index {part.index}")
    perm = tuple(range(k)) + tuple(k + p for p in inner)
    view_shape = tuple(rest[p] for p in inner)
    if part.shape is not None:
        shape = tuple(int(n) for n in part.shape)
        if int(np.prod(shape, dtype=np.int64)) != int(np.prod(view_shape, dtype=np.int64)):
            raise RuleError(f"destination {dst!r}: part {part.src!r} has shape {view_shape} after index "
                            f"{part.index} and transpose {part.transpose}; it cannot be reshaped to {shape} "
                            "(the element counts differ)")
        view_shape = shape
    return layout, perm, view_shape


def _fragment_pieces(part: Part, layout: Layout, dst: str, start, limit, dst_start, origin="") -> list[Piece]:
    """Pieces for the box [start, limit) of a reshaped or scaled part, placed at `dst_start`."""
    frags = [F.whole(part.src, layout.shape, part.index, part.transpose)]
    view = _part_view_before_reshape(part, layout)
    if part.shape is not None:
        frags = F.reshape(frags, view, part.shape)
        view = tuple(part.shape)
    dtype = layout.dtype.name
    try:
        for op, constant in (("mul", part.scale), ("add", part.offset)):
            if constant is not None:
                frags = _constant_step(frags, op, dtype, constant, view, part, dst)
        if part.cast is not None:
            frags = F.cast(frags, np.dtype(part.cast).name, {part.src: dtype})
    except (AffineError, ValueError) as error:
        raise RuleError(f"destination {dst!r}{_by(origin)}: part {part.src!r}: {error}") from None
    frags = F.slice_box(frags, start, limit)
    for axis, offset in enumerate(dst_start):
        if offset:
            frags = F.shift(frags, axis, offset)
    return F.to_pieces(dst, frags, {part.src: layout.ndim}, origin)


def _constant_step(frags, op, dtype, constant, view, part: Part, dst: str):
    values = np.asarray(constant, np.float64)
    if values.ndim == 0:
        return F.affine(frags, op, dtype, values, None)
    if view and not in_range(part.along, len(view)):
        raise RuleError(f"it has shape {view}; along={part.along} is not one of its {len(view)} axes: give an axis "
                        f"from {-len(view)} to {len(view) - 1}")
    axis = part.along % len(view) if view else 0
    if not view or values.shape != (view[axis],):
        raise RuleError(f"it has shape {view}; its vector of {values.size} constants does not fit its axis "
                        f"{part.along} (along=)")
    return F.affine(frags, op, dtype, values, axis)


def _part_view_before_reshape(part: Part, layout: Layout) -> tuple[int, ...]:
    rest = layout.shape[len(part.index):]
    inner = range(len(rest)) if part.transpose is None else part.transpose
    return tuple(rest[p] for p in inner)


def lower_rule(rule: Rule, sources: Mapping[str, Layout], dst_layout: Layout) -> list[Piece]:
    dst, shape = rule.dst, dst_layout.shape
    if not rule.parts:
        raise RuleError(f"destination {dst!r}: its rule has no parts")
    if not in_range(rule.axis, len(shape)):
        raise RuleError(f"destination {dst!r} of shape {shape}{_by(rule.origin)}: axis={rule.axis} is not one of its "
                        f"{max(len(shape), 1)} axes: give the axis its parts are concatenated along")
    axis = rule.axis % len(shape) if shape else 0
    views = [_part_view(p, dst, sources, rule.origin) for p in rule.parts]
    for part, (_, _, view_shape) in zip(rule.parts, views):
        other = [n for i, n in enumerate(view_shape) if i != axis]
        want = [n for i, n in enumerate(shape) if i != axis]
        if len(view_shape) != len(shape) or other != want:
            raise RuleError(f"destination {dst!r} of shape {shape}: part {part.src!r} gives shape "
                            f"{view_shape}, which does not fit (only axis {axis} may differ)")
    if not shape:
        extents = [1 for _ in views]
        total = 1
    else:
        extents = [v[2][axis] for v in views]
        total = shape[axis]
    groups = rule.groups
    slices = _slices(rule, extents, axis)
    pieces, offset = [], 0
    for group in range(groups):
        for part, (layout, perm, view_shape), extent, count in zip(rule.parts, views, extents, slices):
            step = extent // count
            size = list(shape)
            dst_start = [0] * len(shape)
            src_start = list(part.index) + [0] * len(view_shape)
            if shape:
                size[axis] = step
                dst_start[axis] = offset
                src_start[len(part.index) + axis] = group // part.replicas * step
            offset += step
            if part.shape is not None or part.scale is not None or part.offset is not None:
                limit = [a + n for a, n in zip(src_start[len(part.index):], size)]
                pieces.extend(_fragment_pieces(part, layout, dst, src_start[len(part.index):], limit, dst_start,
                                               rule.origin))
                continue
            pieces.append(Piece(dst, tuple(dst_start), tuple(size), part.src, tuple(src_start),
                                None if perm == tuple(range(len(perm))) else perm, part.cast, rule.origin))
    if offset != total:
        # Report the exact region, through the same coverage check as explicit pieces.
        check_coverage(dst, dst_layout, pieces)
    return pieces


def _slices(rule: Rule, extents: list[int], axis: int) -> list[int]:
    """How many slices each part is cut into: the rule's groups over the part's replicas (the
    groups that hold each slice), checked to divide."""
    groups = rule.groups
    if groups < 1:
        raise RuleError(f"destination {rule.dst!r}{_by(rule.origin)}: groups={groups} is not a group count (>= 1)")
    out = []
    for part in rule.parts:
        replicas = part.replicas
        if not isinstance(replicas, numbers.Integral) or isinstance(replicas, bool) or replicas < 1 \
                or groups % replicas:
            raise RuleError(f"destination {rule.dst!r}{_by(rule.origin)}: part {part.src!r} has "
                            f"replicas={replicas!r}, which does not divide the rule's {groups} groups (give the "
                            "number of consecutive groups that hold each of its slices)")
        out.append(groups // replicas)
    if any(e % n for e, n in zip(extents, out)):
        replicas = [p.replicas for p in rule.parts]
        cut = f"{groups} groups" if set(replicas) == {1} else f"{out} slices ({groups} groups, replicas {replicas})"
        raise RuleError(f"destination {rule.dst!r}: parts of extents {extents} along axis {axis} do not "
                        f"split into {cut}")
    return out


def _overlap(a: Piece, b: Piece):
    lo = [max(x, y) for x, y in zip(a.dst_start, b.dst_start)]
    hi = [min(x + n, y + m) for x, n, y, m in zip(a.dst_start, a.size, b.dst_start, b.size)]
    return (lo, [h - l for l, h in zip(lo, hi)]) if all(h > l for l, h in zip(lo, hi)) else None


def _first_overlap(live: list[Piece]):
    """(a, b, region) for two pieces that overlap, or None. A sweep along the axis the pieces
    are cut most on compares each piece only with those still open there (a RoPE reorder cuts a
    q_proj into one piece per row: thousands, which a test of every pair made quadratic)."""
    rank = len(live[0].size) if live else 0
    if rank == 0:
        return (live[0], live[1], _overlap(live[0], live[1])) if len(live) > 1 else None
    axis = max(range(rank), key=lambda d: len({p.dst_start[d] for p in live}))
    open_ = []
    for b in sorted(live, key=lambda p: p.dst_start[axis]):
        start = b.dst_start[axis]
        open_ = [a for a in open_ if a.dst_start[axis] + a.size[axis] > start]
        for a in open_:
            hit = _overlap(a, b)
            if hit:
                return a, b, hit
        open_.append(b)
    return None


def _first_gap(shape, pieces: list[Piece]):
    """A region of the destination no piece covers (coordinate-compressed scan)."""
    cuts = [sorted({0, n} | {p.dst_start[d] for p in pieces} | {p.dst_start[d] + p.size[d] for p in pieces})
            for d, n in enumerate(shape)]
    covered = np.zeros([len(c) - 1 for c in cuts], dtype=bool)
    for p in pieces:
        covered[tuple(slice(c.index(a), c.index(a + n)) for c, a, n in zip(cuts, p.dst_start, p.size))] = True
    cell = tuple(int(i) for i in np.argwhere(~covered)[0])
    return [c[i] for c, i in zip(cuts, cell)], [c[i + 1] - c[i] for c, i in zip(cuts, cell)]


def _listed(values, kind, what: str) -> list:
    """`values` as a list of `kind`; RuleError naming `what` for anything else."""
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
        raise RuleError(f"{what} is {type(values).__name__} {values!r:.60}: give a list of {kind.__name__}")
    values = list(values)
    for value in values:
        if not isinstance(value, kind):
            raise RuleError(f"{what} holds {type(value).__name__} {value!r:.60}, not a {kind.__name__}")
    return values


def _layouts(given, what: str) -> Mapping[str, Layout]:
    """A mapping of names to Layouts; RuleError naming `what` for anything else."""
    if not isinstance(given, Mapping) or not all(isinstance(v, Layout) for v in given.values()):
        raise RuleError(f"{what} is {type(given).__name__} {given!r:.60}: give a mapping of names to Layouts "
                        "(reshard.layouts_of(tree) makes one from a tree of arrays)")
    return given


def check_coverage(dst: str, layout: Layout, pieces: list[Piece]) -> None:
    """Raises RuleError unless `pieces` cover every element of `dst` exactly once."""
    if not isinstance(layout, Layout):
        raise RuleError(f"check_coverage({dst!r}): layout is {type(layout).__name__}, not a Layout")
    pieces = _listed(pieces, Piece, f"check_coverage({dst!r}): pieces")
    shape = layout.shape
    for p in pieces:
        if len(p.dst_start) != len(shape) or len(p.size) != len(shape):
            raise RuleError(f"destination {dst!r} of shape {shape}: piece from {p.src!r} has rank "
                            f"{len(p.size)}")
        if any(a < 0 or n < 0 or a + n > m for a, n, m in zip(p.dst_start, p.size, shape)):
            raise RuleError(f"destination {dst!r} of shape {shape}: region "
                            f"{region_text(p.dst_start, p.size)} (from {p.src!r}) is outside it")
    live = [p for p in pieces if all(n > 0 for n in p.size)]
    if len(live) == 1 and tuple(live[0].size) == shape:
        return
    twice = _first_overlap(live)
    if twice:
        a, b, hit = twice
        raise RuleError(f"destination {dst!r}: region {region_text(*hit)} is covered twice "
                        f"(by {a.src!r} and {b.src!r})")
    volume = sum(int(np.prod(p.size, dtype=np.int64)) for p in live)
    if volume != int(np.prod(shape, dtype=np.int64)):
        start, size = _first_gap(shape, live)
        raise RuleError(f"destination {dst!r}: region {region_text(start, size)} is not covered by any rule")


@functools.lru_cache(maxsize=1024)
def _affine_runs(affine, source: str, sent: str) -> bool:
    """Whether the copy runs `affine` from `source` to `sent`: checked once per chain and dtypes,
    not per piece (a preset's RoPE reorder gives every scaled query row a piece of one chain)."""
    try:
        affine.check(source, sent, "")
    except AffineError:
        return False
    return True


def _check_piece_source(p: Piece, sources: Mapping[str, Layout], dst_layout: Layout) -> None:
    if p.src not in sources:
        raise RuleError(f"destination {p.dst!r}{_by(p.origin)}: a piece reads source {p.src!r}, which does not "
                        f"exist{closest(p.src, sources, 'source')}")
    src = sources[p.src]
    perm = tuple(range(src.ndim)) if p.perm is None else tuple(p.perm)
    if sorted(perm) != list(range(src.ndim)):
        raise RuleError(f"destination {p.dst!r}: permutation {p.perm} does not fit source {p.src!r} "
                        f"of shape {src.shape}")
    view_shape = tuple(src.shape[a] for a in perm)
    if len(p.src_start) != src.ndim:
        raise RuleError(f"destination {p.dst!r}: src_start {p.src_start} does not have the rank of "
                        f"source {p.src!r} {src.shape}")
    size = aligned_source_size(p.size, src.ndim, p.dst)
    if any(a < 0 or a + n > m for a, n, m in zip(p.src_start, size, view_shape)):
        raise RuleError(f"destination {p.dst!r}: source region {region_text(p.src_start, size)} is outside "
                        f"source {p.src!r} of (transformed) shape {view_shape}")
    sent = np.dtype(p.dtype) if p.dtype is not None else src.dtype
    if p.affine is not None and not _affine_runs(p.affine, src.dtype.name, sent.name):
        try:
            p.affine.check(src.dtype.name, sent.name, f"destination {p.dst!r}{_by(p.origin)}, source {p.src!r}")
        except AffineError as error:
            raise RuleError(str(error)) from None
    if sent != dst_layout.dtype:
        how = "" if p.dtype is not None else "; add cast= to the rule to convert on the sender"
        raise RuleError(f"destination {p.dst!r}: dtype mismatch: it is {dst_layout.dtype.name}, source "
                        f"{p.src!r} sends {sent.name}{how}")


def aligned_source_size(size, src_rank: int, dst: str) -> tuple[int, ...]:
    """The piece's extent on the source's axes (trailing axes aligned)."""
    size = tuple(size)
    if src_rank >= len(size):
        return (1,) * (src_rank - len(size)) + size
    extra = size[:len(size) - src_rank]
    if any(n != 1 for n in extra):
        raise RuleError(f"destination {dst!r}: a piece of size {size} has non-unit leading axes that "
                        f"its source of rank {src_rank} cannot fill")
    return size[len(size) - src_rank:]


def identity_rules(destinations: Iterable[str]) -> list[Rule]:
    names = list(destinations) if isinstance(destinations, Mapping) else destinations  # a {name: Layout}'s names
    return [Rule.copy(name) for name in _listed(names, str, "identity_rules: destinations")]


def lower(rules, sources: Mapping[str, Layout], destinations: Mapping[str, Layout]) -> list[Piece]:
    """All pieces, validated: every destination covered exactly once, shapes and dtypes matching."""
    sources, destinations = _layouts(sources, "lower: sources"), _layouts(destinations, "lower: destinations")
    if rules is None:
        missing = [name for name in destinations if name not in sources]
        if missing:
            raise RuleError(f"destination {missing[0]!r} has no source of the same name (rules=None maps "
                            f"by name){closest(missing[0], sources, 'source')}; give rules that say which "
                            "sources make it (a preset such as rules.qwen3(params, source='maxtext'), "
                            "rules.from_function(convert, params), or Rule/Part)")
        rules = identity_rules(destinations)
    if isinstance(rules, (str, bytes, dict)) or not hasattr(rules, "__iter__"):
        raise RuleError(f"rules is {type(rules).__name__} {rules!r:.60}: give a list of Rule or Piece, or None")
    rules = list(rules)
    by_dst: dict[str, list[Piece]] = defaultdict(list)
    for rule in rules:
        if not isinstance(rule, (Rule, Piece)):  # a string, a dict: named here, not as an AttributeError
            raise RuleError(f"rules hold {type(rule).__name__} {str(rule)[:60]!r}, not a Rule or Piece "
                            "(see jax_amem.reshard.rules)")
        if type(rule) is Piece and not rule.origin:   # written by hand (rule_checks.checked_rules)
            rule = checked_piece(rule)
        if rule.dst not in destinations:
            raise RuleError(f"a rule{_by(rule.origin)} writes destination {rule.dst!r}, which is not among "
                            f"the {len(destinations)} destination tensors"
                            f"{closest(rule.dst, destinations, 'destination')}."
                            f"{nested_names_hint([rule.dst], destinations)}")
        dst_layout = destinations[rule.dst]
        new = lower_rule(rule, sources, dst_layout) if isinstance(rule, Rule) else [rule]
        by_dst[rule.dst].extend(new)
    pieces = []
    for name, layout in destinations.items():
        mine = by_dst.get(name)
        if not mine:
            if int(np.prod(layout.shape, dtype=np.int64)) == 0:
                continue
            origins = sorted({r.origin for r in rules if r.origin})
            raise RuleError(f"destination {name!r}: region {region_text([0] * layout.ndim, layout.shape)} "
                            f"is not covered by any rule (the rules{' from ' + ', '.join(origins) if origins else ''}"
                            f" write {len(by_dst)} destinations{closest(name, by_dst, 'written')})")
        for p in mine:
            _check_piece_source(p, sources, layout)
        check_coverage(name, layout, mine)
        pieces.extend(p for p in mine if all(n > 0 for n in p.size))
    return pieces
