"""Host cost of a repeat swap into PyTorch tensors: the microseconds a swap spends besides its
copy, per swap and per tensor, with tensors so small that the copy itself is negligible.

    python -P benchmarks/swap_host.py [--counts 2000 64] [--bytes 16] [--repeats 200]
                                      [--facts layout methods] [--profile] [--json PATH]

Per count (a tree of COUNT float32 tensors of --bytes each, the shapes of the 2000 x 16 KiB
and 64 x 4 MiB cases of benchmarks/swap.py with tiny bytes), medians in microseconds of:
- the whole repeat swap (`jax_amem.swap`, the same arrays, until the device is idle), and the
  same with new arrays each time (a jitted step's outputs, as a training loop makes them; only
  the swap is timed);
- its pieces, each timed alone, with perf_counter: the native check (`repeat.find`: the tree
  walked, every leaf's and tensor's facts compared, new arrays awaited and their addresses
  read), `written` (the counters the next check expects) and the launch (the direct launch
  with the addresses the check read, and its wait), of which `before_launch` (PyTorch's current
  stream read) and `while_launched` (version counters bumped, while the copies run) are also
  timed alone; "rest" is the whole swap less the
  check, `written` and the launch (the front door, `describe`, the report);
- per tensor: the whole swap / COUNT.
Each count is measured with the destination's facts read both ways (--facts): "layout", each
tensor's layout in one C call through PyTorch's DLPack C exchange table, and "methods", the
address, storage offset, storage size and version counter through PyTorch's Python methods (as
on a PyTorch without that table); the last line is the whole swap's ratio, methods / layout.
It runs on any device JAX and PyTorch share (on the CPU the direct launch runs its rows in the
CPU loop); the copy of the same bytes (one torch copy_) is printed beside as the ceiling's
measure. --profile adds cProfile's top functions (by own time) over the timed swaps.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import jax_amem  # noqa: F401  (before JAX starts)
import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from swap import median_seconds  # noqa: E402  (benchmarks/swap.py: the same timing)


def median_us(fn, repeats: int, sync=lambda: None) -> float:
    return median_seconds(fn, repeats, sync) * 1e6


def new_arrays_us(src, repeats: int, sync, timed) -> float:
    """Median of `timed(src)` with new arrays each time (awaited before the clock starts)."""
    step = jax.jit(lambda tree: jax.tree_util.tree_map(lambda x: x + 1, tree))
    times = []
    for _ in range(repeats):
        src = jax.block_until_ready(step(src))
        sync()
        start = time.perf_counter()
        timed(src)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure(count: int, nbytes: int, repeats: int, profile: bool, facts: str) -> dict:
    from jax_amem.swapping import destinations

    if facts == "layout":
        if destinations.torch_layout_reader() is None:
            raise SystemExit("--facts layout: this PyTorch has no DLPack C exchange table")
        return measure_facts(count, nbytes, repeats, profile, facts)
    reader = destinations.torch_layout_reader
    destinations.torch_layout_reader = lambda: None  # the facts through PyTorch's methods
    try:
        return measure_facts(count, nbytes, repeats, profile, facts)
    finally:
        destinations.torch_layout_reader = reader


def measure_facts(count: int, nbytes: int, repeats: int, profile: bool, facts: str) -> dict:
    import torch
    from jax_amem.swapping.destinations import describe
    from jax_amem.swapping.in_process import repeat, run

    device = jax.devices()[0]
    gpu = device.platform == "gpu"
    torch_device = torch.device("cuda", device.local_hardware_id) if gpu else torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(torch_device)) if gpu else (lambda: None)
    n = max(1, nbytes // 4)
    src = {f"t{i:04d}": jax.device_put(jnp.full(n, i, jnp.float32), device) for i in range(count)}
    dst = {name: torch.empty(n, device=torch_device) for name in src}
    jax.block_until_ready(src)
    swap = lambda tree: jax_amem.swap(tree, dst, progress=False)  # noqa: E731
    swap(src)
    swap(src)  # the first repeat makes what later ones reuse
    how = run._how(None, None)
    destination = describe(dst)
    entry, _, _ = repeat.find(src, destination, how)
    assert entry is not None and entry.program.direct, "the swap is not a directly launched repeat"
    launch = entry.program.direct
    flat_src = torch.zeros(count * n, device=torch_device)
    flat_dst = torch.empty_like(flat_src)
    row = {"tensors": count, "bytes_each": n * 4, "platform": device.platform, "facts": facts}
    row["swap_us"] = median_us(lambda: swap(src), repeats, sync)
    row["new_arrays_us"] = new_arrays_us(src, repeats, sync, swap)
    row["check_us"] = median_us(lambda: repeat.find(src, destination, how), repeats, lambda: None)
    row["check_new_arrays_us"] = new_arrays_us(src, repeats, sync, lambda tree: repeat.find(tree, destination, how))
    ordinals = sorted({d.local_hardware_id for d in entry.devices if d.platform == "gpu"})
    row["before_launch_us"] = median_us(lambda: destination.before_launch(ordinals), repeats, lambda: None)
    row["while_launched_us"] = median_us(destination.while_launched, repeats, lambda: None)
    row["written_us"] = median_us(entry.table.written, repeats, lambda: None)
    repeat.find(src, destination, how)  # the pointer arrays hold `src`'s addresses again
    row["launch_us"] = median_us(lambda: launch.launch(entry.pointers, destination), repeats, sync)
    row["rest_us"] = row["swap_us"] - row["check_us"] - row["written_us"] - row["launch_us"]
    row["per_tensor_us"] = row["swap_us"] / count
    row["copy_us"] = median_us(lambda: flat_dst.copy_(flat_src), repeats, sync)
    jax_amem.swapping.forget()
    swap(src)
    swap(src)
    for name in src:  # the repeats above wrote every tensor: check the values once
        assert float(dst[name][0]) == float(src[name][0]), name
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(repeats):
            swap(src)
        profiler.disable()
        print(f"cProfile of {repeats} repeat swaps of {count} tensors, facts by {facts} (own time):")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
    return row


PIECES = [("swap_us", "whole repeat swap"), ("new_arrays_us", "  with new arrays"),
          ("check_us", "native check (repeat.find)"), ("check_new_arrays_us", "  with new arrays"),
          ("written_us", "written (versions)"), ("launch_us", "launch and its wait"),
          ("before_launch_us", "  of which before_launch"),
          ("while_launched_us", "  and while_launched (overlaps the copy)"), ("rest_us", "rest (front door, describe, report)"),
          ("per_tensor_us", "whole swap per tensor"), ("copy_us", "copy of the same bytes (copy_)")]


def main(argv=None) -> list[dict]:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", nargs="+", type=int, default=[2000, 64])
    parser.add_argument("--bytes", type=int, default=16, help="bytes per tensor (a multiple of 4)")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--facts", nargs="+", choices=["layout", "methods"], default=["layout", "methods"],
                        help="how the destination's facts are read (module docstring)")
    parser.add_argument("--profile", action="store_true", help="also cProfile the repeat swaps")
    parser.add_argument("--json", metavar="PATH", default=None)
    args = parser.parse_args(argv)
    rows = [measure(count, args.bytes, args.repeats, args.profile, facts)
            for count in args.counts for facts in args.facts]
    device = jax.devices()[0]
    print(f"host cost of a repeat swap on {device.platform} ({device.device_kind}), torch {torch.__version__}, "
          f"jax {jax.__version__}; tensors of {args.bytes} B; microseconds, medians of {args.repeats}")
    print(f"{'':<38}" + "".join(f"{r['tensors']:>7} t {r['facts']:>7}" for r in rows))
    for key, label in PIECES:
        print(f"{label:<38}" + "".join(f"{r[key]:>17.2f}" for r in rows))
    by = {(r["tensors"], r["facts"]): r for r in rows}
    ratios = [f"{by[c, 'methods']['swap_us'] / by[c, 'layout']['swap_us']:>16.2f}x" if (c, "layout") in by
              and (c, "methods") in by else f"{'-':>17}" for c in args.counts]
    print(f"{'whole swap, methods / layout':<38}" + "".join(ratio + " " * 17 * (len(args.facts) - 1)
                                                           for ratio in ratios))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(format=1, rows=rows), f, indent=1)
            f.write("\n")
    return rows


if __name__ == "__main__":
    main()
