"""The two ceilings the switch is judged against, measured in the same run as the switch:
the pinned copy (a pause's and a resume's bound) and the device copy (the swap's).

Pinned: one driver copy of a buffer between the device and the staging pool's pinned memory,
each way (`jax_amem.memory.bandwidth`, best of 3). Device: one `torch.Tensor.copy_` of a
buffer, device to device on the rollout's device (median of 5); its figure is payload bytes
per second (the copy reads and writes each byte once). 1 GiB buffers on a GPU (the size of
the largest trainer arrays), 16 MiB elsewhere.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from ...memory import staging
from ...memory.bandwidth import pinned_copy_bandwidth

GPU_BUFFER = 1 << 30
CPU_BUFFER = 16 << 20


@dataclasses.dataclass(frozen=True)
class Ceilings:
    pinned_down_gb_s: float    # device -> pinned host
    pinned_up_gb_s: float      # pinned host -> device
    device_copy_gb_s: float    # device -> device, payload
    pinned_buffer: int
    device_buffer: int
    pinned: bool               # False: the staging pool is plain host memory (no GPU)


def device_copy_bandwidth(torch_device, nbytes: int, repeats: int = 5) -> float:
    import torch

    sync = (lambda: torch.cuda.synchronize(torch_device)) if torch_device.type == "cuda" else (lambda: None)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=torch_device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        sync()
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - start)
    del src, dst
    if torch_device.type == "cuda":
        torch.cuda.empty_cache()
    return nbytes / statistics.median(times[1:]) / 1e9


def measure(torch_device, on_gpu: bool) -> Ceilings:
    """Both ceilings; call it when the staging pool is reserved and no pause holds it."""
    nbytes = GPU_BUFFER if on_gpu else CPU_BUFFER
    down, up = pinned_copy_bandwidth(staging.staging_pool(), nbytes)
    return Ceilings(down, up, device_copy_bandwidth(torch_device, nbytes), nbytes, nbytes,
                    staging.pool_stats().pinned)
