"""NCCL pause/resume of XLA's own communicators: p50/p99 over cycles, against baselines from the same run.

    python -P benchmarks/nccl_pause.py [--processes 2 4] [--cycles 100]
    python -P benchmarks/nccl_pause.py --communicators 8     (communicators of our own instead)

XLA's communicators: 2 (or 4) JAX processes on one GPU (one NCCL_HOSTID each; four form a
2x2 mesh and sum over each axis and both: three communicators per process). Each cycle
pauses with `auto` and resumes, then checks the steps bit for bit. Baselines, measured in the
same run: `recreate` with the parallel teardown on the same communicators, and the naive
destroy + sequential init (fresh ids through the key-value store) on communicators of the same
shapes. Ratio: baseline time over auto's p50. Bytes: what NCCL says each suspend freed, against
its suspendable bytes (ncclCommMemStats). Device memory and host RSS are sampled over the cycles.
Split, the same cycles: each pause's and resume's agreement over the jax.distributed store
(NcclReport.agree_seconds) apart from NCCL's own part (NcclReport.seconds); the agreement
alone against the store's floor: benchmarks/nccl_agreement.py.
Use JAX_AMEM_NCCL_LIBRARY to run a newer NCCL (suspend needs >= 2.29.7).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpu_workers.run_pair import run_pair  # noqa: E402

GOAL_MS_4 = 20.0   # pause + resume p50 per process, four-process program
GOAL_RATIO = 20.0  # against the naive baseline


def of(results, phase):
    return sorted((r for r in results if r["phase"] == phase), key=lambda r: r["rank"])


def xla_program(processes: int, cycles: int, timeout: float) -> dict | None:
    results, logs = run_pair("xla_mesh_worker.py", [str(processes), str(cycles), "auto", "--baselines"],
                             processes=processes, timeout=timeout)
    cycles_rows, base, start = of(results, "cycles"), of(results, "baselines"), of(results, "start")
    if len(cycles_rows) != processes or len(base) != processes:
        print(f"nccl_pause: the {processes}-process program failed\n" +
              "\n".join(log[-3000:] for log in logs))
        return None
    worst = max(cycles_rows, key=lambda r: r["total_p50"])
    auto_ms = worst["total_p50"] * 1e3
    naive_ms = max((b["naive"]["pause"] + b["naive"]["resume"]) for b in base) * 1e3
    parallel_ms = max((b["recreate_parallel"]["pause"] + b["recreate_parallel"]["resume"]) for b in base) * 1e3
    comms = worst["first_report"]
    freed = sum(max(c["bytes_freed"], 0) for c in comms if c["last_strategy"] == "suspend")
    suspendable = sum(max(c["suspendable_bytes"], 0) for c in comms if c["last_strategy"] == "suspend")
    kept = sum(max(c["bytes_kept"], 0) for c in comms)
    recreated = sum(max(c["bytes_freed"], 0) for c in comms if c["last_strategy"] == "recreate")
    samples = worst["samples"]
    strategies = sorted({f"{c['last_strategy']} ({c['why']})" for c in comms})
    print(f"\nXLA's communicators, {processes} JAX processes on one GPU, NCCL {start[0]['nccl_version']}, "
          f"{worst['cycles']} cycles, {len(comms)} communicator(s) per process")
    print(f"  auto: {'; '.join(strategies)}")
    print(f"  {'(slowest process)':<34} {'p50 ms':>8} {'p99 ms':>8}")
    for name in ("pause", "resume", "total"):
        print(f"  {name if name != 'total' else 'pause + resume':<34} {worst[name + '_p50'] * 1e3:>8.1f} "
              f"{worst[name + '_p99'] * 1e3:>8.1f}")
    split = worst.get("split")
    if split:  # the same cycles, by phase (NcclReport.agree_seconds / .seconds)
        for name, label in (("pause_agree", "  pause: agreement (store)"),
                            ("pause_nccl", "  pause: NCCL (suspend / teardown)"),
                            ("resume_agree", "  resume: agreement (store)"),
                            ("resume_nccl", "  resume: NCCL (resume / re-init)")):
            print(f"  {label:<34} {split[name][0] * 1e3:>8.1f} {split[name][1] * 1e3:>8.1f}")
        rest = worst["total_p50"] - sum(split[name][0] for name in split)
        print(f"  {'  rest (total p50 - parts p50)':<34} {rest * 1e3:>8.1f}")
    print(f"  {'recreate-parallel (median of 3)':<34} {parallel_ms:>8.1f} {'':>8}  auto is "
          f"{parallel_ms / auto_ms:.1f}x faster")
    print(f"  {'naive destroy + sequential init':<34} {naive_ms:>8.1f} {'':>8}  auto is "
          f"{naive_ms / auto_ms:.1f}x faster (goal >= {GOAL_RATIO:.0f}x)")
    if processes == 4:
        print(f"  goal: pause + resume p50 <= {GOAL_MS_4:.0f} ms per process: "
              f"{'met' if auto_ms <= GOAL_MS_4 else 'missed'} ({auto_ms:.1f} ms)")
    share = f"{100 * freed / suspendable:.1f}%" if suspendable else "n/a"
    print(f"  suspend freed {freed / 2**20:.1f} of {suspendable / 2**20:.1f} MiB suspendable ({share}); "
          f"kept {kept / 2**20:.1f} MiB; recreate freed {recreated / 2**20:.1f} MiB")
    print(f"  over the cycles (first to last): device free (whole GPU) "
          f"{(samples[-1]['free'] - samples[0]['free']) / 2**20:+.1f} MiB, this process's device memory "
          f"{(samples[-1]['used'] - samples[0]['used']) / 2**20:+.1f} MiB ({samples[0]['source']}), "
          f"host RSS {(samples[-1]['rss'] - samples[0]['rss']) / 2**20:+.1f} MiB "
          f"(second half {(samples[-1]['rss'] - samples[len(samples) // 2]['rss']) / 2**20:+.1f}); "
          f"bit-identical: {all(r['identical'] for r in cycles_rows)}")
    return {"processes": processes, "split": split, "auto_ms": auto_ms, "naive_ms": naive_ms, "parallel_ms": parallel_ms,
            "freed": freed, "suspendable": suspendable, "rows": cycles_rows}


def own_communicators(count: int, timeout: float) -> list:
    """The earlier benchmark: N communicators of our own between two processes."""
    results, logs = run_pair("nccl_comms_worker.py", [str(count)], timeout=timeout)
    rows = [r for r in results if r["phase"] == "rows" and r["rank"] == 0]
    setup = [r for r in results if r["phase"] == "setup" and r["rank"] == 0]
    if not rows:
        print("nccl_pause: workers failed\n" + "\n".join(log[-3000:] for log in logs))
        return []
    table = rows[0]["rows"]
    baseline = next(r for r in table if r["method"].startswith("naive"))
    base_total = baseline["pause_s"] + baseline["resume_s"]
    print(f"NCCL pause/resume, {count} communicators x 2 ranks, NCCL {setup[0]['nccl_version']} "
          "(baseline: destroy + sequential init, same run)")
    print(f"{'method':<34} {'freed MiB':>10} {'pause ms':>9} {'resume ms':>10} {'total ms':>9} {'vs base':>8}")
    for row in table:
        if "skipped" in row:
            print(f"{row['method']:<34} {'skipped: ' + row['skipped']}")
            continue
        total = row["pause_s"] + row["resume_s"]
        print(f"{row['method']:<34} {row['freed_bytes'] / 2**20:>10.1f} {row['pause_s'] * 1e3:>9.1f} "
              f"{row['resume_s'] * 1e3:>10.1f} {total * 1e3:>9.1f} {base_total / total:>7.2f}x")
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--communicators", type=int, default=0,
                        help="instead: this many communicators of our own between two processes")
    parser.add_argument("--timeout", type=float, default=300, help="seconds before the workers are killed")
    args = parser.parse_args(argv)
    import jax_amem

    if not jax_amem.gpu_status().usable or not jax_amem.nccl.is_installed():
        print(f"nccl_pause: skipped ({jax_amem.gpu_status().why_not() or jax_amem.nccl.status()})")
        return []
    if args.communicators:
        return own_communicators(args.communicators, args.timeout)
    return [xla_program(p, args.cycles, args.timeout) for p in args.processes]


if __name__ == "__main__":
    main()
