"""The process's one host staging pool: pinned memory on GPU machines, plain memory elsewhere.

Pinning is slow (~2 GB/s) and copies into pinned memory are fast (~55 GB/s), so
the pool is allocated on the first pause, grown only when a pause needs more,
reused by every later pause, and given back only by `release_pinned_pool()`.
"""

from __future__ import annotations

import atexit
import dataclasses
import threading

from .._native import core

StagingPool = core.memory.StagingPool

_lock = threading.Lock()
_pool: StagingPool | None = None


@dataclasses.dataclass(frozen=True)
class PoolStats:
    pinned: bool
    reserved_bytes: int     # host memory held by the pool
    in_use_bytes: int       # holding offloaded arrays now (alignment included)
    high_water_bytes: int   # the most ever in use at once
    chunk_count: int
    chunk_allocations: int  # chunks ever allocated: flat while the pool is reused

    def __str__(self) -> str:
        kind = "pinned" if self.pinned else "host"
        return (f"{kind} staging pool: {human(self.reserved_bytes)} reserved, "
                f"{human(self.in_use_bytes)} in use, high-water {human(self.high_water_bytes)}, "
                f"{self.chunk_count} chunk(s)")


def human(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


def _wants_pinned() -> bool:
    available, _ = core.cuda.driver_status()
    return available and core.cuda.device_count() > 0


def staging_pool() -> StagingPool:
    """The shared pool, created on first use (pinned when a CUDA GPU is present)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = StagingPool(_wants_pinned())
        return _pool


def pool_stats() -> PoolStats:
    """Size and use of the staging pool (all zeros before the first pause)."""
    with _lock:
        if _pool is None:
            return PoolStats(_wants_pinned(), 0, 0, 0, 0, 0)
        return PoolStats(**_pool.stats())


def release_pinned_pool() -> PoolStats:
    """Gives the staging pool's host memory back; the next pause allocates it again.

    Raises RuntimeError while a pause holds arrays in it (resume first).
    Returns the pool's statistics after the release.
    """
    with _lock:
        if _pool is not None:
            _pool.free()
    return pool_stats()


@atexit.register
def _release_at_exit() -> None:
    # Registered after JAX's own exit handler, so it runs first: pinned memory
    # goes back while the CUDA driver is still fully alive.
    with _lock:
        if _pool is not None and _pool.stats()["in_use_bytes"] == 0:
            _pool.free()
