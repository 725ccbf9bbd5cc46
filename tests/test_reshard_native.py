"""The native planner takes the problem's arrays by name, and the layout modules import one way."""

import ast
from pathlib import Path

import numpy as np
import pytest

import jax_amem
from jax_amem._native import core
from jax_amem.reshard import Layout
from jax_amem.reshard.planning import Planner

OWNERS = [(0, 0), (0, 1)]


def test_the_native_plan_reads_fields_by_name_and_names_a_missing_or_bad_one():
    src = {"w": Layout.tensor_parallel((4, 8), np.float32, 1, 2, OWNERS)}
    dst = {"w": Layout.replicated((4, 8), np.float32, OWNERS)}
    planner = Planner(src, dst)
    native, reference = planner.plan(planner="native", cache=False), planner.plan(planner="reference", cache=False)
    assert np.array_equal(native.transfers, reference.transfers) and len(native.transfers) > 0
    problem = planner.problem
    fields = {name: np.ascontiguousarray(a, np.int64) for name, a in problem.arrays.items()}
    reordered = dict(reversed(list(fields.items())))  # order means nothing
    first = core.reshard.plan(fields, problem.split_bytes, -1)
    again = core.reshard.plan(reordered, problem.split_bytes, -1)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    del fields["rep_owner"]
    with pytest.raises(KeyError, match="no field rep_owner"):
        core.reshard.plan(fields, problem.split_bytes, -1)
    fields["rep_owner"] = np.asarray(problem.arrays["rep_owner"], np.float64)
    with pytest.raises(TypeError, match="field rep_owner must be a C-contiguous int64"):
        core.reshard.plan(fields, problem.split_bytes, -1)


def test_layout_imports_nothing_from_from_jax():
    folder = Path(jax_amem.reshard.__file__).parent
    tree = ast.parse((folder / "layout.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(m and m.endswith("from_jax") for m in imported), imported
