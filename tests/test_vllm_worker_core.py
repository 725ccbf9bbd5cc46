"""One compiled core per process, whichever side imports it first: the vLLM worker's half
(jax_amem_vllm, which must not import JAX) and the trainer's (jax_amem) both import
`jax_amem_core._core` by that one name. Needs neither vLLM nor torch."""

import subprocess
import sys

# Warnings are errors: a second load of the library makes nanobind warn that its types were
# already registered, and the package then fails on a class the second module lacks.
_WORKER_FIRST = """
import sys
from jax_amem_core.native import core as load
core = load()
assert "jax" not in sys.modules and "jax_amem" not in sys.modules, sorted(sys.modules)
import jax_amem
assert jax_amem._native.core is core, (jax_amem._native.core, core)
assert load() is core
print(core.__name__)
"""

_PACKAGE_FIRST = """
import jax_amem
from jax_amem_core.native import core as load
assert load() is jax_amem._native.core
print(load().__name__)
"""

# The worker half's modules reach the core through jax_amem_core alone: importing all of them
# (less the engine and the layout, which need vLLM) loads no JAX and no jax_amem.
_WORKER_MODULES = """
import sys
import jax_amem_vllm, jax_amem_vllm.nccl, jax_amem_vllm.staging, jax_amem_vllm.copies
from jax_amem_core.native import core
core()
print(sorted(m for m in sys.modules if m in ("jax", "jax_amem") or m.startswith(("jax.", "jax_amem."))))
"""


def _run(code: str, warnings: str = "error") -> str:
    out = subprocess.run([sys.executable, "-P", "-W", warnings, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_worker_that_loads_the_core_first_shares_it_with_a_later_import_of_jax_amem():
    assert _run(_WORKER_FIRST) == "jax_amem_core._core"


def test_a_worker_in_a_process_that_imported_jax_amem_uses_its_core():
    assert _run(_PACKAGE_FIRST) == "jax_amem_core._core"


def test_the_worker_half_and_its_core_load_no_jax():
    import pytest

    pytest.importorskip("torch")   # jax_amem_vllm.copies and the staging buffer are PyTorch's
    assert _run(_WORKER_MODULES, warnings="default").splitlines()[-1] == "[]"
