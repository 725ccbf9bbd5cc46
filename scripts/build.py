"""Builds and installs the package into the running interpreter, saying how far the compile is.

`pip install .` is silent for the minutes CMake and the compiler take; this runs it verbosely,
keeps the whole output in build/build.log and prints only what a person waiting wants: the CMake
decisions (CUDA kernels or not, and why) and one line per compile step with its count
([12/40]) and the time since the start. On failure it prints the log's last lines.

    python scripts/build.py              # what `make install` runs (no build isolation: the
                                         # venv's jax, one set of XLA FFI headers)
Set JAX_AMEM_CUDA=AUTO|ON|OFF (`make CUDA=1`) to choose whether the CUDA kernels are compiled.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "build" / "build.log"
STEP = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)")        # ninja: [12/40] Building CXX object ...
WORTH_SAYING = re.compile(r"jax-amem: |CMake Error|error:|Error ")
TAIL_LINES = 60


def short(step: str) -> str:
    """'Building CXX object src/copy/CMakeFiles/amem_copy.dir/segments.cc.o' -> 'segments.cc'."""
    words = step.split()
    target = words[-1] if words else step
    name = os.path.basename(target)
    name = re.sub(r"\.o(bj)?$", "", name)
    return f"{' '.join(words[:2])} {name}" if len(words) > 2 else step


def main() -> int:
    LOG.parent.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps", str(ROOT)]
    cuda = os.environ.get("JAX_AMEM_CUDA") or "AUTO"
    print(f"building jax-amem (JAX_AMEM_CUDA={cuda}); full log: {LOG.relative_to(ROOT)}", flush=True)
    start = time.monotonic()
    tail: list[str] = []
    with open(LOG, "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   bufsize=1, cwd=ROOT)
        for line in process.stdout:
            log.write(line)
            tail = (tail + [line.rstrip("\n")])[-TAIL_LINES:]
            text = line.strip()
            step = STEP.match(text)
            elapsed = time.monotonic() - start
            if step:
                print(f"  {elapsed:5.0f} s  [{step.group(1)}/{step.group(2)}] {short(step.group(3))}", flush=True)
            elif WORTH_SAYING.search(text):
                print(f"  {elapsed:5.0f} s  {text.removeprefix('-- ')}", flush=True)
        code = process.wait()
    elapsed = time.monotonic() - start
    if code:
        print("\n".join(tail), file=sys.stderr)
        print(f"build failed after {elapsed:.0f} s (exit {code}); the whole output is in {LOG}", file=sys.stderr)
        return code
    print(f"built and installed in {elapsed:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
