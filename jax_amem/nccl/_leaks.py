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


def _version(code: int) -> str:
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


KNOWN: tuple[Leak, ...] = ()

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
        message = (f"jax_amem.nccl: NCCL {_version(version)} grows this process's host memory under "
                   f"{'/'.join(sorted(strategies & leak.strategies))}: {leak.what}. To avoid it: {cure}; "
                   "see docs/nccl.md, 'Host memory over the cycles'.")
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        said.append(message)
    return said
