"""The swap's NCCL transport against a plain NCCL send/recv of the same bytes, same run.

    python -P benchmarks/swap_nccl.py [--mib 1024] [--tensors 16] [--bucket-mib 64] [--repeat 5]

Two processes on this machine (one GPU shared with different NCCL_HOSTID: NCCL's socket
transport, so both columns are bounded by it; with --gpus 2 one GPU each) connect a link:
a JAX trainer sends TENSORS float32 tensors of MIB MiB in all into a PyTorch rollout's
tensors (jax_amem.swapping.cross_host: packed into BUCKET_MIB buckets, two in flight), and
the baseline sends the same number of bytes as one contiguous ncclSend/ncclRecv on the same
communicator. Medians of REPEAT runs after a warm-up, timed on the rollout from a common
barrier to the bytes being in place. Ratio: swap GB/s over plain GB/s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpu_workers.run_pair import run_pair  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--bucket-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600, help="seconds before the workers are killed")
    args = parser.parse_args(argv)
    import jax_amem

    if not jax_amem.gpu_status().usable or not jax_amem.nccl.is_installed():
        print(f"swap_nccl: skipped ({jax_amem.gpu_status().why_not() or jax_amem.nccl.status()})")
        return []
    results, logs = run_pair("nccl_swap_bench_worker.py",
                             [str(args.mib), str(args.tensors), str(args.bucket_mib), str(args.repeat)],
                             gpus=args.gpus, timeout=args.timeout)
    rows = [r for r in results if r.get("role") == "rollout" and "swap_s" in r]
    if not rows:
        print("swap_nccl: workers failed\n" + "\n".join(log[-3000:] for log in logs))
        return []
    r = rows[0]
    swap_gbs, plain_gbs = r["bytes"] / r["swap_s"] / 1e9, r["bytes"] / r["plain_s"] / 1e9
    print(f"NCCL swap vs plain send/recv ({'one GPU, socket transport' if args.gpus == 1 else 'two GPUs'}): "
          f"{r['bytes'] / 2**20:.0f} MiB in {args.tensors} tensors, {r['buckets']} bucket(s) of "
          f"{args.bucket_mib} MiB, staging {r['staging'] / 2**20:.0f} MiB per side")
    print(f"{'method':<28} {'median ms':>10} {'GB/s':>8} {'ratio':>6}")
    print(f"{'plain ncclSend/ncclRecv':<28} {r['plain_s'] * 1e3:>10.1f} {plain_gbs:>8.2f} {1.0:>6.2f}")
    print(f"{'swap (cross_host)':<28} {r['swap_s'] * 1e3:>10.1f} {swap_gbs:>8.2f} {swap_gbs / plain_gbs:>6.2f}")
    print(f"values received correctly: {r['values_ok']}")
    return rows


if __name__ == "__main__":
    main()
