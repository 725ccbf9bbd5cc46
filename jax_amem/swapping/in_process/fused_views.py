"""Views the direct launch reads through its fused transpose-and-cast copy (src/copy/transpose.h)
instead of asking XLA to make them: a view that is a batched 2-D transpose of its source, a
cast, or both (a Flax kernel (in, out) read as PyTorch's (out, in) in bf16; a stacked
(layers, in, out) kernel read layer by layer; an embedding or a norm scale cast).

Why: XLA makes such a view as a temporary and the copy reads it again, 1.65x the device bound
of the swap at best (docs/benchmarks.md); the fused copy reads each source byte once and writes
each destination byte once.

A view is covered when, after dropping axes of size 1 and merging the axes that stay next to
each other, its permutation is the identity, (1, 0), or (0, 2, 1), and its conversion is one of
the kernel's (core.copy.TRANSPOSE_KINDS: the same 2- or 4-byte type, f32 to bf16 or f16, bf16 or
f16 to f32). A transposed view with constant steps (MaxText's scaled query kernel, read
(heads * head_dim, embed)) is read here too, its rows naming the program of steps their elements
go through (`stepped`; the program is the affine kernel's, direct_affine.py builds it); a view
with steps that is not transposed is the affine kernel's own. Other permutations and other
conversions keep XLA's route (direct.eligible decides, once per program).
"""

from __future__ import annotations

import numpy as np

from ..._native import core
from . import fused_blocks

ROW_COLUMNS = 10  # (src_index, dst_index, dst_offset, first, count, batch, rows, cols, kind, program or -1)
# The dtypes a row with a program may read and write (affine DTYPE_CODES the kernel's kinds have).
STEPPED_DTYPES = ("float32", "bfloat16", "float16")
# False: programs made after it leave every transposed or cast view to XLA (their programs keep
# the XLA call), as before the fused copy existed.
ENABLED = True


def kind(source_dtype, view_dtype) -> int | None:
    """The kernel's conversion from `source_dtype` to `view_dtype`, or None where it has none."""
    source, view = np.dtype(source_dtype), np.dtype(view_dtype)
    if source == view:
        return core.copy.TRANSPOSE_KINDS.get(f"copy{source.itemsize}")
    return core.copy.TRANSPOSE_KINDS.get(f"{source.name}->{view.name}")


def geometry(shape, perm) -> tuple[int, int, int] | None:
    """(batch, rows, cols) such that the view transpose(x, perm) is x read as (batch, rows,
    cols) with its last two axes swapped (rows == 1: no transpose), or None."""
    kept = [axis for axis in range(len(shape)) if shape[axis] != 1]
    order = [axis for axis in perm if shape[axis] != 1]
    rank = {axis: k for k, axis in enumerate(kept)}
    order = [rank[axis] for axis in order]
    sizes = [shape[axis] for axis in kept]
    # Runs of the view's axes that are also next to each other in the source, in order.
    runs = []
    for axis in order:
        if runs and runs[-1][-1] + 1 == axis:
            runs[-1].append(axis)
        else:
            runs.append([axis])
    merged = [int(np.prod([sizes[a] for a in run], dtype=np.int64)) for run in sorted(runs)]
    layout = [sorted(runs).index(run) for run in runs]  # the view's runs, as positions in the source
    if layout in ([], [0]):
        return 1, 1, int(np.prod(sizes, dtype=np.int64))
    if layout == [1, 0]:
        return 1, merged[0], merged[1]
    if layout == [0, 2, 1]:
        return merged[0], merged[1], merged[2]
    return None


def covers(plan, view: int) -> bool:
    """Whether the fused copy reads plan view `view` (of a whole source, without constant steps) itself."""
    name, perm, dtype = plan.views[view]
    layout = plan.src_layouts[name]
    return (ENABLED and plan.affine(view) is None and kind(layout.dtype, dtype) is not None
            and geometry(tuple(layout.shape), tuple(perm)) is not None)


def transposed(plan, view: int) -> bool:
    """Whether view `view` is a transpose the fused copy makes (not the source's elements in order)."""
    name, perm, _ = plan.views[view]
    shape = geometry(tuple(plan.src_layouts[name].shape), tuple(perm))
    return shape is not None and shape[1] > 1 and shape[2] > 1


def stepped(plan, view: int) -> bool:
    """Whether the fused copy reads plan view `view`, a transposed one with constant steps,
    running its steps on the way: both ends are dtypes of the kernel's conversions that the
    steps compute in float32 (float64 is the affine kernel's alone)."""
    name, _, dtype = plan.views[view]
    source = np.dtype(plan.src_layouts[name].dtype).name
    return (ENABLED and plan.affine(view) is not None and source in STEPPED_DTYPES
            and np.dtype(dtype).name in STEPPED_DTYPES and kind(source, dtype) is not None
            and transposed(plan, view))


def view_aval(plan, view: int):
    """What the rows of `view` index: its elements, flat, in the view's dtype."""
    import jax

    name, _, dtype = plan.views[view]
    return jax.ShapeDtypeStruct((int(np.prod(plan.src_layouts[name].shape, dtype=np.int64)),), np.dtype(dtype))


def rows(plan, view: int, table: np.ndarray, program: int = -1) -> np.ndarray | None:
    """The kernel's rows for `table`'s rows (src operand, dst operand, src_offset, dst_offset,
    bytes, 0) that read `view`, their offsets in the view's bytes, each running `program` of
    the chunk's affine table (-1: none); None where one does not start or end on an element
    of the view."""
    name, perm, dtype = plan.views[view]
    layout = plan.src_layouts[name]
    item = np.dtype(dtype).itemsize
    if len(table) and (np.any(table[:, 2] % item) or np.any(table[:, 4] % item)):
        return None
    batch, rows_, cols = geometry(tuple(layout.shape), tuple(perm))
    out = np.zeros((len(table), ROW_COLUMNS), np.int64)
    out[:, 0], out[:, 1], out[:, 2] = table[:, 0], table[:, 1], table[:, 3]
    out[:, 3], out[:, 4] = table[:, 2] // item, table[:, 4] // item
    out[:, 5], out[:, 6], out[:, 7] = batch, rows_, cols
    out[:, 8] = kind(layout.dtype, dtype)
    out[:, 9] = program
    return fused_blocks.merged(out, item)  # a tensor-parallel column slice: whole blocks, not strided rows
