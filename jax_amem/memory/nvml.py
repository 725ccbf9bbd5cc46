"""This process's device memory as NVML sees it, with cuMemGetInfo as the fallback.

NVML (nvidia-ml-py) can say how much one process holds on a GPU; inside some
containers it cannot see our PID, and then the device's used memory (all
processes) is the best measure left. Each figure says where it came from.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

from .._native import core

PER_PROCESS = "nvml per-process"
DEVICE_WIDE = "nvml device-wide (all processes)"
DRIVER_WIDE = "cuMemGetInfo device-wide (all processes)"


def _nvml():
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def _handle(nvml, ordinal: int):
    return nvml.nvmlDeviceGetHandleByPciBusId(core.memory.pci_bus_id(ordinal))


def process_used(ordinal: int) -> tuple[int, str]:
    """(bytes this process holds on the GPU, source of the figure)."""
    nvml = _nvml()
    if nvml is not None:
        try:
            handle = _handle(nvml, ordinal)
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory), PER_PROCESS
            return int(nvml.nvmlDeviceGetMemoryInfo(handle).used), DEVICE_WIDE
        except Exception:
            pass
    free, total = core.cuda.mem_get_info(ordinal)
    return total - free, DRIVER_WIDE


# The child must hold its context while NVML looks: a scoped retain/release (as
# core.cuda.mem_get_info does) would destroy it again before the reading.
_CONTEXT_PROBE = r"""
import ctypes, sys, pynvml
cuda = ctypes.CDLL("libcuda.so.1")
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByPciBusId(sys.argv[2])
before = pynvml.nvmlDeviceGetMemoryInfo(handle).used
device, context = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), int(sys.argv[1])) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0
print(pynvml.nvmlDeviceGetMemoryInfo(handle).used - before)
"""


@functools.lru_cache(maxsize=None)
def cuda_context_bytes(ordinal: int) -> int | None:
    """Device memory a bare CUDA primary context takes on this GPU, or None if unmeasurable.

    Measured once, in a child process (ours already has its context): NVML's
    used memory before and after the child creates one. XLA's kernels and
    libraries loaded later are not part of it (they count as "other").
    """
    if _nvml() is None:
        return None
    try:
        out = subprocess.run(
            [sys.executable, "-c", _CONTEXT_PROBE, str(ordinal), core.memory.pci_bus_id(ordinal)],
            capture_output=True, text=True, timeout=60, check=True)
        return max(int(out.stdout.strip().splitlines()[-1]), 0)
    except Exception:
        return None
