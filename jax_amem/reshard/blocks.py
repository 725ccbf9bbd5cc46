"""Strided blocks: the plan's unit of copying, and their expansion into segment rows.

A block is 9 int64: (src_offset, dst_offset, run_bytes, n1, src_stride1,
dst_stride1, n0, src_stride0, dst_stride0). It copies `n0 * n1` runs of
`run_bytes`: run (i0, i1) starts at src_offset + i0*src_stride0 + i1*src_stride1
in the source buffer and dst_offset + i0*dst_stride0 + i1*dst_stride1 in the
destination. Unused counts are 1 with strides 0. Offsets and strides are bytes.
"""

from __future__ import annotations

import numpy as np

from ..errors import PlanError

SRC, DST, RUN, N1, SS1, DS1, N0, SS0, DS0 = range(9)


def block_bytes(blocks: np.ndarray) -> np.ndarray:
    return blocks[:, RUN] * blocks[:, N1] * blocks[:, N0]


def expand(blocks: np.ndarray) -> np.ndarray:
    """The (n, 3) rows (src_offset, dst_offset, bytes) of `jax_amem.copy.segment_copy`."""
    try:
        blocks = np.asarray(blocks, dtype=np.int64).reshape(-1, 9)
    except (TypeError, ValueError, OverflowError) as error:
        raise PlanError(f"expand: blocks must be a plan's (n, 9) int64 block table (Plan.blocks), got "
                        f"{type(blocks).__name__} ({error})") from None
    count = blocks[:, N1] * blocks[:, N0]
    which = np.repeat(np.arange(len(blocks)), count)
    within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    b = blocks[which]
    i0, i1 = within // b[:, N1], within % b[:, N1]
    src = b[:, SRC] + i1 * b[:, SS1] + i0 * b[:, SS0]
    dst = b[:, DST] + i1 * b[:, DS1] + i0 * b[:, DS0]
    return np.stack([src, dst, b[:, RUN]], axis=1)


def block_box(block, shape, itemsize: int):
    """The box (start, size) of a row-major buffer of `shape` that `block` writes,
    or None when its runs do not form a box there."""
    b = [int(x) for x in block]
    if any(v % itemsize for v in (b[DST], b[RUN], b[DS1], b[DS0])):
        return None
    strides = [int(np.prod(shape[a + 1:], dtype=np.int64)) for a in range(len(shape))]
    start = [int(x) for x in np.unravel_index(b[DST] // itemsize, shape)] if shape else []
    size = [1] * len(shape)
    axis = len(shape) - 1
    for length, stride in ((b[RUN] // itemsize, 1), (b[N1], b[DS1] // itemsize), (b[N0], b[DS0] // itemsize)):
        if length == 1:
            continue
        while axis >= 0 and strides[axis] < stride:
            axis -= 1  # axes below this level's stride keep extent 1 (or were filled by the level below)
        if axis < 0 or strides[axis] != stride:
            return None
        while length > 1:  # spread the count over this axis and, when it fills it, the ones above
            if axis < 0:
                return None
            room = shape[axis] - start[axis]
            if length <= room:
                size[axis], length = length, 1
            elif start[axis] == 0 and length % shape[axis] == 0:
                size[axis], length = shape[axis], length // shape[axis]
            else:
                return None
            axis -= 1
    return start, size
