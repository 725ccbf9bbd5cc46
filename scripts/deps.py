"""Prints the project's requirements from pyproject.toml, one per line.

`python scripts/deps.py build runtime test` -> the build-system requirements, the package's
dependencies and the `test` extra. `--without torch,foo` leaves those distributions out (where no
build of them exists, e.g. torch on CI's Python 3.12). The Makefile installs these before building
without isolation, so the lists live in one place (pyproject.toml).
"""

import argparse
import re
import tomllib
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("groups", nargs="*", default=["build", "runtime"],
                    help="build, runtime, or the name of an extra")
parser.add_argument("--without", default="", help="comma- or space-separated distributions to leave out")
args = parser.parse_args()

project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
extras = project["project"]["optional-dependencies"]
left_out = {name.lower() for name in re.split(r"[,\s]+", args.without) if name}


def name_of(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()


for group in args.groups:
    if group == "build":
        lines = project["build-system"]["requires"]
    elif group == "runtime":
        lines = project["project"]["dependencies"]
    elif group in extras:
        lines = extras[group]
    else:
        raise SystemExit(f"deps.py: no group {group!r}: use build, runtime or one of the extras "
                         f"({', '.join(sorted(extras))})")
    print("\n".join(line for line in lines if name_of(line) not in left_out))
