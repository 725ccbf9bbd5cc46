"""Prints the project's requirements from pyproject.toml, one per line.

`python scripts/deps.py build test` -> the build-system requirements and the
`test` extra. The Makefile installs these before building without isolation,
so the list lives in one place (pyproject.toml).
"""

import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
wanted = sys.argv[1:] or ["build", "runtime"]
for group in wanted:
    if group == "build":
        lines = project["build-system"]["requires"]
    elif group == "runtime":
        lines = project["project"]["dependencies"]
    else:
        lines = project["project"]["optional-dependencies"][group]
    print("\n".join(lines))
