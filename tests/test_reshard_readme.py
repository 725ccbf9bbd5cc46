"""The README's from_function snippet runs as written."""

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")


def test_readme_from_function_snippet_runs():
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"<!-- from_function snippet[^>]*-->\n```python\n(.*?)```", text, re.S)
    assert block, "the README lost its from_function snippet"
    exec(compile(block.group(1), "README.md", "exec"), {})
