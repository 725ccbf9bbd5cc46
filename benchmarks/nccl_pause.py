"""NCCL pause/resume: bytes freed, pause and resume time per strategy, against the naive baseline.

    python -P benchmarks/nccl_pause.py [--communicators 8] [--gpus 1]

Two processes on this machine (one GPU shared with different NCCL_HOSTID, or one
GPU each with --gpus 2) create N communicators through the interposer. Each
strategy pauses and resumes all of them; the baseline, measured in the same
run, destroys every communicator and initialises each again one after another
with a fresh unique id through the jax.distributed key-value store. Ratio is
baseline (pause+resume) time over the strategy's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpu_workers.run_pair import run_pair  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--communicators", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=240, help="seconds before the workers are killed")
    args = parser.parse_args(argv)
    import jax_amem

    if not jax_amem.gpu_status().usable or not jax_amem.nccl.is_installed():
        print(f"nccl_pause: skipped ({jax_amem.gpu_status().why_not() or jax_amem.nccl.status()})")
        return []
    results, logs = run_pair("nccl_comms_worker.py", [str(args.communicators)], gpus=args.gpus,
                             timeout=args.timeout)
    rows = [r for r in results if r["phase"] == "rows" and r["rank"] == 0]
    setup = [r for r in results if r["phase"] == "setup" and r["rank"] == 0]
    if not rows:
        print("nccl_pause: workers failed\n" + "\n".join(log[-3000:] for log in logs))
        return []
    table = rows[0]["rows"]
    baseline = next(r for r in table if r["method"].startswith("naive"))
    base_total = baseline["pause_s"] + baseline["resume_s"]
    print(f"NCCL pause/resume, {args.communicators} communicators x 2 ranks, NCCL "
          f"{setup[0]['nccl_version']}, {args.gpus} GPU(s) (baseline: destroy + sequential init, same run)")
    print(f"{'method':<34} {'freed MiB':>10} {'pause ms':>9} {'resume ms':>10} {'total ms':>9} {'vs base':>8}")
    for row in table:
        if "skipped" in row:
            print(f"{row['method']:<34} {'skipped: ' + row['skipped']}")
            continue
        total = row["pause_s"] + row["resume_s"]
        print(f"{row['method']:<34} {row['freed_bytes'] / 2**20:>10.1f} {row['pause_s'] * 1e3:>9.1f} "
              f"{row['resume_s'] * 1e3:>10.1f} {total * 1e3:>9.1f} {base_total / total:>7.2f}x")
    return table


if __name__ == "__main__":
    main()
