"""NCCL versions whose host memory grows under a pause strategy by NCCL's own doing, said once.

A pause that ran a strategy on such a version warns once per process (RuntimeWarning), naming
the NCCL call that leaks, its issue, what was measured, and the version to install instead.
The figures behind each entry: docs/nccl.md ("Host memory over the cycles").
"""

from __future__ import annotations

import dataclasses
import warnings


@dataclasses.dataclass(frozen=True)
class Leak:
    since: int          # first NCCL version that leaks (ncclGetVersion: 22809 = 2.28.9)
    fixed: int | None   # first version measured without it (None: none yet)
    strategies: frozenset
    what: str           # the NCCL call that leaks, its issue, and what was measured
    avoid: str = ""     # what else avoids it (an environment, a strategy), said after the version


def _version(code: int) -> str:
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


KNOWN: tuple[Leak, ...] = (
    # Measured on an H100, four communicators at NCCL's default buffers, each method in processes
    # of its own (scripts/gpu_test.sh nccl_rss): NCCL's destroy and grouped init without jax-amem
    # (naive_group) grows as recreate does, the rebuild one communicator at a time stays flat,
    # and glibc held to two arenas cuts recreate's growth from 508 to 36 MiB.
    Leak(since=22809, fixed=None, strategies=frozenset({"recreate"}),
         what=("NCCL's grouped initialisation (ncclGroupStart, ncclCommInitRank per communicator, "
               "ncclGroupEnd), which recreate runs at every resume, starts threads whose glibc malloc "
               "arenas stay: about 500 MiB over the first 40 cycles with 2.28.9 and 80-120 MiB with "
               "2.30.7 and 2.32.6 (NCCL's own grouped rebuild grows the same without jax-amem), then "
               "about 1 MiB per 100 cycles"),
         avoid=("start the process with MALLOC_ARENA_MAX=2 (2.28.9's growth: 36 MiB), or install "
                "NCCL >= 2.29.7, where auto suspends at NCCL's default buffers without growing")),
)

_warned: set = set()


def warn_once(version: int, strategies: set) -> list[str]:
    """Warns (once per process and leak) when `version` leaks under any of the `strategies` that
    a pause just ran; returns the messages warned now."""
    said = []
    for leak in KNOWN:
        if leak in _warned or not (strategies & leak.strategies):
            continue
        if version < leak.since or (leak.fixed is not None and version >= leak.fixed):
            continue
        _warned.add(leak)
        cure = (f'install NCCL >= {_version(leak.fixed)} (pip install -U "nvidia-nccl-cu13>={_version(leak.fixed)}") '
                "and point jax-amem at it (JAX_AMEM_NCCL_LIBRARY) if JAX's plugin pins another"
                if leak.fixed else "no NCCL release measured so far is free of it")
        if leak.avoid:
            cure += f"; {leak.avoid}"
        message = (f"jax_amem.nccl: NCCL {_version(version)} grows this process's host memory under "
                   f"{'/'.join(sorted(strategies & leak.strategies))}: {leak.what}. To avoid it: {cure}; "
                   "see docs/nccl.md, 'Host memory over the cycles'.")
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        said.append(message)
    return said
