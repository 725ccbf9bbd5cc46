"""The pinned copy's speed, measured: the bound a pause (device -> host) and a resume
(host -> device) are judged against, in the same run as what they bound.

One driver copy of one buffer between the device and memory the staging pool already
holds (pinned on a GPU machine), each way, best of `repeats` after a warm-up: the copies
a pause and a resume make, without their bookkeeping. Used by benchmarks/pause_resume.py
and the real-size demo.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from .._native import core
from . import arrays as array_io


def pinned_copy_bandwidth(pool, nbytes: int, repeats: int = 3, device=None) -> tuple[float, float]:
    """(device -> host, host -> device) GB/s of one copy of an `nbytes` buffer on `device`
    (default: the first) through `pool`, whose blocks it borrows and gives back."""
    device = device if device is not None else jax.devices()[0]
    x = jax.block_until_ready(jax.device_put(jnp.zeros((max(nbytes // 4, 1),), jnp.float32), device))
    (address,) = pool.place([x.nbytes])
    row = np.array([[array_io.device_ordinal(device), x.unsafe_buffer_pointer(), address, x.nbytes]],
                   np.int64)
    timings = {"down": [], "up": []}
    try:
        for _ in range(repeats + 1):  # the first of each is a warm-up
            start = time.perf_counter()
            core.memory.copy_to_host(row)
            timings["down"].append(time.perf_counter() - start)
            start = time.perf_counter()
            core.memory.copy_to_device(row)
            timings["up"].append(time.perf_counter() - start)
    finally:
        pool.release_all()
        x.delete()
    return x.nbytes / min(timings["down"][1:]) / 1e9, x.nbytes / min(timings["up"][1:]) / 1e9
