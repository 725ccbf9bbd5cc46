"""NCCL pause/resume of XLA's own communicators: p50/p99 over cycles, against baselines from the same run.

    python -P benchmarks/nccl_pause.py [--processes 2 4] [--cycles 100]
    python -P benchmarks/nccl_pause.py --communicators 8     (communicators of our own instead)
    python -P benchmarks/nccl_pause.py --scale 10.5G --channels 64 --use 4 --methods auto:3,recreate:2 --naive
                                                             (gigabytes of NCCL memory: below)
    python -P benchmarks/nccl_pause.py --strategies 4,8,32 --channels 0 --rss 4 --rss-methods suspend:500,...
                                                             (every strategy side by side, and host RSS: below)

XLA's communicators: 2 (or 4) JAX processes on one GPU (one NCCL_HOSTID each), or one GPU
each with --gpus N (NVLink P2P buffers, as on a real node; four form a
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

--scale N: N communicators of our own between two processes on one GPU (or, given a size such as
10.5G, as many as make this process's device memory grow by that much), their buffers sized by
NCCL_BUFFSIZE and NCCL_MIN/MAX_NCHANNELS (--buffsize, --channels), the first --use of them used
by an all-reduce first (on the socket transport each connection pins NCCL_BUFFSIZE of host memory
per channel and direction: GB of host memory per communicator at 64M x 16 channels); per method, pause + resume cycles checked bit for bit, the bytes freed by NCCL's count
(ncclCommMemStats) and by the driver (NVML, this process), the first collective after resume,
device memory and host RSS over the cycles; --naive: the naive rebuild of the same
communicators in the same run (destroy each in turn, initialise each in turn).

--strategies 4,8,32: communicators of our own between two processes on one GPU (--channels 0: NCCL's
default buffers; 16: sixteen channels, about 100 MiB of device memory each). On the first 4, 8 and
32 of them, in the same processes: `auto` on its starting rates (auto0), suspend, recreate, `auto`
on the rates it measured meanwhile, and the naive rebuild (destroy each in turn, initialise each in
turn); pause + resume p50 of each, auto against the better of suspend and recreate (goal: within
10%) and against the naive rebuild. Then --rss communicators cycled by each of --rss-methods with
the host RSS read after every cycle: growth per 100 cycles (least squares over the second half, and
first to last), goal <= 1 MiB. The controls there: naive (NCCL's destroy and init one at a time),
naive_group (the same, initialised in one NCCL group as recreate does: NCCL's own part of recreate),
recreate_inturn (recreate without the teardown's threads) and recreate_notrim (without malloc_trim).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpu_workers.run_pair import run_pair  # noqa: E402

GOAL_MS_4 = 20.0   # pause + resume p50 per process, four-process program
GOAL_RATIO = 20.0  # against the naive baseline


def of(results, phase):
    return sorted((r for r in results if r["phase"] == phase), key=lambda r: r["rank"])


def xla_program(processes: int, cycles: int, timeout: float, gpus: int = 1) -> dict | None:
    results, logs = run_pair("xla_mesh_worker.py", [str(processes), str(cycles), "auto", "--baselines"],
                             processes=processes, timeout=timeout, gpus=gpus)
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


def scale(args) -> list:
    """Gigabytes of NCCL buffers in each of two processes on one GPU (tests/gpu_workers/nccl_scale_worker.py)."""
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "NCCL_BUFFSIZE": str(bytes_of(args.buffsize))}
    if args.channels:
        env.update(NCCL_MIN_NCHANNELS=str(args.channels), NCCL_MAX_NCHANNELS=str(args.channels))
    flags = (["--naive"] if args.naive else []) + (["--probe"] if args.probe else [])
    flags += ["--use", str(args.use)] if args.use else []
    results, logs = run_pair("nccl_scale_worker.py", [args.scale, args.methods, *flags],
                             timeout=args.timeout, extra_env=env)   # a port taken before it bound: run again there
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    start = of(results, "start")
    setup = of(results, "setup")
    methods = [r for r in results if r["phase"] == "method"]
    if len(setup) != 2 or any("error" in r for r in methods) or not of(results, "done"):
        print("nccl_pause --scale: the workers failed\n" + "\n".join(log[-4000:] for log in logs))
    if not setup:
        return results
    s = setup[0]
    mib = lambda b: f"{b / 2**20:.0f}"  # noqa: E731
    print(f"\nNCCL at scale: {s['count']} communicators x 2 ranks on one GPU (socket transport; "
          f"{s['used_for_collectives']} used by an all-reduce), NCCL {start[0]['nccl_version']}, "
          f"NCCL_BUFFSIZE={args.buffsize}, channels {args.channels or 'default'}")
    print(f"  per process: init {s['init_s'] * 1e3:.0f} ms, first all-reduce (connect) {s['connect_s'] * 1e3:.0f} ms; "
          f"device +{mib(s['init_device'])} MiB at init, +{mib(s['connect_device'])} MiB at connect; host RSS "
          f"+{mib(s['init_rss'])} / +{mib(s['connect_rss'])} MiB; NCCL's count {json.dumps({k: mib(v) for k, v in s['memstats'].items()})} MiB")
    for probe in of(results, "probe")[:1]:
        print(f"  probe: {json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in probe.items()})}")
    print(f"  {'method (rank 0)':<13} {'cycles':>6} {'NCCL freed':>11} {'driver freed':>12} {'pause p50':>10} "
          f"{'resume p50':>10} {'total p50':>10} {'p99':>8} {'1st coll.':>9} {'agree':>7} {'GB/s':>6} {'vs naive':>8}  identical")
    naive_total = next((r["total_p50"] for r in methods if r["rank"] == 0 and r["method"] == "naive"), 0)
    for row in (r for r in methods if r["rank"] == 0):
        if "error" in row:
            print(f"  {row['method']:<13} error: {row['error']}")
            continue
        freed = row.get("nccl_freed", 0) if row["method"] != "naive" else row["driver_freed"]
        rate = row["driver_freed"] / row["pause_p50"] / 1e9 if row["pause_p50"] > 0 else 0
        print(f"  {row['method']:<13} {row.get('cycles', 1):>6} {mib(freed):>11} {mib(row['driver_freed']):>12} "
              f"{row['pause_p50'] * 1e3:>10.1f} {row['resume_p50'] * 1e3:>10.1f} {row['total_p50'] * 1e3:>10.1f} "
              f"{row.get('total_p99', row['total_p50']) * 1e3:>8.1f} {row['first_collective_p50'] * 1e3:>9.1f} "
              f"{row.get('agree_p50', 0) * 1e3:>7.1f} {rate:>6.1f} "
              f"{(naive_total / row['total_p50'] if naive_total and row['total_p50'] else 0):>7.2f}x  {row['identical']}"
              + (f"  (slowest teardown {row['teardown_max'] * 1e3:.0f} ms)" if row.get("teardown_max") else ""))
        samples = row.get("samples") or []
        if len(samples) > 1:
            print(f"  {'':<13} over the cycles: device {(samples[-1]['used'] - samples[0]['used']) / 2**20:+.1f} MiB, "
                  f"host RSS {(samples[-1]['rss'] - samples[0]['rss']) / 2**20:+.1f} MiB")
    return results


def end_to_end(row: dict) -> float:
    """Pause + resume and the first collective after, where a recreated communicator connects
    again and a suspended one does not (p50s of the same cycles)."""
    return row["total_p50"] + row["first_collective_p50"]


def better_of(merged: dict, count: int, measure) -> tuple:
    """The better of suspend and recreate at `count` communicators by `measure`: (method, value);
    (None, 0) where neither ran."""
    measured = [m for m in ("suspend", "recreate") if (count, m) in merged]
    if not measured:
        return None, 0
    method = min(measured, key=lambda m: measure(merged[(count, m)]))
    return method, measure(merged[(count, method)])


def verdict(auto_row: dict, value: float, better: str, best: float, count: int) -> str:
    """Within 10% of the better strategy, or MISSED; a miss where auto chose what the better row
    did is the spread between runs of the same strategy, not a wrong choice, and says so."""
    if value <= 1.1 * best:
        return "within 10%"
    if auto_row["strategies"] == {better: count}:
        return f"MISSED (the same choice as {better}: the spread between their runs)"
    return "MISSED"


def strategies(args) -> list:
    """Every strategy on the same communicators (tests/gpu_workers/nccl_strategies_worker.py)."""
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if args.channels:
        env.update(NCCL_MIN_NCHANNELS=str(args.channels), NCCL_MAX_NCHANNELS=str(args.channels))
    worker_args = [args.strategies, args.methods if args.methods != DEFAULT_METHODS else STRATEGY_METHODS]
    if args.rss:
        worker_args += [str(args.rss), args.rss_methods, str(args.rss_seconds)]
    results, logs = run_pair("nccl_strategies_worker.py", worker_args, timeout=args.timeout, extra_env=env)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    start = of(results, "start")
    if not of(results, "done"):
        print("nccl_pause --strategies: the workers failed\n" + "\n".join(log[-4000:] for log in logs))
    if not start:
        return results
    setup = of(results, "setup")
    version = start[0]["nccl_version"]
    buffers = f"{args.channels} channels" if args.channels else "NCCL's default buffers"
    per = {k: round(v / 2**20, 1) for k, v in (setup[0]["memstats"] if setup else {}).items()}
    print(f"\nEvery strategy, NCCL {version}, 2 ranks on one GPU (socket transport), {buffers}; "
          f"one communicator: {per or 'no ncclCommMemStats'} MiB")
    rows = [r for r in results if r["phase"] == "sizes"]
    # The slower of the two ranks is what the job waits for.
    merged = {}
    for r in rows:
        key = (r["count"], r["method"])
        if key not in merged or r["total_p50"] > merged[key]["total_p50"]:
            merged[key] = r
    print(f"  {'count':>5} {'method':<8} {'cycles':>6} {'pause p50':>10} {'resume p50':>10} {'total p50':>10} "
          f"{'1st coll.':>9} {'vs naive':>8} {'vs best':>8}  chosen / identical")
    verdicts = []
    for count in sorted({c for c, _ in merged}):
        naive = merged.get((count, "naive"))
        better, best = better_of(merged, count, lambda row: row["total_p50"])
        better_end_to_end, best_end_to_end = better_of(merged, count, end_to_end)
        for (c, method), r in sorted(merged.items(), key=lambda kv: (kv[0][0], ORDER.index(kv[0][1]))):
            if c != count:
                continue
            ratio = lambda base: f"{base / r['total_p50']:>7.2f}x" if base and r["total_p50"] > 0 else f"{'-':>8}"  # noqa: E731
            chosen = ", ".join(f"{k} {v}" for k, v in sorted(r["strategies"].items()))
            print(f"  {count:>5} {method:<8} {r['cycles']:>6} {r['pause_p50'] * 1e3:>10.1f} {r['resume_p50'] * 1e3:>10.1f} "
                  f"{r['total_p50'] * 1e3:>10.1f} {r['first_collective_p50'] * 1e3:>9.1f} "
                  f"{ratio(naive and naive['total_p50'])} {ratio(best)}  {chosen or '-'} / {r['identical']}")
            if method.startswith("auto") and best:
                verdicts.append(f"{count} communicators, {method}: {r['total_p50'] * 1e3:.1f} ms against the better "
                                f"of suspend and recreate {best * 1e3:.1f} ms: "
                                f"{verdict(r, r['total_p50'], better, best, count)}; "
                                + ("the naive rebuild not measured" if not naive else
                                   f"{'faster' if r['total_p50'] <= naive['total_p50'] else 'NOT faster'} "
                                   "than the naive rebuild"))
                verdicts.append(f"{count} communicators, {method}, end to end (with the first collective after): "
                                f"{end_to_end(r) * 1e3:.1f} ms against the better {best_end_to_end * 1e3:.1f} ms: "
                                f"{verdict(r, end_to_end(r), better_end_to_end, best_end_to_end, count)}")
    for line in verdicts:
        print("  goal: " + line)
    for r in (r for r in rows if r["rank"] == 0 and r["method"].startswith("auto") and r["count"] == max(merged)[0]):
        print(f"  why ({r['method']}, {r['count']}): {r['why']}")
    rss_rows = of(results, "rss")
    if rss_rows:
        print(f"  host RSS over the cycles, {rss_rows[0]['count']} communicators "
              f"(per 100 cycles: least squares over the second half / first to last; goal <= 1 MiB)")
        for r in rss_rows:
            print(f"  rank {r['rank']} {r['method']:<8} {r['cycles']:>5} cycles in {r['seconds']:>6.1f} s: "
                  f"{r['per_100_slope'] / 2**20:>+8.2f} / {r['per_100_average'] / 2**20:>+8.2f} MiB per 100 cycles; "
                  f"{(r['rss_last'] - r['rss_first']) / 2**20:+.1f} MiB in all; identical {r['identical']}")
    return results


ORDER = ["auto0", "suspend", "recreate", "recreate_inturn", "recreate_notrim", "auto", "naive", "naive_group"]
DEFAULT_METHODS = "auto:100,recreate:3"
STRATEGY_METHODS = "auto0:2,suspend:2,recreate:2,auto:2,naive:1"


def bytes_of(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=1,
                        help="XLA's communicators: 1 = every process on GPU 0 (socket transport); N >= the "
                             "processes = one GPU each (NVLink P2P buffers, the layout of a real node)")
    parser.add_argument("--communicators", type=int, default=0,
                        help="instead: this many communicators of our own between two processes")
    parser.add_argument("--timeout", type=float, default=300, help="seconds before the workers are killed")
    parser.add_argument("--scale", default="", help="instead: this many communicators of our own, or a size "
                        "(10.5G: as many as hold that much device memory)")
    parser.add_argument("--use", type=int, default=0, help="--scale: only the first USE run collectives")
    parser.add_argument("--buffsize", default="64M", help="--scale: NCCL_BUFFSIZE (bytes, or 4M, 64M, ...)")
    parser.add_argument("--channels", type=int, default=16, help="--scale: NCCL_MIN/MAX_NCHANNELS (0: NCCL's)")
    parser.add_argument("--methods", default=DEFAULT_METHODS,
                        help=f"--scale: METHOD:CYCLES,... (--strategies: default {STRATEGY_METHODS})")
    parser.add_argument("--strategies", default="", help="instead: every strategy on the first N,M,... "
                        "communicators of our own (e.g. 4,8,32)")
    parser.add_argument("--rss", type=int, default=0, help="--strategies: then this many communicators "
                        "cycled by each of --rss-methods, host RSS read after every cycle")
    parser.add_argument("--rss-methods", default="naive:500,naive_group:300,recreate:500,suspend:500,auto:500,"
                                                 "recreate_inturn:200,recreate_notrim:200",
                        help="--strategies --rss: METHOD:CYCLES,...")
    parser.add_argument("--rss-seconds", type=float, default=0.0,
                        help="--strategies --rss: each method stops after this many seconds of cycles and reports "
                             "the cycles it ran (0: all of them; keep it inside --timeout)")
    parser.add_argument("--naive", action="store_true", help="--scale: the naive rebuild too")
    parser.add_argument("--probe", action="store_true", help="--scale: first all-reduce and destroys timed")
    parser.add_argument("--json", help="--scale, --strategies: write every RESULT line here")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    import jax_amem

    if not jax_amem.gpu_status().usable or not jax_amem.nccl.is_installed():
        print(f"nccl_pause: skipped ({jax_amem.gpu_status().why_not() or jax_amem.nccl.status()})")
        return []
    if args.strategies:
        return strategies(args)
    if args.scale:
        return scale(args)
    if args.communicators:
        return own_communicators(args.communicators, args.timeout)
    if args.gpus > 1 and max(args.processes) > args.gpus:
        raise SystemExit(f"nccl_pause: --gpus {args.gpus} gives each process a GPU of its own; "
                         f"--processes {max(args.processes)} needs that many")
    return [xla_program(p, args.cycles, args.timeout, args.gpus) for p in args.processes]


if __name__ == "__main__":
    main()
