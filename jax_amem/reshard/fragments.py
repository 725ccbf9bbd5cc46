"""Fragments: a tensor known as boxes of source tensors, closed under layout operations.

A `Fragment` says: the box `vstart + [0, vsize)` of a value (a rule part, a traced
intermediate, a destination) equals a box of one source tensor, axis for axis:
value axis j, when its extent is more than 1, runs along source axis `axis_of[j]`
from `sstart`; every other source axis stays at its `sstart` coordinate. A value is
a list of fragments that tile it.

Transpose, slice, squeeze, expand, reshape (row-major, any shapes of equal size)
and concatenation map fragments to fragments, splitting them only where a box of
the result is not one box of the source (a head merge `[H, hd, D] -> [H*hd, D]`
becomes H fragments). `pick` re-indexes one axis by constant rows (a strided or
reversed slice, a constant-index take, a tile, a broadcast): a box keeps unit
steps, so each run of consecutive rows is a fragment and any other step cuts one. `to_pieces` turns them into the planner's `Piece`s; the
planner's own convention (trailing axes aligned, a permutation on the sender) is
reached by permuting the source so its axes meet the destination's.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from .affine import FLOATS, Affine, Step, final_dtype, step_for
from .rule_types import Piece


@dataclass(frozen=True)
class Fragment:
    vstart: tuple[int, ...]
    vsize: tuple[int, ...]
    src: str
    sstart: tuple[int, ...]       # on the source's own axes
    axis_of: tuple[int, ...]      # per value axis: the source axis it runs along, -1 where vsize is 1
    dtype: str | None = None      # the sender's cast after `affine` (None: none)
    affine: Affine | None = None  # constant steps the elements go through (affine.py)


def _normal(f: Fragment) -> Fragment:
    axis_of = tuple(a if n > 1 else -1 for a, n in zip(f.axis_of, f.vsize))
    return f if axis_of == f.axis_of else replace(f, axis_of=axis_of)


def whole(src: str, shape, index=(), transpose=None, dtype=None) -> Fragment:
    """The value `source[index].transpose(transpose)`, one fragment."""
    shape, index = tuple(shape), tuple(index)
    k = len(index)
    inner = tuple(range(len(shape) - k)) if transpose is None else tuple(transpose)
    axes = tuple(k + a for a in inner)
    size = tuple(shape[a] for a in axes)
    return _normal(Fragment((0,) * len(size), size, src, index + (0,) * (len(shape) - k), axes, dtype))


def _shift_source(f: Fragment, deltas) -> tuple[int, ...]:
    sstart = list(f.sstart)
    for j, d in enumerate(deltas):
        if d and f.axis_of[j] >= 0:
            sstart[f.axis_of[j]] += d
    return tuple(sstart)


def transpose(frags, perm) -> list[Fragment]:
    pick = operator.itemgetter(*perm) if len(perm) > 1 else (lambda t: tuple(t[a] for a in perm))
    return [Fragment(tuple(pick(f.vstart)), tuple(pick(f.vsize)), f.src, f.sstart, tuple(pick(f.axis_of)), f.dtype,
                     f.affine) for f in frags]


def slice_box(frags, start, limit) -> list[Fragment]:
    """value[start:limit] (stride 1), re-based at 0."""
    out = []
    for f in frags:
        lo = [max(a, s) for a, s in zip(f.vstart, start)]
        hi = [min(a + n, e) for a, n, e in zip(f.vstart, f.vsize, limit)]
        if any(h <= l for l, h in zip(lo, hi)):
            continue
        out.append(_normal(Fragment(tuple(l - s for l, s in zip(lo, start)), tuple(h - l for l, h in zip(lo, hi)),
                                    f.src, _shift_source(f, [l - a for l, a in zip(lo, f.vstart)]), f.axis_of,
                                    f.dtype, f.affine)))
    return out


def runs(rows) -> list[tuple[int, int, int]]:
    """`rows` as (output start, input start, length) runs of consecutive increasing rows."""
    out = []
    for i, r in enumerate(rows):
        if out and out[-1][1] + out[-1][2] == r:
            o, a, n = out[-1]
            out[-1] = (o, a, n + 1)
        else:
            out.append((i, int(r), 1))
    return out


def pick(frags, axis: int, rows) -> list[Fragment]:
    """The value re-indexed along `axis`: output row i is input row `rows[i]` (rows in range;
    repeats and any order allowed). A run of consecutive rows stays one fragment per input
    fragment it crosses; a reversed or strided axis becomes one fragment per row, as no box
    of a source has another step."""
    by_extent = defaultdict(list)   # input fragments by their [start, end) along `axis`
    for f in frags:
        by_extent[(f.vstart[axis], f.vstart[axis] + f.vsize[axis])].append(f)
    if not by_extent:
        return []
    extents = sorted(by_extent)
    starts = [a for a, _ in extents]
    longest = max(b - a for a, b in extents)
    out = []
    for o, r, n in runs(rows):
        # the extents that can meet [r, r + n): those starting in (r - longest, r + n)
        for a, b in extents[bisect.bisect_right(starts, r - longest):bisect.bisect_left(starts, r + n)]:
            lo, hi = max(a, r), min(b, r + n)
            if hi <= lo:
                continue
            for f in by_extent[(a, b)]:
                deltas = [0] * len(f.vsize)
                deltas[axis] = lo - a
                out.append(_normal(Fragment(f.vstart[:axis] + (o + lo - r,) + f.vstart[axis + 1:],
                                            f.vsize[:axis] + (hi - lo,) + f.vsize[axis + 1:], f.src,
                                            _shift_source(f, deltas), f.axis_of, f.dtype, f.affine)))
    return out


def shift(frags, axis: int, offset: int) -> list[Fragment]:
    """The same fragments placed `offset` further along `axis` (concatenation)."""
    return [replace(f, vstart=f.vstart[:axis] + (f.vstart[axis] + offset,) + f.vstart[axis + 1:]) for f in frags]


def squeeze(frags, dims) -> list[Fragment]:
    if not frags:
        return []
    dropped = set(dims)
    keep = [j for j in range(len(frags[0].vsize)) if j not in dropped]
    return [Fragment(tuple(f.vstart[j] for j in keep), tuple(f.vsize[j] for j in keep), f.src, f.sstart,
                     tuple(f.axis_of[j] for j in keep), f.dtype, f.affine) for f in frags]


def expand(frags, rank: int, kept) -> list[Fragment]:
    """New unit axes: value axis i of the input becomes axis kept[i] of a rank-`rank` value."""
    out = []
    for f in frags:
        vstart, vsize, axis_of = [0] * rank, [1] * rank, [-1] * rank
        for i, j in enumerate(kept):
            vstart[j], vsize[j], axis_of[j] = f.vstart[i], f.vsize[i], f.axis_of[i]
        out.append(replace(f, vstart=tuple(vstart), vsize=tuple(vsize), axis_of=tuple(axis_of)))
    return out


def value_dtype(f: Fragment, source_dtypes) -> str:
    """The dtype of the value `f` holds: its cast, else its last constant step's, else its source's."""
    return f.dtype or (f.affine.dtype if f.affine is not None else source_dtypes[f.src])


def cast(frags, dtype: str, source_dtypes, round_between: bool = False) -> list[Fragment]:
    """Each fragment sent in `dtype`. A second cast is refused, unless `round_between` and both
    are floating dtypes: then the first becomes a rounding step (x * 1 in its dtype), so
    `x.astype(bfloat16).astype(float32)` sends float32 values rounded to bfloat16, as JAX does."""
    out = []
    for f in frags:
        current = value_dtype(f, source_dtypes)
        if dtype == current:
            out.append(f)
        elif f.dtype is None:
            out.append(replace(f, dtype=dtype))
        elif round_between and f.dtype in FLOATS and dtype in FLOATS and source_dtypes[f.src] in FLOATS:
            out.append(replace(f, dtype=dtype, affine=_then(f.affine, Step("mul", f.dtype, (1.0,)))))
        else:
            raise ValueError(f"source {f.src!r} is cast twice ({source_dtypes[f.src]} -> {f.dtype} -> {dtype}); "
                             "the sender casts once: cast straight to the final dtype")
    return out


def affine(frags, op: str, dtype: str, constant, axis: int | None) -> list[Fragment]:
    """Each fragment's elements through one more constant step `op` run in `dtype` (the value's
    dtype: a cast before it is the step's rounding of its input). `constant`: a numpy scalar,
    or a vector along value axis `axis`, stored per fragment in source coordinates. Fragments
    of one source that read the same source range share one step (one view for the sender);
    AffineError for a dtype the copy cannot compute in."""
    constant = np.asarray(constant)
    if axis is None:
        step = step_for(op, dtype, constant.reshape(-1)[:1])
        return [replace(f, dtype=None, affine=_then(f.affine, step)) for f in frags]
    # Per fragment: the source axis its part of the vector runs along and the values there.
    pieces = []
    for f in frags:
        values = constant[f.vstart[axis]:f.vstart[axis] + f.vsize[axis]]
        a = f.axis_of[axis]
        pieces.append((f, a, f.sstart[a] if a >= 0 else 0, values))
    # One vector per (source, axis, steps so far) when the fragments agree on every coordinate.
    merged = {}
    for f, a, start, values in pieces:
        if a < 0:
            continue
        key = (f.src, a, f.affine, f.dtype)
        table = merged.setdefault(key, {})
        for k, v in enumerate(values.tolist()):
            if table is not None and table.setdefault(start + k, v) != v:
                merged[key] = table = None
    steps = {}
    for key, table in merged.items():
        if table:
            lo, hi = min(table), max(table) + 1
            vector = np.zeros(hi - lo, constant.dtype)
            vector[np.array(list(table)) - lo] = list(table.values())
            steps[key] = step_for(op, dtype, vector, key[1], lo)
    out = []
    for f, a, start, values in pieces:
        if a < 0:
            step = step_for(op, dtype, values[:1])
        else:
            step = steps.get((f.src, a, f.affine, f.dtype)) or step_for(op, dtype, values, a, start)
        out.append(replace(f, dtype=None, affine=_then(f.affine, step)))
    return out


def _then(chain: Affine | None, step) -> Affine:
    return Affine((step,)) if chain is None else chain.then(step)


def covers(frags, shape) -> bool:
    """Whether `frags` is one fragment holding the whole value of `shape` (a view of one source)."""
    return len(frags) == 1 and frags[0].vsize == tuple(shape) and not any(frags[0].vstart)


def substitute(frags, bindings) -> list[Fragment] | None:
    """Fragments of placeholder sources rewritten onto real ones.

    `frags` were computed from placeholder sources (each a `whole` fragment of a value);
    `bindings[name]` is the one fragment that value really is (see `covers`). Layout
    operations commute with this rewrite (they act on value coordinates only), so the result
    equals running the operations on the real fragments. None where the real fragment is
    already cast and the placeholder's result casts again: the caller runs the operations
    itself to get the "cast twice" error with the real names.
    """
    out = []
    for f in frags:
        g = bindings[f.src]
        if (f.dtype is not None or f.affine is not None) and (g.dtype is not None or g.affine is not None):
            return None
        if (f.affine is not None and any(not s.is_scalar for s in f.affine.steps)) or \
                (g.affine is not None and any(not s.is_scalar for s in g.affine.steps)):
            return None  # vectors are in source coordinates: run the operations on the real fragments
        sstart = list(g.sstart)
        for j, offset in enumerate(f.sstart):
            if offset:
                sstart[g.axis_of[j]] += offset
        axis_of = tuple(g.axis_of[a] if a >= 0 else -1 for a in f.axis_of)
        out.append(Fragment(f.vstart, f.vsize, g.src, tuple(sstart), axis_of,
                            g.dtype if f.dtype is None else f.dtype, g.affine if f.affine is None else f.affine))
    return out


def zeroed(bindings, source_ranks):
    """The bindings with each source start at 0 under a name of its own (two bindings may
    read one source), those names' ranks, and the binding key of each name: what
    `piece_template` needs, built once per call's bindings."""
    tags = {key: f"\0binding {i}" for i, key in enumerate(bindings)}
    zero = {key: replace(g, src=tags[key], sstart=(0,) * len(g.sstart)) for key, g in bindings.items()}
    ranks = {tags[key]: source_ranks[g.src] for key, g in bindings.items()}
    return zero, ranks, {tag: key for key, tag in tags.items()}


def piece_template(frags, zero) -> list[tuple]:
    """`to_pieces` of `substitute(frags, bindings)` with every binding's source start at 0
    (`zero = zeroed(bindings, ...)`): rows (binding key, dst_start, size, src_start, perm,
    dtype) that `from_template` turns into the pieces of any bindings with the same sources,
    axes and casts (the layers of a stacked tree differ only in their start). `to_pieces`
    reads only axes, sizes and ranks, and a piece's src_start is its fragment's start
    permuted, so it is linear in the start."""
    bindings, ranks, keys = zero
    return [(keys[p.src], p.dst_start, p.size, p.src_start, p.perm, p.dtype, p.affine)
            for p in to_pieces("", substitute(frags, bindings), ranks)]


def from_template(dst: str, template, bindings, origin: str = "") -> list[Piece]:
    out = []
    for key, dst_start, size, start, perm, dtype, chain in template:  # map(): ~70k pieces per model
        g = bindings[key]
        base = g.sstart if perm is None else tuple(map(g.sstart.__getitem__, perm))
        out.append(Piece(dst, dst_start, size, g.src, tuple(map(operator.add, start, base)), perm, dtype, origin,
                         chain))
    return out


# -- reshape --------------------------------------------------------------------------------


def _regions(old, new):
    """Runs of axes with equal products on both sides: [(old axes, new axes)], split at every
    common prefix product (unit axes excluded: they are dropped and re-inserted)."""
    regions, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        oi, nj = [i], [j]
        po, pn = old[i], new[j]
        i, j = i + 1, j + 1
        while po != pn:
            if po < pn:
                po *= old[i]; oi.append(i); i += 1
            else:
                pn *= new[j]; nj.append(j); j += 1
        regions.append((oi, nj))
    return regions


def _unravel(flat: int, shape) -> list[int]:
    out = []
    for n in reversed(shape):
        out.append(flat % n)
        flat //= n
    return out[::-1]


def _ravel(index, shape) -> int:
    flat = 0
    for i, n in zip(index, shape):
        flat = flat * n + i
    return flat


def _reshape_dense(f: Fragment, old, new) -> list[Fragment]:
    """`f` (on `old`, no unit axes) on `new` (no unit axes)."""
    # Per region, the list of (old offsets within f, new start, new size, source axis) choices;
    # the result is their product (one fragment per combination).
    choices = []
    for oi, nj in _regions(old, new):
        if len(oi) == 1 and len(nj) == 1:
            j = oi[0]
            choices.append([({j: 0}, (f.vstart[j],), (f.vsize[j],), (f.axis_of[j],))])
            continue
        oshape, nshape = [old[a] for a in oi], [new[b] for b in nj]
        last = oi[-1]
        outer = [range(f.vsize[a]) for a in oi[:-1]]
        runs = []
        for idx in itertools.product(*outer):
            # one row of f along the region's last old axis: a contiguous flat range
            ostart = [f.vstart[a] + d for a, d in zip(oi[:-1], idx)] + [f.vstart[last]]
            flat, left = _ravel(ostart, oshape), f.vsize[last]
            done = 0
            while left:
                nidx = _unravel(flat, nshape)
                take = min(left, nshape[-1] - nidx[-1])
                offsets = dict(zip(oi[:-1], idx))
                offsets[last] = done
                axes = [-1] * (len(nj) - 1) + [f.axis_of[last] if take > 1 else -1]
                runs.append((offsets, tuple(nidx), (1,) * (len(nj) - 1) + (take,), tuple(axes)))
                flat, left, done = flat + take, left - take, done + take
        choices.append(runs)
    out = []
    for combo in itertools.product(*choices):
        deltas = [0] * len(old)
        vstart, vsize, axis_of = [], [], []
        for offsets, start, size, axes in combo:
            for a, d in offsets.items():
                deltas[a] = d
            vstart += start; vsize += size; axis_of += axes
        out.append(_normal(Fragment(tuple(vstart), tuple(vsize), f.src, _shift_source(f, deltas),
                                    tuple(axis_of), f.dtype, f.affine)))
    return out


def reshape(frags, old, new) -> list[Fragment]:
    """value.reshape(new), row-major, from shape `old`."""
    old, new = tuple(old), tuple(new)
    if math.prod(old) != math.prod(new):
        raise ValueError(f"cannot reshape {old} into {new}")
    if math.prod(old) == 0:
        return []
    old_units = [j for j, n in enumerate(old) if n == 1]
    new_kept = [j for j, n in enumerate(new) if n != 1]
    dense_old = tuple(n for n in old if n != 1)
    dense_new = tuple(n for n in new if n != 1)
    out = []
    for f in squeeze(frags, old_units):
        moved = [f] if dense_old == dense_new else _reshape_dense(f, dense_old, dense_new)
        out.extend(expand(moved, len(new), new_kept))
    return out


# -- to the planner's pieces ----------------------------------------------------------------


def to_pieces(dst: str, frags, source_ranks, origin: str = "") -> list[Piece]:
    """Pieces for destination `dst`: the source permuted so that each fragment's source axes
    sit under the destination axes they run along (trailing axes aligned). A piece with
    constant steps carries them and the dtype they send."""
    out = []
    todo = list(frags)
    while todo:
        f = todo.pop()
        r, k = source_ranks[f.src], len(f.vsize)
        blocked = [j for j, a in enumerate(f.axis_of) if a >= 0 and r - k + j < 0]
        if blocked:  # a destination axis with no source axis under it: cut it into single rows
            j = blocked[0]
            todo.extend(slice_one(f, j, i) for i in range(f.vsize[j]))
            continue
        perm = [-1] * r
        for j, a in enumerate(f.axis_of):
            if a >= 0:
                perm[r - k + j] = a
        rest = iter(a for a in range(r) if a not in set(f.axis_of))
        perm = [p if p >= 0 else next(rest) for p in perm]
        identity = perm == list(range(r))
        dtype = f.dtype if f.affine is None else final_dtype(f.affine, f.dtype, "float32")
        out.append(Piece(dst, f.vstart, f.vsize, f.src, tuple(f.sstart[a] for a in perm),
                         None if identity else tuple(perm), dtype, origin, f.affine))
    return out


def slice_one(f: Fragment, axis: int, i: int) -> Fragment:
    deltas = [0] * len(f.vsize)
    deltas[axis] = i
    return _normal(Fragment(f.vstart[:axis] + (f.vstart[axis] + i,) + f.vstart[axis + 1:],
                            f.vsize[:axis] + (1,) + f.vsize[axis + 1:], f.src, _shift_source(f, deltas),
                            f.axis_of, f.dtype, f.affine))
