"""Where a warm swap's time goes: cProfile of repeated swaps (each ending when the device is
idle), for a model of many small tensors and for a few large ones. A development aid, not a benchmark (benchmarks/swap.py holds the figures).

    python -P scripts/profile_swap.py [--small 2000] [--large-mib 512] [--repeats 20] [--top 30]
"""
import argparse
import cProfile
import io
import pstats
import time

import numpy as np

import jax_amem
import jax
import torch
from jax_amem.swapping import forget


def case(count, elements, repeats, top):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    src = {f"t{i}": jax.device_put(np.full(elements, i, np.float32)) for i in range(count)}
    dst = {k: torch.empty(elements, device=dev) for k in src}
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for _ in range(3):
        jax_amem.swap(src, dst, progress=False)
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        jax_amem.swap(src, dst, progress=False)
        sync()
    mean = (time.perf_counter() - start) / repeats
    start = time.perf_counter()
    for _ in range(repeats):
        for k, t in dst.items():
            t.copy_(torch.from_dlpack(src[k]))
        sync()
    per_tensor = (time.perf_counter() - start) / repeats
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(repeats):
        jax_amem.swap(src, dst, progress=False)
        sync()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(top)
    print(f"=== {count} x {elements * 4 / 2**20:.3f} MiB: swap {mean * 1e3:.2f} ms, "
          f"per-tensor copy_ {per_tensor * 1e3:.2f} ms, ratio {per_tensor / mean:.2f}x")
    print(text.getvalue())
    forget()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--small", type=int, default=2000)
    p.add_argument("--large-mib", type=float, default=512)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args()
    case(a.small, 4096, a.repeats, a.top)
    case(4, int(a.large_mib * 2**20 / 4), a.repeats, a.top)


main()
