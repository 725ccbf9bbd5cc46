"""The native planner (src/reshard/), called with the problem's arrays by name."""

from __future__ import annotations

import numpy as np

from .._native import core
from .problem import Problem


def plan_native(problem: Problem, owner_id: int | None):
    fields = {name: np.ascontiguousarray(array, dtype=np.int64) for name, array in problem.arrays.items()}
    transfers, blocks = core.reshard.plan(fields, problem.split_bytes, -1 if owner_id is None else owner_id)
    return np.asarray(transfers).reshape(-1, 7), np.asarray(blocks).reshape(-1, 9)
