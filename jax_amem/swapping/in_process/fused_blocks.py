"""A transposed view's column slice read as whole blocks by the fused copy (fused_views.py).

Why: a tensor-parallel rank of a row-parallel layer (vLLM's `o_proj` and `down_proj`, an MoE
expert's `w2`) holds a column slice of the transposed kernel: its (out, in / tp) is columns
[rank * in / tp, (rank + 1) * in / tp) of every row of the view (out, in) of a Flax (in, out)
kernel. The schedule gives one row per view row (out of them: 1024 rows of 1536 elements for one
Qwen3-0.6B `down_proj` at tp 2), and the kernel reads each such row as a strided column of the
source: a tile per 64 elements, each load of it a different source row. The same bytes are one
block in another reading of the same source: the rank's slice is the whole transpose of the
source rows [rank * in / tp, (rank + 1) * in / tp), which are contiguous.

So a run of rows that are the same columns [a, a + n) of consecutive view rows of one matrix,
written one after the other, with n dividing the view's row length and a a multiple of n,
becomes one row of the source read as (batch * g, n, cols), g = view row length / n: the same
bytes, each source element still read once and each destination element written once, in whole
tiles. Rows that name a program of constant steps keep their geometry (a vector step's constant
is looked up by view element number, which this reading renumbers).
"""

from __future__ import annotations

import numpy as np

# Columns of a kernel row (fused_views.ROW_COLUMNS): names for the ones read here.
SRC, DST, DST_OFFSET, FIRST, COUNT, BATCH, ROWS, COLS, KIND, PROGRAM = range(10)


def merged(rows: np.ndarray, item: int) -> np.ndarray:
    """`rows` (the kernel rows of one view, destination elements of `item` bytes) with each run
    of column-slice rows described above replaced by one row of whole blocks."""
    if len(rows) < 2:
        return rows
    view_row, matrix = rows[:, ROWS], np.maximum(rows[:, ROWS] * rows[:, COLS], 1)  # (never 0: checked again in C++)
    count, first = rows[:, COUNT], rows[:, FIRST]
    column = first % np.maximum(view_row, 1)
    slice_row = ((view_row > 1) & (rows[:, COLS] > 1) & (rows[:, PROGRAM] == -1) & (count > 0) & (count < view_row)
                 & (view_row % np.maximum(count, 1) == 0) & (column % np.maximum(count, 1) == 0))
    same = np.all(rows[1:, [SRC, DST, BATCH, ROWS, COLS, KIND, PROGRAM, COUNT]] ==
                  rows[:-1, [SRC, DST, BATCH, ROWS, COLS, KIND, PROGRAM, COUNT]], axis=1)
    # Row k + 1 continues row k: the next view row of the same matrix, its bytes right after.
    follows = (slice_row[1:] & slice_row[:-1] & same & (first[1:] == first[:-1] + view_row[:-1])
               & (first[1:] // matrix[1:] == first[:-1] // matrix[:-1])
               & (rows[1:, DST_OFFSET] == rows[:-1, DST_OFFSET] + count[:-1] * item))
    if not follows.any():
        return rows
    starts = np.flatnonzero(np.concatenate(([True], ~follows)))
    lengths = np.diff(np.append(starts, len(rows)))
    out = rows[starts].copy()
    runs = lengths > 1
    n, r, c = count[starts][runs], view_row[starts][runs], rows[starts, COLS][runs]
    f = first[starts][runs]
    g = r // n
    block = (f // (r * c)) * g + (f % r) // n  # the matrix of (batch * g, n, cols) the run is in
    out[runs, FIRST] = block * c * n + (f % (r * c)) // r * n
    out[runs, COUNT] = lengths[runs] * n
    out[runs, BATCH] = rows[starts, BATCH][runs] * g
    out[runs, ROWS] = n
    return out
