"""The notebooks call jax-amem's public API only.

Every code cell is parsed (ast, no kernel): each `import jax_amem...`, `from jax_amem... import`
and each attribute chain on a name bound to a jax_amem module must name something public:

* `jax_amem.<name>` for a name of `jax_amem.__all__`, `__version__`, and the modules the API keeps
  public by name: `jax_amem.copy` (the byte mover's primitives) and `jax_amem.demo` (the demo);
* `jax_amem.demo.<name>` for a name of `jax_amem.demo.__all__` or one of the demo's building
  blocks that docs/demo.md documents as modules (DEMO_MODULES): the policy, its sharding, the
  rollout model, the task, the GRPO step, the swap's rules and baselines, the memory accounting
  of `python -m jax_amem report` (memory_view), the saved figures;
* below those, any name without a leading underscore.

So `jax_amem.swapping`, `jax_amem.memory`, `jax_amem._native`, `jax_amem.demo.loop`'s `Trainer`,
`jax_amem.demo.summary` and any `_private` name fail the test.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import jax_amem
from jax_amem import demo

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
PUBLIC_MODULES = {"copy", "demo"}           # public by module (jax_amem.copy.segment_copy)
DEMO_MODULES = {"policy", "sharding", "rollout", "task", "train", "weights", "memory_view", "figures"}


def problem_of(path: list[str]) -> str | None:
    """None when the dotted name `path` (starting "jax_amem") is public, else why not."""
    name = ".".join(path)
    private = [p for p in path[1:] if p.startswith("_") and not (p.startswith("__") and p.endswith("__"))]
    if private:
        return f"{name}: private name {private[0]!r}"
    if len(path) < 2:
        return None
    top = path[1]
    if top not in set(jax_amem.__all__) | PUBLIC_MODULES | {"__version__"}:
        return f"{name}: jax_amem.{top} is not in jax_amem.__all__ (an internal module or name)"
    if top == "demo" and len(path) > 2 and path[2] not in set(demo.__all__) | DEMO_MODULES:
        return f"{name}: jax_amem.demo.{path[2]} is neither in jax_amem.demo.__all__ nor a documented demo module"
    return None


def _chain(node) -> list[str] | None:
    """`a.b.c` -> ["a", "b", "c"]; None when the chain does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id] + parts[::-1]


def problems_in(sources) -> list[str]:
    """Every non-public use of jax_amem in the code cells `sources` (one namespace, in order)."""
    bound: dict[str, list[str]] = {}   # local name -> the jax_amem path it is bound to
    found = []
    for source in sources:
        code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
        tree = ast.parse(code)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    path = alias.name.split(".")
                    if path[0] == "jax_amem":
                        found.append(problem_of(path))
                        bound[alias.asname or "jax_amem"] = path if alias.asname else ["jax_amem"]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "jax_amem":
                module = node.module.split(".")
                found.append(problem_of(module))
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    found.append(problem_of(module + [alias.name]))
                    bound[alias.asname or alias.name] = module + [alias.name]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):   # every chain, its prefixes too
                chain = _chain(node)
                if chain and chain[0] in bound:
                    found.append(problem_of(bound[chain[0]] + chain[1:]))
    return sorted({p for p in found if p})


def code_cells(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text())["cells"]
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c["cell_type"] == "code"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_calls_the_public_api_only(notebook):
    cells = code_cells(notebook)
    assert any("import jax_amem" in c for c in cells), "the notebook no longer imports jax_amem"
    assert problems_in(cells) == []


def test_there_are_notebooks():
    assert {p.stem for p in NOTEBOOKS} >= {"pause_resume", "weight_swap", "rl_loop"}


@pytest.mark.parametrize("cell", [
    "from jax_amem.swapping import forget",
    "import jax_amem.swapping",
    "import jax_amem\njax_amem.swapping.forget()",
    "import jax_amem as ja\nja.memory.staging",
    "from jax_amem import _native",
    "import jax_amem\njax_amem._core",
    "from jax_amem.demo.loop import Trainer",
    "from jax_amem.demo import loop\nloop.Trainer",
    "from jax_amem import demo\ndemo.summary.first_and_last([1.0])",
    "from jax_amem.demo import weights\nweights._apply_part",
    "from jax_amem.copy import _private_helper",
])
def test_a_non_public_use_is_caught(cell):
    assert problems_in(["import os", cell]), cell


@pytest.mark.parametrize("cell", [
    "import jax_amem\njax_amem.swap(a, b, rules=jax_amem.rules.hf_llama(2))\nprint(jax_amem.__version__)",
    "import jax_amem\nwith jax_amem.paused(keep=x):\n    pass\njax_amem.memory_report().pool.in_use_bytes",
    "from jax_amem import demo\ndemo.run(*demo.QUICK)\ndemo.summary_table(r)",
    "from jax_amem.demo import PolicyConfig, figures, weights\nfigures.load('x')\nweights.swap_rules(c)",
    "from jax_amem.copy import segment_copy",
])
def test_a_public_use_passes(cell):
    assert problems_in([cell]) == []
