"""The process's one host staging pool: pinned memory on GPU machines, plain memory elsewhere.

Pinning is slow (~2 GB/s on one thread) and copies into pinned memory are fast
(~55 GB/s), so the pool is allocated on the first pause (or ahead of it by
`jax_amem.reserve()`), in blocks of up to 1 GiB made on worker threads, grown
only when a pause needs more, reused by every later pause, and given back only
by `release_pinned_pool()`.

The pool is pinned only when JAX may use a GPU. On a GPU host where JAX runs on
its CPU platform (JAX_PLATFORMS=cpu) nothing retains a CUDA context, and pinned
memory made there died with the context the driver call had retained: the next
pause wrote into unmapped memory (SIGSEGV). Plain memory serves CPU
arrays as well, and the C++ pool also keeps the context retained while it holds
pinned blocks.

The pool's blocks are placed on the NUMA node of the GPUs this process's JAX drives
(src/memory/numa.h), so a GPU's copies do not cross the socket link:
JAX_AMEM_STAGING_NUMA=auto (the default: that node where the kernel names one and every
GPU of the process sits on it; else the kernel's default), none (the kernel's default), or a
node number.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading

from .. import settings
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
    method: str = "plain"   # how the memory was made: plain, registered, hostalloc
    grow_seconds: float = 0.0  # total time spent making the pool's blocks
    numa_node: int = -1     # the NUMA node its blocks are placed on (-1: the kernel's default)
    placement_failures: int = 0  # blocks the kernel would not place there

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


GPU_PLATFORMS = ("cuda", "gpu")


def jax_may_use_gpu() -> bool:
    """False when JAX is limited to other platforms (JAX_PLATFORMS=cpu) or started without a GPU."""
    import jax

    from .. import _jax_compat

    platforms = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")
    if platforms:
        return any(p.strip() in GPU_PLATFORMS for p in platforms.split(","))
    started = _jax_compat.started_backends()
    if started:
        return any(name in GPU_PLATFORMS for name in started)
    return True  # not started yet: JAX will use the GPU the driver shows


def _wants_pinned() -> bool:
    available, _ = core.cuda.driver_status()
    return available and core.cuda.device_count() > 0 and jax_may_use_gpu()


NUMA_VARIABLE = "JAX_AMEM_STAGING_NUMA"


def staging_numa_node(setting: str | None = None, gpu_ordinals=None) -> int:
    """The NUMA node for the pool's blocks (module docstring), -1 for the kernel's default.
    `setting`: JAX_AMEM_STAGING_NUMA's value (None: read it); `gpu_ordinals`: the CUDA
    ordinals of the process's GPUs (None: JAX's local GPUs)."""
    if setting is None:
        setting = settings.value(NUMA_VARIABLE) or "auto"
    else:
        setting = settings.checked(NUMA_VARIABLE, setting.lower()) if setting.strip() else "auto"
    nodes = core.memory.numa_node_count()
    if setting == "none":
        return -1
    if setting != "auto":
        if int(setting) >= nodes:
            raise settings.SettingError(f"{NUMA_VARIABLE}={setting!r}: give auto, none or a NUMA node number below "
                                        f"{nodes} (the nodes online on this host)")
        return int(setting)
    if nodes < 2:
        return -1  # one node: nothing to choose
    if gpu_ordinals is None:
        gpu_ordinals = _local_gpu_ordinals()
    found = {core.memory.numa_node_of_pci_device(core.memory.pci_bus_id(i)) for i in gpu_ordinals}
    return found.pop() if len(found) == 1 else -1  # GPUs on several nodes (or none known): no one right node


def _local_gpu_ordinals() -> list[int]:
    import jax

    try:
        return sorted({d.local_hardware_id for d in jax.local_devices(backend="gpu")})
    except RuntimeError:
        return []


def pinned_memory() -> str:
    """How the pinned pool gets host memory: JAX_AMEM_PINNED_MEMORY, registered by default."""
    return settings.value("JAX_AMEM_PINNED_MEMORY") or "registered"


def staging_pool() -> StagingPool:
    """The shared pool, created on first use (pinned when a CUDA GPU is present, placed on
    the process's GPUs' NUMA node)."""
    global _pool
    with _lock:
        if _pool is None:
            pinned = _wants_pinned()
            _pool = StagingPool(pinned, pinned_memory(), staging_numa_node() if pinned else -1)
        return _pool


def pool_stats() -> PoolStats:
    """Size and use of the staging pool (all zeros before the first pause)."""
    with _lock:
        if _pool is None:
            pinned = _wants_pinned()
            return PoolStats(pinned, 0, 0, 0, 0, 0, pinned_memory() if pinned else "plain")
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
    global _pool
    with _lock:
        if _pool is not None and _pool.stats()["in_use_bytes"] == 0:
            _pool.free()
            _pool = None   # the native object itself too, before the interpreter's teardown
