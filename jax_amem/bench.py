"""`python -m jax_amem bench`: every benchmark in benchmarks/, one table each.

The benchmarks are scripts in the repository's benchmarks/ folder, not part of the installed
package: this runner looks for that folder in the current directory, then beside the source
tree it was installed from (an in-tree or editable install). From an installed wheel, outside a
checkout, it finds none and says where they are.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCHMARKS = ["segment_copy", "nccl_pause", "pause_resume", "plan_scale", "swap"]
# Not here: benchmarks/swap_ipc.py and benchmarks/swap_nccl.py start other processes on the same
# GPU, which need the memory this process's JAX backend already took; run each on its own.

NOT_FOUND = """jax-amem bench: no benchmarks/ folder here. The benchmarks are scripts in the benchmarks/
folder of the jax-amem repository; an installed package does not include them. Run
`python -m jax_amem bench` (or `make bench`) from the root of a checkout, or one of them there
with `python -P benchmarks/<name>.py` ({names}). Looked in: {looked}.
Their figures on an H200 are in the repository's docs/benchmarks.md.
"""


def _roots() -> list[Path]:
    """Where a benchmarks/ folder is looked for, in order."""
    return [Path.cwd(), Path(__file__).resolve().parent.parent]


def benchmarks_folder() -> Path | None:
    """The first benchmarks/ folder holding any of BENCHMARKS, or None."""
    for root in _roots():
        folder = root / "benchmarks"
        if any((folder / f"{name}.py").is_file() for name in BENCHMARKS):
            return folder
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
    """Runs every benchmark found; 0 when all ran, 1 when some were missing from the folder,
    2 when there is no folder (an installed package outside a checkout)."""
    folder = benchmarks_folder()
    if folder is None:
        looked = ", ".join(str(root / "benchmarks") for root in _roots())
        print(NOT_FOUND.format(names=", ".join(BENCHMARKS), looked=looked), end="")
        return 2

    import jax_amem

    status = jax_amem.gpu_status()
    if not status.usable:
        print(CPU_NOTE.format(why=status.why_not()))
    missing = []
    for name in BENCHMARKS:
        path = folder / f"{name}.py"
        if not path.is_file():
            missing.append(name)
            continue
        spec = importlib.util.spec_from_file_location(f"jax_amem_bench_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.main([])
        print()
    if missing:
        print(f"benchmarks missing from {folder}: {', '.join(missing)}")
        return 1
    return 0
