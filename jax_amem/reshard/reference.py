"""The planner in plain Python: slow, short, and the oracle the native planner is checked against.

The algorithm (the native planner in src/reshard/ follows it step by step):

1. Items. For each source tensor s and each distinct box b of its layout, in
   order: for each piece reading s (by piece index), the part of the piece's
   source region inside b, carried to destination coordinates; for each
   destination box e of the piece's tensor and each owner q holding e (by id),
   the part inside e is an item (piece, e, q, region).
2. Replica choice (per (s, b), so any rank can redo it alone). With one replica
   it sends everything. Otherwise an item whose destination owner holds a
   replica is copied on that device; an item whose owner's process holds
   replicas goes over NVLink from one of those; the rest cross the network from
   any replica. Each class's items form a stream, in item order, whose bytes
   are cut into equal ranges, one per candidate replica (the candidate list is
   rotated by a hash of (s, b) so that small items spread over tensors). An
   item below `split_bytes` goes whole to the range holding its midpoint;
   a larger one is cut along its first non-unit axis at the range bounds,
   rounded to whole rows.
3. Blocks. Each (item part, sender) becomes strided blocks: the part's box in
   the sender's transformed source shard and in the receiver's destination
   shard, axes merged while contiguous in both, innermost contiguous run plus
   up to two counted strides per block.
4. Transfers. Blocks are grouped by (sender, receiver, destination tensor,
   view), sorted by destination then source offset, and adjacent blocks merged.
"""

from __future__ import annotations

import itertools

import numpy as np

from .problem import R, Problem

MASK = (1 << 64) - 1
NET = -1  # stream key of the network class


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def rotation(source: int, box: int, candidates: int) -> int:
    return splitmix64(source * 1000003 + box) % candidates


def intersect(a_start, a_size, b_start, b_size):
    lo = [max(x, y) for x, y in zip(a_start, b_start)]
    hi = [min(x + n, y + m) for x, n, y, m in zip(a_start, a_size, b_start, b_size)]
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return lo, [h - l for l, h in zip(lo, hi)]


def row_major_strides(shape):
    strides, step = [0] * R, 1
    for a in range(R - 1, -1, -1):
        strides[a] = step
        step *= shape[a]
    return strides


def box_blocks(src_shape, src_rel, dst_shape, dst_rel, ext, itemsize):
    """Strided blocks (9 ints each) copying box `ext` between two row-major buffers."""
    ss, ds = row_major_strides(src_shape), row_major_strides(dst_shape)
    src_off = sum(a * s for a, s in zip(src_rel, ss))
    dst_off = sum(a * s for a, s in zip(dst_rel, ds))
    merged = []  # (extent, src stride, dst stride), innermost first
    for a in range(R - 1, -1, -1):
        if ext[a] == 1:
            continue
        if merged and ss[a] == merged[-1][0] * merged[-1][1] and ds[a] == merged[-1][0] * merged[-1][2]:
            e, s, d = merged[-1]
            merged[-1] = (e * ext[a], s, d)
        else:
            merged.append((ext[a], ss[a], ds[a]))
    if merged and merged[0][1] == 1 and merged[0][2] == 1:
        run, counts = merged[0][0], merged[1:]
    else:
        run, counts = 1, merged
    counts = [(n, s * itemsize, d * itemsize) for n, s, d in counts]
    inner = counts[:2] + [(1, 0, 0)] * (2 - len(counts[:2]))
    outer = counts[2:]
    blocks = []
    for index in itertools.product(*[range(n) for n, _, _ in reversed(outer)]):
        so = src_off * itemsize + sum(i * s for i, (_, s, _) in zip(index, reversed(outer)))
        do = dst_off * itemsize + sum(i * d for i, (_, _, d) in zip(index, reversed(outer)))
        blocks.append([so, do, run * itemsize, *inner[0], *inner[1]])
    return blocks


def coalesce(blocks):
    """Merges blocks (sorted by destination) that continue one another."""
    out = []
    for b in blocks:
        if out:
            p = out[-1]
            if p[3] == 1 and b[3] == 1 and p[6] == 1 and b[6] == 1 \
                    and p[0] + p[2] == b[0] and p[1] + p[2] == b[1]:
                p[2] += b[2]
                continue
            if p[6] == 1 and b[6] == 1 and p[3] > 1 and p[2] == b[2] \
                    and (b[3] == 1 or (b[4], b[5]) == (p[4], p[5])) \
                    and b[0] == p[0] + p[3] * p[4] and b[1] == p[1] + p[3] * p[5]:
                p[3] += b[3]
                continue
        out.append(list(b))
    return out


class ReferencePlanner:
    def __init__(self, problem: Problem):
        self.pb = problem
        a = problem.arrays
        self.a = {k: v.tolist() for k, v in a.items()}
        self.process = [int(p) for p in a["owners"][:, 0]]
        self.pieces_of_src = [[] for _ in problem.src_names]
        for p, v in enumerate(self.a["piece_view"]):
            self.pieces_of_src[self.a["view_src"][v]].append(p)

    def boxes(self, layout):
        return range(self.a["box_begin"][layout], self.a["box_begin"][layout + 1])

    def replicas(self, box):
        return self.a["rep_owner"][self.a["rep_begin"][box]:self.a["rep_begin"][box + 1]]

    def transformed(self, view, box):
        perm = self.a["view_perm"][view]
        start, size = self.a["box_start"][box], self.a["box_size"][box]
        return [start[p] for p in perm], [size[p] for p in perm]

    def items(self, s, box):
        a = self.a
        out = []
        for p in self.pieces_of_src[s]:
            v, d = a["piece_view"][p], a["piece_dst"][p]
            tstart, tsize = self.transformed(v, box)
            hit = intersect(a["piece_src_start"][p], a["piece_size"][p], tstart, tsize)
            if hit is None:
                continue
            shift = [x - y for x, y in zip(a["piece_dst_start"][p], a["piece_src_start"][p])]
            dstart = [x + y for x, y in zip(hit[0], shift)]
            itemsize = a["dst_itemsize"][d]
            for e in self.boxes(a["dst_layout"][d]):
                sub = intersect(dstart, hit[1], a["box_start"][e], a["box_size"][e])
                if sub is None:
                    continue
                nbytes = int(np.prod(sub[1])) * itemsize
                for q in self.replicas(e):
                    out.append((p, e, q, sub[0], sub[1], nbytes))
        return out

    def assign(self, s, box, items):
        reps = self.replicas(box)
        if len(reps) == 1:
            return [(it, it[3], it[4], reps[0]) for it in items]
        rep_set = set(reps)
        out, streams = [], {}
        for it in items:
            q = it[2]
            if q in rep_set:
                out.append((it, it[3], it[4], q))
                continue
            h = self.process[q]
            key = h if any(self.process[r] == h for r in reps) else NET
            streams.setdefault(key, []).append(it)
        local_box = box - self.a["box_begin"][self.a["src_layout"][s]]
        for key in sorted(streams):
            candidates = reps if key == NET else [r for r in reps if self.process[r] == key]
            out.extend(self.split_stream(streams[key], candidates, rotation(s, local_box, len(candidates))))
        return out

    def split_stream(self, stream, candidates, rot):
        n, total = len(candidates), sum(it[5] for it in stream)
        out, c = [], 0
        for it in stream:
            w, start, size = it[5], it[3], it[4]
            axis = next((a for a in range(R) if size[a] > 1), None)
            if w < self.pb.split_bytes or axis is None:
                k = min(n - 1, ((2 * c + w) * n) // (2 * total))
                out.append((it, start, size, candidates[(k + rot) % n]))
            else:
                rows = size[axis]
                row = w // rows
                k = (c * n) // total
                while k < n:
                    b0, b1 = k * total // n, (k + 1) * total // n
                    if b0 >= c + w:
                        break
                    lo, hi = max(c, b0), min(c + w, b1)
                    r0, r1 = (2 * (lo - c) + row) // (2 * row), (2 * (hi - c) + row) // (2 * row)
                    if r1 > r0:
                        sub_start, sub_size = list(start), list(size)
                        sub_start[axis] += r0
                        sub_size[axis] = r1 - r0
                        out.append((it, sub_start, sub_size, candidates[(k + rot) % n]))
                    k += 1
            c += w
        return out

    def records(self, s, box):
        """(sender, receiver, dst tensor, view, block) for every part of (s, box)."""
        a = self.a
        for it, start, size, sender in self.assign(s, box, self.items(s, box)):
            p, e, q = it[0], it[1], it[2]
            v, d = a["piece_view"][p], a["piece_dst"][p]
            tstart, tsize = self.transformed(v, box)
            src_pos = [x - y + z for x, y, z in zip(start, a["piece_dst_start"][p], a["piece_src_start"][p])]
            src_rel = [x - y for x, y in zip(src_pos, tstart)]
            dst_rel = [x - y for x, y in zip(start, a["box_start"][e])]
            for block in box_blocks(tsize, src_rel, a["box_size"][e], dst_rel, size, a["view_itemsize"][v]):
                yield (sender, q, d, v, block)

    def plan(self, owner: int | None = None):
        records = []
        for s in range(len(self.pb.src_names)):
            for box in self.boxes(self.a["src_layout"][s]):
                for rec in self.records(s, box):
                    if owner is None or owner in (rec[0], rec[1]):
                        records.append(rec)
        records.sort(key=lambda r: (r[0], r[1], r[2], r[3], r[4][1], r[4][0]))
        transfers, blocks = [], []
        for key, group in itertools.groupby(records, key=lambda r: r[:4]):
            merged = coalesce([r[4] for r in group])
            begin = len(blocks)
            blocks.extend(merged)
            nbytes = sum(b[2] * b[3] * b[6] for b in merged)
            transfers.append([*key, begin, len(blocks), nbytes])
        return (np.array(transfers, dtype=np.int64).reshape(-1, 7),
                np.array(blocks, dtype=np.int64).reshape(-1, 9))
