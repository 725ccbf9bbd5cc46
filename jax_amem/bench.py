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


# What a run without a GPU can and cannot show, said before the tables so that a CPU figure is
# not read as a GPU one (or as a failure).
CPU_NOTE = """no GPU here ({why}): a CPU run shows that every benchmark runs end to end and what the
host-side paths cost (copy loops, planning, the swap's fixed cost on tiny tensors). It cannot show
the figures the goals are about: device memory freed by a pause, offload/reload against the
pinned PCIe copy, NCCL pause/resume, the swap against the GPU's device copy. Those benchmarks say
"skipped" or mark their goals "GPU only" here; their GPU figures are in docs/benchmarks.md.
"""


def run_all() -> int:
    import jax_amem

    status = jax_amem.gpu_status()
    if not status.usable:
        print(CPU_NOTE.format(why=status.why_not()))
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
