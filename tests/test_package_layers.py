"""The three top-level packages' imports point one way:

    jax_amem (JAX trainer)  ──►  jax_amem_core  ◄──  jax_amem_vllm (inside vLLM, no JAX)

`jax_amem_core` holds the compiled core and the protocol both sides speak; it imports neither
side, nor JAX. No module of `jax_amem` imports `jax_amem_vllm`, and no module of `jax_amem_vllm`
imports `jax_amem` or JAX. Read from the source with `ast` (every import, in functions too, and
every `importlib.import_module` / `__import__` of a literal name), so an import added anywhere
that climbs back fails here."""

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
JAX = {"jax", "jaxlib"}
# package -> the top-level packages none of its modules may import
FORBIDDEN = {
    "jax_amem": {"jax_amem_vllm"},
    "jax_amem_vllm": {"jax_amem"} | JAX,
    "jax_amem_core": {"jax_amem", "jax_amem_vllm", "vllm"} | JAX,
}


def imported(source: str, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, the module being `module`
    (dotted: relative imports are resolved against it)."""
    package = module.split(".")[:-1]   # a package's __init__ names itself: "jax_amem_core.__init__"
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            found.append((node.lineno, name))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) in
                   ("import_module", "__import__"))):
            found.append((node.lineno, node.args[0].value))
    return found


def crossings(package: str) -> list[str]:
    """'path:line imports name' for every import of `package`'s modules that FORBIDDEN refuses."""
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for line, name in imported(path.read_text(), module):
            if name.split(".")[0] in FORBIDDEN[package]:
                out.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_climbs_back(package):
    assert (ROOT / package / "__init__.py").exists()
    assert crossings(package) == []


def test_the_reader_sees_every_kind_of_import():
    source = ("import jax_amem_vllm.nccl\nfrom jax_amem_vllm import wire\ndef f():\n    from ..x import y\n"
              "importlib.import_module('jax_amem_vllm.staging')\n__import__('jax')\n")
    assert [name for _, name in imported(source, "jax_amem.vllm.trainer")] == [
        "jax_amem_vllm.nccl", "jax_amem_vllm", "jax_amem.x", "jax_amem_vllm.staging", "jax"]
    assert imported("from . import wire", "jax_amem_core.__init__") == [(1, "jax_amem_core")]


def test_both_sides_use_the_shared_package():
    # The arrows exist: each side reads the protocol from jax_amem_core, not from a copy of its own.
    for package in ("jax_amem", "jax_amem_vllm"):
        tops = {name.split(".")[0] for path in (ROOT / package).rglob("*.py")
                for _, name in imported(path.read_text(), ".".join(path.relative_to(ROOT).with_suffix("").parts))}
        assert "jax_amem_core" in tops, package


def test_the_shared_package_imports_without_jax_and_loads_no_core_until_asked():
    code = ("import sys, jax_amem_core, jax_amem_core.wire, jax_amem_core.nccl_schedule, jax_amem_core.staging_note, "
            "jax_amem_core.answers, jax_amem_core.registry, jax_amem_core.native\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'jax_amem', 'jax_amem_vllm', "
            "'torch') or m == 'jax_amem_core._core'))")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_compiled_core_is_installed_in_the_shared_package_alone():
    import jax_amem
    import jax_amem_core.native

    core = jax_amem_core.native.core()
    assert core.__name__ == "jax_amem_core._core" and jax_amem._core is core
    assert Path(core.__file__).parent == Path(importlib.util.find_spec("jax_amem_core").origin).parent
    stale = [f for f in os.listdir(Path(jax_amem.__file__).parent) if f.startswith("_core.")]
    assert stale == [], "jax_amem holds a compiled core of its own: the process could load two"
