"""Tied weights: names of a destination that are one buffer (a state dict's `lm_head.weight`
and embedding hold one storage), folded so that the plan writes each buffer once."""

from __future__ import annotations

from ..reshard.lowering import identity_rules, lower
from .errors import SwapError


def fold(rules, groups, src_layouts, dst_layouts, same_array=None) -> tuple[list, dict]:
    """(rules, destination layouts) writing each tied group once. Where the rules write two
    names of a group they must write the same values, and the later name is dropped; different
    values for one buffer are refused. The kept twins' rules come back lowered to pieces (the
    planner takes pieces as they are, so nothing is lowered twice).

    Same values means the same source elements in the same places after merging adjacent
    pieces (a concatenation of a tensor's halves is the tensor), where source names that are
    one jax.Array (`same_array`: {name: the first name of that array}) are one source."""
    if not groups:
        return rules, dst_layouts
    if rules is None:  # same names: the twins a source names
        rules = identity_rules([n for n in dst_layouts if n in src_layouts])
    rules = list(rules)
    by_dst: dict = {}
    for rule in rules:
        by_dst.setdefault(rule.dst, []).append(rule)
    canonical = same_array or {}
    lowered: dict = {}

    def pieces(name):
        if name not in lowered:
            lowered[name] = lower(by_dst[name], src_layouts, {name: dst_layouts[name]})
        return merged([(p.dst_start, p.size, canonical.get(p.src, p.src), p.src_start, p.perm or (), p.dtype or "")
                       for p in lowered[name]])

    dropped = set()
    for group in groups:
        written = [n for n in group if n in by_dst]
        for other in written[1:]:
            if pieces(other) != pieces(written[0]):
                raise SwapError(f"destinations {written[0]!r} and {other!r} share memory: they are one tensor (tied "
                                "weights: the same storage), but the rules write different values into them. Write "
                                "one of them (drop the other's rule), or untie the model's weights (nothing was "
                                "written)")
            dropped.add(other)
    folded, emitted = [], set()
    for rule in rules:
        if rule.dst in dropped or rule.dst in emitted:
            continue
        if rule.dst in lowered:  # a kept twin: every rule of it, lowered above, as pieces
            folded.extend(lowered[rule.dst])
            emitted.add(rule.dst)
        else:
            folded.append(rule)
    written = {r.dst for r in folded}
    return folded, {n: layout for n, layout in dst_layouts.items() if n in written}


def merged(pieces) -> list:
    """Pieces (dst_start, size, src, src_start, perm, dtype) sorted, adjacent ones merged: two
    pieces that continue each other along one axis in the destination and in the source (same
    source, transpose and cast, equal extents on every other axis) become one."""
    out = sorted(pieces)
    changed = True
    while changed:
        changed = False
        for i in range(len(out) - 1):
            joined = _join(out[i], out[i + 1])
            if joined is not None:
                out[i:i + 2] = [joined]
                changed = True
                break
        if not changed:
            out.sort()
    return out


def _join(a, b):
    (a_dst, a_size, a_src, a_start, a_perm, a_dtype), (b_dst, b_size, b_src, b_start, b_perm, b_dtype) = a, b
    if (a_src, a_perm, a_dtype) != (b_src, b_perm, b_dtype) or len(a_start) != len(a_dst) or len(b_start) != len(a_dst):
        return None
    differ = [k for k in range(len(a_dst)) if a_dst[k] != b_dst[k] or a_size[k] != b_size[k]]
    if len(differ) != 1:
        return None
    k = differ[0]
    if b_dst[k] != a_dst[k] + a_size[k] or b_start[k] != a_start[k] + a_size[k]:
        return None
    if any(a_start[j] != b_start[j] for j in range(len(a_dst)) if j != k):
        return None
    size = tuple(a_size[j] + (b_size[j] if j == k else 0) for j in range(len(a_size)))
    return (a_dst, size, a_src, a_start, a_perm, a_dtype)
