"""`jax_amem.memory_report()`: what this process holds on each GPU, by category.

Categories (bytes on the device):
  arrays kept / arrays dropped   the arrays named in keep= / drop= (zero while paused)
  arrays untagged                every other live jax.Array on the device
  allocator pool (idle)          memory XLA's allocator holds but no buffer uses
  NCCL                           communicator buffers tracked by jax_amem.nccl
  CUDA context                   a bare primary context, measured once in a child process
  other                          the rest: XLA's kernels, cuBLAS/cuDNN, temporaries
The process total comes from NVML (per process where it can see our PID).
"""

from __future__ import annotations

import dataclasses

import jax

from .._native import core
from . import allocator, nvml, staging
from .arrays import buffer_bytes

CATEGORIES = ("arrays kept", "arrays dropped", "arrays untagged", "allocator pool (idle)",
              "NCCL", "CUDA context", "other")


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    ordinal: int
    name: str
    total_bytes: int
    free_bytes: int            # cuMemGetInfo: free for anyone on the device
    process_bytes: int         # this process's device memory
    process_source: str        # where process_bytes came from
    categories: dict           # category -> bytes; they sum to process_bytes


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    devices: list              # DeviceMemory per local GPU; empty without GPU
    paused: bool
    allocator: str
    host_kept_bytes: int       # kept arrays held in host memory while paused
    pool: staging.PoolStats
    note: str                  # why there is no GPU section, or caveats

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        lines = [f"jax-amem memory report: paused={self.paused}, allocator={self.allocator}"]
        if not self.devices:
            lines.append(f"no GPU: {self.note}")
        else:
            mib = lambda b: f"{b / 2**20:>14.1f}"  # noqa: E731
            header = f"{'MiB':<24}" + "".join(f"{'GPU ' + str(d.ordinal):>14}" for d in self.devices)
            lines += [header, "-" * len(header)]
            for name in CATEGORIES:
                lines.append(f"{name:<24}" + "".join(mib(d.categories[name]) for d in self.devices))
            lines.append("-" * len(header))
            lines.append(f"{'process total':<24}" + "".join(mib(d.process_bytes) for d in self.devices))
            lines.append(f"{'device free':<24}" + "".join(mib(d.free_bytes) for d in self.devices))
            lines.append(f"{'device total':<24}" + "".join(mib(d.total_bytes) for d in self.devices))
            for d in self.devices:
                lines.append(f"GPU {d.ordinal}: {d.name}; process total from {d.process_source}")
            if self.note:
                lines.append(self.note)
        lines.append(f"host: {self.pool}; kept arrays on host {staging.human(self.host_kept_bytes)}")
        return "\n".join(lines)


def _gpu_devices():
    if not allocator.backends_started():
        return []  # do not start JAX just to report; nothing of JAX's is on the GPU yet
    try:
        return jax.local_devices(backend="gpu")
    except RuntimeError:
        return []


def _array_bytes_by_device(leaves, seen: set) -> dict:
    """{CUDA ordinal: bytes} of the arrays' addressable shards on GPUs, each buffer once.

    `seen` holds (ordinal, address) of buffers already counted by an earlier
    category: a shard read through `addressable_shards` becomes a live array of
    its own (`jax.live_arrays()` lists it too), and replicas of one buffer must
    not count twice.
    """
    out: dict = {}
    for x in leaves:
        if not isinstance(x, jax.Array) or x.is_deleted():
            continue
        for shard in x.addressable_shards:
            if shard.device.platform != "gpu":
                continue
            ordinal = shard.device.local_hardware_id
            key = (ordinal, shard.data.unsafe_buffer_pointer())
            if key in seen:
                continue
            seen.add(key)
            out[ordinal] = out.get(ordinal, 0) + buffer_bytes(shard.data)
    return out


def _pool_idle(device, status) -> int:
    if status.needs_trim:
        reserved, used = core.memory.device_pool_usage(device.local_hardware_id)
        return max(reserved - used, 0)
    stats = device.memory_stats() or {}
    if "pool_bytes" in stats:  # BFC: its preallocated region minus what buffers use
        return max(stats["pool_bytes"] - stats.get("bytes_in_use", 0), 0)
    return 0


def _nccl_bytes_by_device() -> dict:
    """{CUDA ordinal: bytes} of NCCL's active communicators, from jax_amem.nccl when built.

    NCCL before 2.29.7 cannot report a communicator's memory; the figure is the
    driver-measured amount its last pause freed (0 before a first pause).
    """
    try:
        from .. import nccl
    except ImportError:
        return {}
    out: dict = {}
    try:
        for comm in nccl.communicators():
            nbytes = getattr(comm, "bytes_freed", -1)
            if getattr(comm, "state", "") == "active" and isinstance(nbytes, int) and nbytes > 0:
                out[comm.device] = out.get(comm.device, 0) + nbytes
    except Exception:  # not installed, or no GPU: nothing tracked
        return {}
    return out


def memory_report(keep=None, drop=None, *, measure_context: bool = True) -> MemoryReport:
    """Measures this process's memory on each local GPU, by category. Never raises for lack of GPU.

    keep / drop: the trees you will pause (before a pause), so their bytes show under
    "arrays kept" / "arrays dropped"; while paused they are known already.
    measure_context: measure a bare CUDA context once (a child process, ~1 s, cached).
    """
    from .. import process_pause  # the pause bookkeeping (it imports this package)

    status = allocator.allocator_status()
    paused = process_pause.paused_bytes()
    common = dict(paused=process_pause.is_paused(), allocator=status.allocator,
                  host_kept_bytes=paused["kept_host"], pool=staging.pool_stats())
    driver_ok, why = core.cuda.driver_status()
    devices = _gpu_devices() if driver_ok else []
    if not devices:
        note = why if not driver_ok else (
            "JAX has not started a GPU backend in this process" if core.cuda.device_count() else
            "the CUDA driver sees no GPU")
        return MemoryReport([], note=note, **common)

    kept_leaves = jax.tree_util.tree_leaves(keep)
    dropped_leaves = jax.tree_util.tree_leaves(drop)
    tagged = {id(x) for x in kept_leaves + dropped_leaves}
    counted: set = set()
    kept = _array_bytes_by_device(kept_leaves, counted)
    dropped = _array_bytes_by_device(dropped_leaves, counted)
    untagged = _array_bytes_by_device([x for x in jax.live_arrays() if id(x) not in tagged], counted)
    nccl = _nccl_bytes_by_device()
    rows = []
    for device in devices:
        o = device.local_hardware_id
        free, total = core.cuda.mem_get_info(o)
        used, source = nvml.process_used(o)
        context = nvml.cuda_context_bytes(o) if measure_context else None
        categories = {"arrays kept": kept.get(o, 0), "arrays dropped": dropped.get(o, 0),
                      "arrays untagged": untagged.get(o, 0),
                      "allocator pool (idle)": _pool_idle(device, status),
                      "NCCL": nccl.get(o, 0), "CUDA context": 0}
        rest = used - sum(categories.values())
        categories["CUDA context"] = min(context, max(rest, 0)) if context is not None else 0
        categories["other"] = rest - categories["CUDA context"]
        rows.append(DeviceMemory(o, device.device_kind, total, free, used, source, categories))
    note = "" if measure_context else "CUDA context not measured (measure_context=False): it is in 'other'"
    return MemoryReport(rows, note=note, **common)
