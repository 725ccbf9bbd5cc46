"""Views with constant steps (a plan's `affines`, reshard/affine.py) on the swap's senders.

XLA makes only what it made before: a view with steps is its shard transposed (no temporary
at all when not transposed), in the source's own dtype; the copy kernel's affine rows
(jax_amem.affine_copy) read it, run the steps and write the destination's dtype, in the same
custom call position as the byte rows they replace. No arithmetic runs in XLA, so nothing
depends on how XLA fuses (a multiply-add) or how precisely it computes bfloat16.

A call's rows (source slot, destination slot, src_offset, dst_offset, bytes) are split by
their source slot: rows of plain views stay byte rows, rows of views with steps become
affine rows with one program per slot. Both calls take the same source operands.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..affine_copy import Program, Table, encode, from_byte_rows


def has_steps(plan, view: int) -> bool:
    return plan.affine(view) is not None


def prepared_dtype(plan, view: int) -> str:
    """The dtype XLA prepares view `view` in: the source's for a view with steps (the kernel
    converts), the plan's otherwise."""
    name, _, dtype = plan.views[view]
    return plan.src_layouts[name].dtype.name if has_steps(plan, view) else dtype


def prepared_views(plan) -> list:
    """The plan's views as the senders prepare them: (name, perm, dtype to prepare)."""
    return [(name, perm, prepared_dtype(plan, v)) for v, (name, perm, _) in enumerate(plan.views)]


@dataclass(frozen=True)
class Split:
    byte_rows: np.ndarray      # (n, 5 or 6) rows of plain views
    affine_rows: np.ndarray    # (m, 6) affine rows (unsplit)
    table: Table | None        # their programs; None when there are none


def split_rows(plan, slots, rows: np.ndarray) -> Split:
    """`rows` of one call whose source slot k is (view id, owner of its shard) = `slots[k]`."""
    rows = np.asarray(rows, np.int64)
    marked = [has_steps(plan, view) for view, _ in slots]
    if not any(marked) or len(rows) == 0:
        return Split(rows, np.zeros((0, 6), np.int64), None)
    programs, program_of, view_itemsize = [], {}, {}
    for k, (view, owner) in enumerate(slots):
        if not marked[k]:
            continue
        name, perm, dtype = plan.views[view]
        layout = plan.src_layouts[name]
        start, _ = layout.shard_box(owner)
        program_of[k] = len(programs)
        view_itemsize[k] = np.dtype(dtype).itemsize
        programs.append(Program(plan.affine(view), layout.dtype.name, dtype, tuple(plan.view_shard_shape(view, owner)),
                                tuple(perm), tuple(start)))
    steps = np.array(marked, bool)[rows[:, 0]]
    affine = from_byte_rows(rows[steps], view_itemsize, program_of)
    return Split(rows[~steps], affine, encode(programs))
