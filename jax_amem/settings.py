"""The runtime environment variables (`JAX_AMEM_*`): each one read and checked here, in one place.

VARIABLES is the table that docs/configuration.md shows (tests/test_settings.py keeps the two the
same, and checks that every `JAX_AMEM_` name in jax_amem/ and src/ is in it). Python code reads a
variable with `value(name)`, which gives the default when it is unset and raises SettingError,
naming the variable and its allowed values, when it holds anything else. Four variables are read
by the NCCL interposer itself (src/nccl, `read_by`), which ignores a value it does not know:
`check_all()`, called by `import jax_amem`, refuses those values first.
"""

from __future__ import annotations

import dataclasses
import os
import re

from .errors import JaxAmemError


class SettingError(JaxAmemError, ValueError):
    """A JAX_AMEM_* environment variable holds a value it does not take."""


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    default: str    # as the docs show it; "" where unset means something said in `what`
    values: str     # what it takes, as an error and the docs say it
    what: str
    accepts: str    # a regular expression of the values it takes (whole, after strip)
    read_by: str = "jax_amem"  # or the C++ file of the NCCL interposer that reads it


VARIABLES = {v.name: v for v in [
    Variable("JAX_AMEM_NCCL", "1", "1 or 0",
             "0: `import jax_amem` does not put its NCCL interposer in front of libnccl (no NCCL pause)",
             r"[01]"),
    Variable("JAX_AMEM_NCCL_LIBRARY", "the nvidia-nccl package's libnccl.so.2", "a path to libnccl.so.2",
             "the real NCCL behind the interposer, where it is not JAX's own", r".+"),
    Variable("JAX_AMEM_NCCL_PRELOADED", "", "a path (set by `python -m jax_amem run`, not by hand)",
             "the interposer the launcher put in LD_PRELOAD, for `import jax_amem` to take over", r".+"),
    Variable("JAX_AMEM_NCCL_IDS", "agreement", "agreement or communicator",
             "how a recreated communicator's new unique id reaches its ranks: in the pause's agreement over "
             "the key-value store, or broadcast by rank 0 over the old communicator", r"agreement|communicator"),
    Variable("JAX_AMEM_NCCL_OVERLAP", "threads", "threads, group or serial",
             "how independent communicators are paused and resumed: a thread each, one ncclGroupStart/End "
             "(NCCL >= 2.30.3), or one after another in key order (for debugging)", r"threads|group|serial",
             "src/nccl/overlap.cc"),
    # Checked by the interposer at each pause (its error names the variable and every key), not here.
    Variable("JAX_AMEM_NCCL_COST", "measured rates", "KEY=NUMBER,... with keys suspend_s_per_gib, "
             "resume_s_per_gib, teardown_s, init_s and learn (0 or 1)",
             "`auto`'s starting cost rates (jax_amem.nccl.cost_rates); learn=0 keeps them fixed", r".*",
             "src/nccl/auto_cost.cc"),
    Variable("JAX_AMEM_NCCL_TRIM", "1", "1 or 0",
             "0: no malloc_trim after a recreate's teardown and re-initialisation (free host memory left to "
             "glibc's arenas; for comparing host memory over the cycles)", r"[01]", "src/nccl/host_memory.cc"),
    Variable("JAX_AMEM_NCCL_KEEP_SUSPENDABLE", "0", "1 or 0",
             "1: communicators are made without shared resources (splitShare=0), so that NCCL can suspend "
             "them; the same as jax_amem.nccl.keep_suspendable() right after import", r"[01]",
             "src/nccl/keep_suspendable.cc"),
    Variable("JAX_AMEM_NCCL_HOST_EXCHANGE", "0", "1 or 0",
             "1: the broadcast of a recreated communicator's new unique id (JAX_AMEM_NCCL_IDS=communicator) "
             "uses host buffers, not device buffers; only for the CPU tests, whose fake NCCL copies host "
             "memory", r"[01]",
             "src/nccl/id_exchange.cc"),
    Variable("JAX_AMEM_CONFIGURE_ALLOCATOR", "1", "1 or 0 (also true/false, yes/no, on/off)",
             "0: `import jax_amem` leaves XLA's allocator as it is (the cuda_async allocator lets a pause "
             "return the pool)", r"[01]|true|false|yes|no|on|off"),
    Variable("JAX_AMEM_PINNED_MEMORY", "registered", "registered or hostalloc",
             "how the pause's pinned staging pool gets host memory: mmap with huge pages then "
             "cuMemHostRegister, or cuMemHostAlloc", r"registered|hostalloc"),
    Variable("JAX_AMEM_STAGING_NUMA", "auto", "auto, none or a NUMA node number",
             "the NUMA node of the staging pool: auto, the node of the process's GPUs where they share one; "
             "none, the kernel's choice", r"auto|none|\d+"),
    Variable("JAX_AMEM_SWAP_DIRECT", "1", "1 or 0",
             "0: eager swaps always run through XLA's custom calls, never launched directly by address "
             "(unset: jax_amem.swapping.in_process.direct.ENABLED)", r"[01]"),
]}
# Read by CMake when the package is built, not at run time (docs/development.md).
BUILD_VARIABLES = {"JAX_AMEM_CUDA": "AUTO, ON or OFF: whether the CUDA kernels are compiled"}


def checked(name: str, raw: str) -> str:
    """`raw` as variable `name` takes it (stripped), or SettingError naming what it takes."""
    variable = VARIABLES[name]
    text = raw.strip()
    if name == "JAX_AMEM_CONFIGURE_ALLOCATOR":
        text = text.lower()
    if not re.fullmatch(variable.accepts, text, flags=re.ASCII):
        raise SettingError(f"{name}={raw!r} is not understood: give {variable.values}, or unset it "
                           f"({variable.default or 'see docs/configuration.md'}; docs/configuration.md)")
    return text


def value(name: str) -> str | None:
    """The variable's value, checked; None when it is unset or empty."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not one of jax_amem's variables (jax_amem.settings.VARIABLES)")
    raw = os.environ.get(name, "")
    return checked(name, raw) if raw.strip() else None


def flag(name: str, default: bool) -> bool:
    """A variable that is on or off (1 or 0)."""
    text = value(name)
    return default if text is None else text in ("1", "true", "yes", "on")


def check_all() -> None:
    """Refuses, naming it, a variable set to a value it does not take (`import jax_amem` calls this)."""
    for name in VARIABLES:
        value(name)
