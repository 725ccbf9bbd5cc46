"""The house rules of jax_amem/swapping/ (docs/architecture.md), read from the source:
in_process/ and cross_host/ never import each other, `jax_amem.swap` is only the verb, and
every dotted path the library's strings (error messages, docstrings) name can be reached."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

import jax_amem

PACKAGE = Path(jax_amem.__file__).resolve().parent
REPO = PACKAGE.parent
SWAPPING = PACKAGE / "swapping"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module `source` (the text of module `module`) imports, relative imports resolved
    (`from . import x` counts as importing both the package and `package.x`)."""
    package = module if is_package else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package.split(".")
            anchor = anchor[:len(anchor) - (node.level - 1)] if node.level else []
            base = ".".join(anchor + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def imports_of(path: Path) -> set[str]:
    return imported_modules(path.read_text(), module_name(path), path.name == "__init__.py")


def test_the_import_reader_resolves_relative_imports():
    """The oracle of the test below: a line of in_process/ importing cross_host, written three
    ways, is caught each way (a reader that missed relative imports would pass anything)."""
    here = "jax_amem.swapping.in_process.run"
    for line in ("from ..cross_host import link", "from .. import cross_host",
                 "import jax_amem.swapping.cross_host.send", "from ...swapping.cross_host.send import send"):
        assert any(m.startswith("jax_amem.swapping.cross_host") for m in imported_modules(line, here)), line
    assert imported_modules("from . import executor", here) == {"jax_amem.swapping.in_process",
                                                                "jax_amem.swapping.in_process.executor"}
    assert "jax_amem.swapping.errors" in imported_modules("from .errors import SwapError", "jax_amem.swapping",
                                                          is_package=True)


@pytest.mark.parametrize("floor, forbidden", [("in_process", "cross_host"), ("cross_host", "in_process")])
def test_in_process_and_cross_host_never_import_each_other(floor, forbidden):
    files = sorted((SWAPPING / floor).glob("*.py"))
    assert len(files) >= 5, files
    banned = f"jax_amem.swapping.{forbidden}"
    for path in files:
        crossing = sorted(m for m in imports_of(path) if m == banned or m.startswith(banned + "."))
        assert not crossing, f"{path.relative_to(REPO)} imports {crossing}"


def test_jax_amem_swap_is_only_the_verb():
    assert inspect.isfunction(jax_amem.swap) and jax_amem.swap is jax_amem.swapping.swap
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("jax_amem.swap")
    assert not (PACKAGE / "swap").exists()


DOTTED = re.compile(r"\bjax_amem(?:\.[A-Za-z_]\w*)+")


def strings_of(path: Path):
    """Every string constant of a source file (f-strings' literal parts included)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def reachable(dotted: str) -> bool:
    """Whether `a.b.c` is a module, or an attribute of the longest module prefix of it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_reachable_tells_real_paths_from_gone_ones():
    assert reachable("jax_amem.swapping.verify") and reachable("jax_amem.nccl.pause")
    assert not reachable("jax_amem.swap.verify") and not reachable("jax_amem.swap.batched.DEFAULT")


def test_every_path_the_library_names_is_reachable():
    named = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for text in strings_of(path):
            for dotted in DOTTED.findall(text):
                named.setdefault(dotted.rstrip("."), path.relative_to(REPO))
    assert "jax_amem.swapping.cross_host.destination_layouts" in named  # the scan sees error messages
    gone = {d: str(p) for d, p in named.items() if not reachable(d)}
    assert gone == {}


@pytest.mark.parametrize("pattern", ["docs/*.md", "README.md", "notebooks/*.ipynb"])
def test_every_path_the_docs_and_notebooks_name_is_reachable(pattern):
    gone = sorted({f"{path.relative_to(REPO)}: {dotted}" for path in REPO.glob(pattern)
                   for dotted in DOTTED.findall(path.read_text()) if not reachable(dotted.rstrip("."))})
    assert gone == []


def test_no_text_names_the_old_swap_package():
    old = re.compile(r"jax_amem\.swap\.[A-Za-z_]|jax_amem/swap/[a-z_]+\.py|from jax_amem\.swap import")
    hits = []
    for pattern in ("jax_amem/**/*.py", "tests/**/*.py", "benchmarks/*.py", "scripts/*.py", "docs/*.md",
                    "notebooks/*.ipynb", "README.md"):
        for path in REPO.glob(pattern):
            if path.name == Path(__file__).name:
                continue
            hits += [f"{path.relative_to(REPO)}: {m}" for m in old.findall(path.read_text())]
    assert hits == []
