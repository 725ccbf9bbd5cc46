"""Views with constant steps (a plan's `affines`: a query scale, a norm offset, an embedding
normaliser) that the direct launch (direct.py) runs itself: their rows become the affine
kernel's rows (src/copy/affine.h) in the chunk's launch sequence, beside its byte rows.

Nothing of the custom call's route is copied: the rows are the ones the XLA route splits
(swapping/affine_views.split_rows: one program per view and source, vector constants sliced
to it), checked by the function the custom call's caller runs
(jax_amem.affine_copy.address_affine_rows: dtypes, bounds, overlaps, alignment, allocation
extents), checked again when the DirectCopy is made, and run by the same kernel (CUDA) or
loop (CPU, under XLA:CPU's floating-point mode: src/copy/flush_denormals.h).

A view is read here when the affine kernel can read it straight from its whole source: its
permutation moves only axes of size 1 (the view's elements are the source's, in order) and
both ends are dtypes the kernel has (float32, bfloat16, float16, float64). A transposed view
with steps (MaxText's scaled query kernel) is the fused transpose copy's (fused_views.stepped):
its rows are transpose rows naming the program built here, in the same table, so its steps
run with the same arithmetic; the view's element numbers are the ones the XLA route's affine
rows count in the view XLA makes, so vector constants are looked up alike. What neither
reads (other permutations, a transposed float64 or bfloat16 <-> float16 view) keeps the XLA
route.
"""

from __future__ import annotations

import numpy as np

from ...affine_copy import DTYPE_CODES, address_affine_rows
from ..affine_views import split_rows
from . import fused_views

# False: programs made after it leave every view with constant steps to XLA's custom calls
# (as before the direct launch ran them; benchmarks/swap_scale.py measures both).
ENABLED = True

_NONE = (np.zeros((0, 6), np.int64), np.zeros(0, np.int64), 0, {})


def covers(plan, view: int) -> bool:
    """Whether the direct launch runs plan view `view` (one with constant steps) itself."""
    name, perm, dtype = plan.views[view]
    layout = plan.src_layouts[name]
    if not ENABLED or plan.affine(view) is None:
        return False
    if np.dtype(layout.dtype).name not in DTYPE_CODES or np.dtype(dtype).name not in DTYPE_CODES:
        return False
    if fused_views.stepped(plan, view):
        return True  # transposed: the fused copy runs the steps
    geometry = fused_views.geometry(tuple(layout.shape), tuple(perm))
    return geometry is not None and geometry[:2] == (1, 1)  # the source's elements, in order


def whole_elements(plan, view: int, segments) -> bool:
    """Whether every (src_offset, dst_offset, bytes) segment of `view` holds whole elements of
    its dtype (what an affine row counts in)."""
    item = np.dtype(plan.views[view][2]).itemsize
    return not (np.asarray(segments, np.int64) % item).any()


def rows(plan, slots, chunk_rows, sources, addresses, sizes, dst_dtypes, platform: str) -> tuple:
    """(affine rows split into pieces, their table as int64 words, its number of programs,
    {source slot: program} of the transposed views the fused copy runs the steps of) of one
    chunk: `slots[k]` is (view, owner of its source) of the chunk's source slot k, `sources[k]`
    that source's aval, `chunk_rows` the chunk's byte rows (src slot, dst slot, src_offset,
    dst_offset, bytes, 0); `dst_dtypes` per destination. The table holds every slot's program;
    the rows of transposed slots are left to the fused copy (checked there as rows of the
    view's elements). ValueError naming the row or destination the checks refuse."""
    split = split_rows(plan, slots, chunk_rows)
    if split.table is None:
        return _NONE
    affine = split.affine_rows
    fused = np.array([fused_views.stepped(plan, view) for view, _ in slots], bool)[affine[:, 0]]
    programs = {int(k): int(p) for k, p in np.unique(affine[fused][:, [0, 5]], axis=0).tolist()}
    pieces = _NONE[0]
    if (~fused).any():
        _, _, pieces = address_affine_rows(sources, addresses, sizes, affine[~fused], split.table, dst_dtypes,
                                           platform)
    return pieces, split.table.words.view(np.int64), split.table.programs, programs
