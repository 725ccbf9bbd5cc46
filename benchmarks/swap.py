"""Swap time (JAX arrays -> a rollout's PyTorch tensors, in place) against a device copy of the
same bytes and two baselines, all measured in the same run, with the swap's goals.

    python -P benchmarks/swap.py [--cases 4x2048 4x512 64x4 2000x0.015625] [--repeats 20]
                                 [--sweep] [--json PATH]

A case is COUNTxMIB (tensors x MiB each; GPU default: 4 x 2 GiB, 4 x 512 MiB, 64 x 4 MiB,
2000 x 16 KiB; CPU: 4 x 8 MiB, 200 x 16 KiB). Columns, each for the same bytes: the swap
(`jax_amem.swap`, warm: a repeat of the same inputs), the swap with new source arrays every
time (a training loop: a jitted step makes them; timed from the swap call), the device copy
(one `torch.Tensor.copy_` of a buffer of all the bytes, device to device), the swap through
XLA's custom calls (the direct launch off: in_process/direct.py), `jax.device_put`
to the destination's sharding (a forced copy), and the per-tensor
`dst.copy_(torch.from_dlpack(src))` loop. Times are medians of --repeats runs; every run ends
when the device is idle.

--sweep runs the tensor-size sweep instead (16 KiB to 2 GiB per tensor, SWEEP_GPU / SWEEP_CPU):
what the notebooks plot as GB/s against tensor size, beside the device copy and the loop.
--json PATH writes the rows and the machine (docs/figures/ keeps the H200's).

Goals (H200): tensors of 64 MiB and more at >= 90% of the device copy (device copy
time / swap time); tensors of 4 MiB and more, 256 MiB or more in all (64 x 4 MiB), at >= 70%;
2000 x 16 KiB in 1 ms or less and >= 30x faster than the per-tensor copy_ loop. On a CPU the
goals are not judged (the figures show the Python cost).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import jax_amem  # noqa: F401  (before JAX starts)
import jax
import jax.numpy as jnp

GOAL_OF_COPY = 0.90           # tensors of LARGE_TENSOR_BYTES or more: device copy time / swap time
LARGE_TENSOR_BYTES = 64 << 20
GOAL_MID_OF_COPY = 0.70       # tensors of MID_TENSOR_BYTES or more, MID_BYTES or more in all
MID_TENSOR_BYTES = 4 << 20
MID_BYTES = 256 << 20
SMALL_GOAL_SECONDS = 1e-3     # 2000 x 16 KiB
SMALL_GOAL_VS_LOOP = 30.0     # per-tensor copy_ loop time / swap time


def median_seconds(step, repeats: int, sync) -> float:
    step()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_swap(src, dst, host, repeats: int, sync):
    """(first call seconds, warm median seconds, report) of the swap; checks every byte once."""
    import torch

    first = time.perf_counter()
    report = jax_amem.swap(src, dst, progress=False)
    first = time.perf_counter() - first
    assert all(torch.equal(dst[k].cpu(), torch.from_numpy(h)) for k, h in zip(src, host))
    warm = median_seconds(lambda: jax_amem.swap(src, dst, progress=False), repeats, sync)
    return first, warm, report


def time_swap_new_arrays(src, dst, repeats: int, sync) -> float:
    """Median seconds of a swap whose sources are new arrays each time (a jitted step's
    outputs, as in a training loop); only the swap is timed."""
    step = jax.jit(lambda tree: jax.tree_util.tree_map(lambda x: x + 1, tree))
    times = []
    for k in range(repeats + 1):
        src = jax.block_until_ready(step(src))
        sync()
        start = time.perf_counter()
        jax_amem.swap(src, dst, progress=False)
        sync()
        if k:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_xla_route(src, dst, repeats: int, sync) -> float:
    """Median seconds of the same swap with the direct launch off (XLA's custom calls, the
    route before the direct launch), for the comparison in the same run."""
    from jax_amem.swapping.in_process import direct

    was = direct.ENABLED
    direct.ENABLED = False
    jax_amem.swapping.forget()  # the choice is made when a program first runs
    try:
        return median_seconds(lambda: jax_amem.swap(src, dst, progress=False), repeats, sync)
    finally:
        direct.ENABLED = was
        jax_amem.swapping.forget()


def run_case(count: int, elements: int, device, torch_device, repeats: int) -> dict:
    import torch

    sync = (lambda: torch.cuda.synchronize(torch_device)) if torch_device.type == "cuda" else (lambda: None)
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(elements, dtype=np.float32) for _ in range(count)]
    src = {f"t{i}": jax.device_put(h, device) for i, h in enumerate(host)}
    jax.block_until_ready(src)
    dst = {k: torch.empty(elements, dtype=torch.float32, device=torch_device) for k in src}
    nbytes = count * elements * 4

    first, swap_s, report = time_swap(src, dst, host, repeats, sync)
    new_s = time_swap_new_arrays(src, dst, repeats, sync)
    xla_s = time_xla_route(src, dst, repeats, sync)

    flat_src = torch.empty(nbytes // 4, dtype=torch.float32, device=torch_device).normal_()
    flat_dst = torch.empty_like(flat_src)
    copy_s = median_seconds(lambda: flat_dst.copy_(flat_src), repeats, sync)
    del flat_src, flat_dst

    sharding = jax.sharding.SingleDeviceSharding(device)
    put_s = median_seconds(lambda: jax.block_until_ready(
        jax.device_put(list(src.values()), [sharding] * count, may_alias=False)), repeats, sync)

    def per_tensor():
        with torch.no_grad():
            for k, t in dst.items():
                t.copy_(torch.from_dlpack(src[k]))
    loop_s = median_seconds(per_tensor, repeats, sync)
    return {"case": f"{count} x {_size(elements * 4)}", "tensors": count, "bytes": nbytes, "first_s": first,
            "swap_s": swap_s, "new_s": new_s, "xla_s": xla_s, "copy_s": copy_s, "device_put_s": put_s, "loop_s": loop_s,
            "calls": report.calls, "launches": report.launches, "transports": report.transports}


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def goal_of(row: dict, judged: bool) -> tuple[str, str]:
    """(the goal in words, 'yes' / 'NO' / 'n/a') for one case."""
    if row["tensors"] >= 2000 and row["bytes"] <= row["tensors"] * (16 << 10):
        goal = f"<= {SMALL_GOAL_SECONDS * 1e3:g} ms, >= {SMALL_GOAL_VS_LOOP:g}x copy_ loop"
        met = row["swap_s"] <= SMALL_GOAL_SECONDS and row["loop_s"] / row["swap_s"] >= SMALL_GOAL_VS_LOOP
    elif row["bytes"] >= row["tensors"] * MID_TENSOR_BYTES and row["bytes"] >= MID_BYTES:
        share = GOAL_OF_COPY if row["bytes"] >= row["tensors"] * LARGE_TENSOR_BYTES else GOAL_MID_OF_COPY
        goal = f">= {share:.0%} of device copy"
        met = row["copy_s"] / row["swap_s"] >= share
    else:
        return "-", "-"
    return goal, ("yes" if met else "NO") if judged else "n/a (CPU)"


def print_table(rows: list[dict], where: str, judged: bool) -> None:
    ms = lambda seconds: f"{seconds * 1e3:.3f}"
    print(f"swap into PyTorch tensors on {where} (same bytes, same run; medians, ms)")
    print(f"{'case':>18} {'MiB':>8} {'swap':>8} {'new src':>8} {'via XLA':>8} {'dev copy':>9} {'of copy':>8} "
          f"{'copy_ loop':>10} {'vs loop':>8} {'device_put':>10} {'first':>8}  goal -> met?")
    for r in rows:
        goal, met = goal_of(r, judged)
        print(f"{r['case']:>18} {r['bytes'] / 2**20:>8.1f} {ms(r['swap_s']):>8} {ms(r['new_s']):>8} {ms(r['xla_s']):>8} "
              f"{ms(r['copy_s']):>9} {r['copy_s'] / r['swap_s']:>8.0%} {ms(r['loop_s']):>10} "
              f"{r['loop_s'] / r['swap_s']:>7.1f}x {ms(r['device_put_s']):>10} {ms(r['first_s']):>8}  {goal} -> {met}")
    for r in rows:
        print(f"  {r['case']}: {r['calls']} jitted call(s), {r['launches']} copy launches; "
              f"transports {r['transports']}; swap {r['bytes'] / r['swap_s'] / 1e9:.1f} GB/s")


# The sweep: tensor sizes from 16 KiB to 2 GiB, counts chosen so that each case is tens of MiB
# to 8 GiB and creating the sources stays quick.
SWEEP_GPU = ["2000x0.015625", "2000x0.0625", "1000x0.25", "1000x1", "256x4", "64x16", "16x64", "8x128",
             "4x256", "4x512", "4x2048"]
SWEEP_CPU = ["200x0.015625", "100x0.25", "16x4", "4x8"]


def write_json(path: str, rows: list[dict], device, torch_device) -> None:
    import torch

    machine = dict(platform=device.platform, device_kind=device.device_kind, torch_device=str(torch_device),
                   jax=jax.__version__, torch=torch.__version__, bulk_bytes=jax_amem.copy.BULK_BYTES)
    with open(path, "w") as f:
        json.dump(dict(format=1, machine=machine, rows=rows), f, indent=1)
        f.write("\n")


def parse_case(text: str) -> tuple[int, float]:
    count, mib = text.lower().split("x")
    return int(count), float(mib)


def main(argv=None) -> list[dict]:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=None,
                        help="COUNTxMIB each (GPU: 4x2048 4x512 64x4 2000x0.015625; CPU: 4x8 200x0.015625)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per figure (GPU 20, CPU 3)")
    parser.add_argument("--bulk-mib", type=float, default=None,
                        help="rows of at least this many MiB run as one driver copy each, the rest in the "
                             "kernel (jax_amem.copy.BULK_BYTES; default as set there)")
    parser.add_argument("--sweep", action="store_true", help="the tensor-size sweep (SWEEP_GPU / SWEEP_CPU)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the rows to PATH as JSON")
    args = parser.parse_args(argv)
    if args.sweep and args.cases:
        parser.error("--sweep and --cases choose the cases both: give one of them")
    if args.bulk_mib is not None:
        jax_amem.copy.BULK_BYTES = int(args.bulk_mib * 2**20)
    device = jax.devices()[0]
    gpu = device.platform == "gpu"
    torch_device = torch.device("cuda", device.local_hardware_id) if gpu else torch.device("cpu")
    if args.sweep:
        cases = SWEEP_GPU if gpu else SWEEP_CPU
    else:
        cases = args.cases or (["4x2048", "4x512", "64x4", "2000x0.015625"] if gpu else ["4x8", "200x0.015625"])
    repeats = args.repeats if args.repeats is not None else (20 if gpu else 3)
    rows = []
    for text in cases:
        count, mib = parse_case(text)
        rows.append(run_case(count, int(mib * 2**18), device, torch_device, repeats))
        jax_amem.swapping.forget()
        if args.json:  # after every case: a run cut short keeps what it measured
            write_json(args.json, rows, device, torch_device)
    bulk = jax_amem.copy.BULK_BYTES / 2**20
    print_table(rows, f"{device.platform} ({device.device_kind}), torch {torch_device}, driver copies for rows "
                f">= {bulk:g} MiB", judged=gpu)
    if args.json:
        write_json(args.json, rows, device, torch_device)
    return rows


if __name__ == "__main__":
    main()
