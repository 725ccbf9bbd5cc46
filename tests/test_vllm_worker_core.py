"""The worker half's core loader (jax_amem_vllm/native.py) against the package's own import:
one library, one module, in whichever order a process meets them. Needs neither vLLM nor torch."""

import subprocess
import sys

# Warnings are errors: a second load of the library makes nanobind warn that its types were
# already registered, and the package then fails on a class the second module lacks.
_WORKER_FIRST = """
import sys
import jax_amem_vllm.native as native
core = native.core()
assert "jax" not in sys.modules and "jax_amem" not in sys.modules, sorted(sys.modules)
import jax_amem
assert jax_amem._native.core is core, (jax_amem._native.core, core)
assert native.core() is core
print(core.__name__)
"""

_PACKAGE_FIRST = """
import jax_amem, jax_amem_vllm.native as native
assert native.core() is jax_amem._native.core
print(native.core().__name__)
"""


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-P", "-W", "error", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_worker_that_loads_the_core_first_shares_it_with_a_later_import_of_jax_amem():
    assert _run(_WORKER_FIRST) == "jax_amem._core"


def test_a_worker_in_a_process_that_imported_jax_amem_uses_its_core():
    assert _run(_PACKAGE_FIRST) == "jax_amem._core"
