"""Whole-process pause: memory given back, pause/resume time, offload/reload bandwidth against a
pinned host<->device copy of the same bytes, and the training step under cuda_async vs XLA's
default allocator, all measured in the same run.

    python -P benchmarks/pause_resume.py [--gib 8] [--arrays 64] [--cycles 3] [--no-step-time]

Ceilings: one driver copy of a single buffer of the same total size between the device and the
(already pinned) staging pool, same run. Baseline: jax.device_put to the pinned_host memory kind
(pins on every call). The step time runs in two child processes, one per allocator, since XLA
reads the allocator choice once per process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import jax_amem  # noqa: F401  (first: chooses the cuda_async allocator before JAX starts)
import jax
import jax.numpy as jnp

from jax_amem._native import core
from jax_amem.memory import arrays as array_io, nvml, staging

GOAL_FREED = 0.99
GOAL_BANDWIDTH = 0.85


def make_state(total_bytes: int, count: int) -> dict:
    words = max(total_bytes // count // 4, 1)
    device = jax.devices()[0]
    return {f"w{i:03d}": jax.device_put(jnp.full((words,), i, jnp.float32), device)
            for i in range(count)}


def best(seconds: list[float]) -> float:
    return min(seconds)


def pinned_ceiling(total_bytes: int, repeats: int) -> tuple[float, float]:
    """(D2H, H2D) GB/s of one driver copy of one buffer of total_bytes through the pool."""
    x = jax.block_until_ready(jnp.zeros((total_bytes // 4,), jnp.float32))
    pool = staging.staging_pool()
    (address,) = pool.place([x.nbytes])
    row = np.array([[array_io.device_ordinal(x.devices().pop()), x.unsafe_buffer_pointer(),
                     address, x.nbytes]], np.int64)
    try:
        timings = {"down": [], "up": []}
        for _ in range(repeats + 1):  # the first of each is a warm-up
            start = time.perf_counter()
            core.memory.copy_to_host(row)
            timings["down"].append(time.perf_counter() - start)
            start = time.perf_counter()
            core.memory.copy_to_device(row)
            timings["up"].append(time.perf_counter() - start)
    finally:
        pool.release_all()
    return (x.nbytes / best(timings["down"][1:]) / 1e9, x.nbytes / best(timings["up"][1:]) / 1e9)


def jax_pinned_host_baseline(total_bytes: int) -> float:
    """GB/s of JAX's own device_put to pinned_host (a fresh pinned buffer every call)."""
    x = jax.block_until_ready(jnp.ones((total_bytes // 4,), jnp.float32))
    target = jax.sharding.SingleDeviceSharding(x.devices().pop(), memory_kind="pinned_host")
    start = time.perf_counter()
    jax.block_until_ready(jax.device_put(x, target))
    return x.nbytes / (time.perf_counter() - start) / 1e9


def process_bytes() -> int | None:
    if not jax.devices()[0].platform == "gpu":
        return None
    return nvml.process_used(jax.devices()[0].local_hardware_id)[0]


def cycles(total_bytes: int, count: int, n: int) -> list[dict]:
    state = make_state(total_bytes, count)
    rows = []
    for _ in range(n + 1):  # cycle 0 pins the pool and compiles the allocation program
        jax.block_until_ready(state)
        held_before = process_bytes()
        info = jax_amem.pause(keep=state)
        held_after = process_bytes()
        restored = jax_amem.resume()
        state = restored.keep
        rows.append({"info": info, "restored": restored, "held_before": held_before,
                     "held_after": held_after})
    return rows[1:]


# ------------------------------------------------------------- step time, per allocator

def step_time_child(steps: int) -> None:
    """Runs in a child process: median step time of an MLP trained with Adam."""
    gpu = jax.devices()[0].platform == "gpu"
    width, depth, batch = (4096, 6, 1024) if gpu else (256, 2, 64)
    keys = jax.random.split(jax.random.key(0), depth + 1)
    params = [jax.random.normal(k, (width, width)) / width**0.5 for k in keys[:depth]]
    x = jax.random.normal(keys[-1], (batch, width))
    y = jnp.sin(x)

    def loss(ps):
        h = x
        for w in ps:
            h = jax.nn.gelu(h @ w)
        return jnp.mean((h - y) ** 2)

    @jax.jit
    def step(ps, m, v, t):
        g = jax.grad(loss)(ps)
        m = [0.9 * a + 0.1 * b for a, b in zip(m, g)]
        v = [0.999 * a + 0.001 * b * b for a, b in zip(v, g)]
        ps = [p - 1e-3 * (a / (1 - 0.9**t)) / (jnp.sqrt(b / (1 - 0.999**t)) + 1e-8)
              for p, a, b in zip(ps, m, v)]
        return ps, m, v

    m = [jnp.zeros_like(p) for p in params]
    v = [jnp.zeros_like(p) for p in params]
    times = []
    for t in range(1, steps + 6):
        start = time.perf_counter()
        params, m, v = jax.block_until_ready(step(params, m, v, t))
        if t > 5:
            times.append(time.perf_counter() - start)
    print(json.dumps({"step_ms": statistics.median(times) * 1e3}))


def step_time(allocator: str, steps: int) -> float | None:
    env = dict(os.environ, XLA_PYTHON_CLIENT_ALLOCATOR=allocator, JAX_AMEM_CONFIGURE_ALLOCATOR="0")
    out = subprocess.run([sys.executable, "-P", os.path.abspath(__file__), "--step-time-child",
                          "--steps", str(steps)], env=env, capture_output=True, text=True,
                         timeout=600)
    if out.returncode != 0:
        print(f"step-time child ({allocator}) failed:\n{out.stderr[-2000:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])["step_ms"]


# ------------------------------------------------------------- table

def row(figure, value, reference="", ratio=None, goal=""):
    ratio_text = f"{ratio:.3f}" if isinstance(ratio, float) else (ratio or "")
    return f"{figure:<44} {value:>14} {reference:>16} {ratio_text:>7} {goal:>8}"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=None, help="state size (default 8 GPU, 1/16 CPU)")
    parser.add_argument("--arrays", type=int, default=64)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-step-time", action="store_true")
    parser.add_argument("--step-time-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step_time_child:
        step_time_child(args.steps)
        return {}

    device = jax.devices()[0]
    gpu = device.platform == "gpu"
    gib = args.gib if args.gib is not None else (8.0 if gpu else 1 / 16)
    total = int(gib * 2**30)
    results = cycles(total, args.arrays, args.cycles)
    down, up = pinned_ceiling(total, repeats=3)
    jax_down = jax_pinned_host_baseline(total)
    offload = max(r["info"].offload_gb_per_s for r in results)
    reload = max(r["restored"].reload_gb_per_s for r in results)
    pause_s = best([r["info"].seconds for r in results])
    resume_s = best([r["restored"].seconds for r in results])

    print(f"pause/resume on {device.platform} ({device.device_kind}): {gib:g} GiB in "
          f"{args.arrays} arrays, best of {args.cycles} cycles after a warm-up; "
          f"allocator {jax_amem.memory.allocator_status().allocator}")
    print(row("figure", "value", "ceiling/base", "ratio", "goal"))
    summary = {"offload_ratio": offload / down, "reload_ratio": reload / up}
    if gpu:
        r = min(results, key=lambda r: r["held_after"])
        context = nvml.cuda_context_bytes(device.local_hardware_id) or 0
        freed = r["held_before"] - r["held_after"]
        freeable = r["held_before"] - context
        summary["freed_ratio"] = freed / freeable
        print(row("process device memory before pause (MiB)", f"{r['held_before'] / 2**20:.0f}"))
        print(row("process device memory while paused (MiB)", f"{r['held_after'] / 2**20:.0f}",
                  f"ctx {context / 2**20:.0f}"))
        print(row("bytes freed / (held before - CUDA context)", f"{freed / 2**20:.0f} MiB",
                  f"{freeable / 2**20:.0f} MiB", freed / freeable, f">={GOAL_FREED}"))
    else:
        print(row("bytes freed", "n/a (no GPU)"))
    print(row("pause seconds (offload+delete+trim)", f"{pause_s:.3f}"))
    print(row("resume seconds (allocate+reload)", f"{resume_s:.3f}"))
    # The bandwidth goal is a GPU goal (a copy over PCIe against the pinned copy's speed); on CPU
    # both sides are host memcpys and the ratio only shows the machinery runs.
    bandwidth_goal = f">={GOAL_BANDWIDTH}" if gpu else "GPU only"
    print(row("offload GB/s vs pinned D2H copy", f"{offload:.1f}", f"{down:.1f}", offload / down,
              bandwidth_goal))
    print(row("reload GB/s vs pinned H2D copy", f"{reload:.1f}", f"{up:.1f}", reload / up,
              bandwidth_goal))
    print(row("offload GB/s vs jax.device_put(pinned_host)", f"{offload:.1f}", f"{jax_down:.1f}",
              offload / jax_down))
    if not args.no_step_time:
        fast = step_time("cuda_async", args.steps)
        default = step_time("default", args.steps)
        if fast and default:
            summary["step_ratio"] = fast / default
            print(row("train step ms: cuda_async vs XLA default", f"{fast:.2f}", f"{default:.2f}",
                      fast / default, "~1.0"))
    return summary


if __name__ == "__main__":
    main()
