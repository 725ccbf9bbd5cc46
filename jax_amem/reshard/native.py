"""The native planner (src/reshard/), called with the problem's arrays."""

from __future__ import annotations

import numpy as np

from .._native import core
from .problem import Problem

# The order of the arrays the native `plan` takes (see src/bindings/reshard.cc).
ARRAYS = ("owners", "layout_shape", "box_begin", "box_start", "box_size", "rep_begin", "rep_owner",
          "src_layout", "dst_layout", "dst_itemsize", "view_src", "view_perm", "view_itemsize",
          "piece_dst", "piece_view", "piece_dst_start", "piece_src_start", "piece_size")


def plan_native(problem: Problem, owner_id: int | None):
    arrays = [np.ascontiguousarray(problem.arrays[name], dtype=np.int64) for name in ARRAYS]
    transfers, blocks = core.reshard.plan(*arrays, problem.split_bytes, -1 if owner_id is None else owner_id)
    return np.asarray(transfers).reshape(-1, 7), np.asarray(blocks).reshape(-1, 9)
