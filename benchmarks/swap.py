"""Swap bandwidth (JAX arrays -> a rollout's PyTorch tensors, in place) against a device copy
of the same bytes and two baselines, all measured in the same run.

    python -P benchmarks/swap.py [--large-mib 512 2048 --large-count 4] [--small-count 2000 --small-kib 16]

Cases: a few large tensors, and a model of many small tensors. Columns, each for the same
bytes: the swap (`jax_amem.swap`, warm: plan and program cached), the ceiling (one
`torch.Tensor.copy_` of a buffer of all the bytes, device to device), `jax.device_put` to the
destination's sharding (a forced copy, `may_alias=False`), and a per-tensor
`dst.copy_(torch.from_dlpack(src))` loop. Payload bandwidth counts each byte once. Times are
medians of --repeats runs; every run ends when the device is idle.

The swap writes PyTorch tensors by address (the "addresses" route: a few
segment_copy_to_addresses calls per group; rows of at least jax_amem.copy.BULK_BYTES as one
driver copy each, the rest one kernel launch per call).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import jax_amem  # noqa: F401  (before JAX starts)
import jax
import jax.numpy as jnp


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


def run_case(name: str, count: int, elements: int, device, torch_device, repeats: int) -> dict:
    import torch

    sync = (lambda: torch.cuda.synchronize(torch_device)) if torch_device.type == "cuda" else (lambda: None)
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(elements, dtype=np.float32) for _ in range(count)]
    src = {f"t{i}": jax.device_put(h, device) for i, h in enumerate(host)}
    jax.block_until_ready(src)
    dst = {k: torch.empty(elements, dtype=torch.float32, device=torch_device) for k in src}
    nbytes = count * elements * 4

    first, swap_s, report = time_swap(src, dst, host, repeats, sync)

    flat_src = torch.empty(nbytes // 4, dtype=torch.float32, device=torch_device).normal_()
    flat_dst = torch.empty_like(flat_src)
    ceiling_s = median_seconds(lambda: flat_dst.copy_(flat_src), repeats, sync)

    sharding = jax.sharding.SingleDeviceSharding(device)
    put_s = median_seconds(lambda: jax.block_until_ready(
        jax.device_put(list(src.values()), [sharding] * count, may_alias=False)), repeats, sync)

    def per_tensor():
        with torch.no_grad():
            for k, t in dst.items():
                t.copy_(torch.from_dlpack(src[k]))
    copy_s = median_seconds(per_tensor, repeats, sync)
    del flat_src, flat_dst
    row = {"case": name, "tensors": count, "bytes": nbytes, "first_s": first, "swap_s": swap_s,
           "ceiling_s": ceiling_s, "device_put_s": put_s, "per_tensor_s": copy_s,
           "calls": report.calls, "launches": report.launches, "transports": report.transports}
    return row


def print_table(rows: list[dict], where: str) -> None:
    gbs = lambda r, key: r["bytes"] / r[key] / 1e9
    print(f"swap into PyTorch tensors on {where} (same bytes, same run; medians)")
    print(f"{'case':>8} {'tensors':>8} {'MiB':>8} {'swap GB/s':>10} {'ceiling':>9} {'of ceil':>8} "
          f"{'device_put':>11} {'per-tensor':>11} {'vs put':>7} {'vs copy_':>9} {'first s':>8} {'calls':>6}")
    for r in rows:
        print(f"{r['case']:>8} {r['tensors']:>8} {r['bytes'] / 2**20:>8.1f} {gbs(r, 'swap_s'):>10.2f} "
              f"{gbs(r, 'ceiling_s'):>9.2f} {r['ceiling_s'] / r['swap_s']:>8.0%} {gbs(r, 'device_put_s'):>11.2f} "
              f"{gbs(r, 'per_tensor_s'):>11.2f} {r['device_put_s'] / r['swap_s']:>6.2f}x "
              f"{r['per_tensor_s'] / r['swap_s']:>8.2f}x {r['first_s']:>8.2f} {r['calls']:>6}")
    for r in rows:
        print(f"  {r['case']}: transports {r['transports']}; {r['launches']} copy launches")


def main(argv=None) -> list[dict]:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-mib", type=float, nargs="+", default=None,
                        help="MiB per large tensor, one case per value (GPU 512 2048, CPU 8)")
    parser.add_argument("--large-count", type=int, default=4)
    parser.add_argument("--small-count", type=int, default=None, help="small tensors (GPU 2000, CPU 200)")
    parser.add_argument("--small-kib", type=float, default=16)
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per figure (GPU 20, CPU 3)")
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    gpu = device.platform == "gpu"
    torch_device = torch.device("cuda", device.local_hardware_id) if gpu else torch.device("cpu")
    large = args.large_mib if args.large_mib is not None else ([512, 2048] if gpu else [8])
    small = args.small_count if args.small_count is not None else (2000 if gpu else 200)
    repeats = args.repeats if args.repeats is not None else (20 if gpu else 3)
    rows = [run_case(f"large{k or ''}", args.large_count, int(mib * 2**18), device, torch_device, repeats)
            for k, mib in enumerate(large)]
    rows.append(run_case("small", small, int(args.small_kib * 2**8), device, torch_device, repeats))
    print_table(rows, f"{device.platform} ({device.device_kind}), torch {torch_device}")
    return rows


if __name__ == "__main__":
    main()
