"""`python -m jax_amem bench`: every benchmark in benchmarks/, one table each.

The benchmark scripts live in the repository's benchmarks/ folder; this
runner finds them beside the source tree it was installed from, or in the
current directory.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCHMARKS = ["segment_copy", "nccl_pause", "pause_resume", "plan_scale", "swap"]
# Not here: benchmarks/swap_ipc.py and benchmarks/swap_nccl.py start other processes on the same
# GPU, which need the memory this process's JAX backend already took; run each on its own.


def _find(name: str) -> Path | None:
    for root in (Path.cwd(), Path(__file__).resolve().parent.parent):
        path = root / "benchmarks" / f"{name}.py"
        if path.exists():
            return path
    return None


def run_all() -> int:
    missing = []
    for name in BENCHMARKS:
        path = _find(name)
        if path is None:
            missing.append(name)
            continue
        spec = importlib.util.spec_from_file_location(f"jax_amem_bench_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.main([])
        print()
    if missing:
        print(f"benchmarks not found (run from the repository root): {', '.join(missing)}")
        return 1
    return 0
