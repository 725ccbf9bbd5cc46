"""The FFI targets are one table in C++ (src/ffi/targets.cc) that reaches JAX through the list
the module exports: every target with the platforms it has a handler for, named literally in
jax_amem/_ffi.py, the two lists checked against each other; the only calls of
jax.ffi.ffi_call are in the targets' Python twins (jax_amem/copy.py, affine_copy.py, transport.py)."""

import ast
from pathlib import Path


import jax
import numpy as np
import pytest

from jax_amem import _ffi
from jax_amem._native import core

EXPECTED = {
    "jax_amem_segment_copy_many": {"cpu", "CUDA"},
    "jax_amem_segment_copy_to_addresses": {"cpu", "CUDA"},
    "jax_amem_affine_copy_many": {"cpu", "CUDA"},
    "jax_amem_affine_copy_to_addresses": {"cpu", "CUDA"},
    "jax_amem_nccl_send_bucket": {"CUDA"},  # NCCL has no CPU path
    "jax_amem_nccl_recv_bucket": {"CUDA"},
}


def test_the_module_lists_every_target_with_its_platforms():
    targets = core.ffi.targets()
    assert {name: set(platforms) for name, platforms in targets.items()} == EXPECTED


def test_each_target_is_an_attribute_of_ffi_named_after_it():
    for name in EXPECTED:
        assert getattr(_ffi, name.removeprefix("jax_amem_").upper()) == name


def test_the_names_in_python_are_the_table_in_cpp():
    assert set(_ffi.NAMES) == set(core.ffi.targets())
    _ffi.check_table()
    with pytest.raises(RuntimeError, match=r"compiled core has FFI targets .*'jax_amem_old'.* rebuild the package"):
        _ffi.check_table({**core.ffi.targets(), "jax_amem_old": {}})


def test_only_the_python_twins_call_ffi_call():
    package = Path(_ffi.__file__).parent
    callers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "ffi_call":
                callers.add(path.relative_to(package).as_posix())
    assert callers == {"copy.py", "affine_copy.py", "transport.py"}


def _one_buffer_call():
    """The byte copy's one target, called raw with one source and one destination (the case
    jax_amem.copy.segment_copy is)."""
    call = jax.ffi.ffi_call(_ffi.SEGMENT_COPY_MANY, [jax.ShapeDtypeStruct((8,), np.uint8)],
                            input_output_aliases={2: 0})
    return lambda table: call(table, np.arange(8, dtype=np.uint8), np.zeros(8, np.uint8), sources=np.int64(1))[0]


def test_registered_targets_run_on_the_cpu():
    _ffi.register_targets()
    _ffi.register_targets()  # idempotent
    rows = np.array([[0, 0, 0, 4, 4, 0]], np.int64).view(np.uint32)
    out = _one_buffer_call()(rows)
    assert np.asarray(out).tolist() == [0, 0, 0, 0, 0, 1, 2, 3]


def test_a_raw_table_of_partial_rows_is_refused_on_the_cpu():
    """The handler reads host tables and checks only memory safety: whole rows, in bounds."""
    _ffi.register_targets()
    call = _one_buffer_call()
    with pytest.raises(Exception, match="not a multiple of 12"):
        call(np.zeros(11, np.uint32))
    outside = np.array([[0, 0, 0, 4, 8, 0]], np.int64).view(np.uint32)
    with pytest.raises(Exception, match="writes outside destination buffer 0 of 8 bytes"):
        call(outside)
