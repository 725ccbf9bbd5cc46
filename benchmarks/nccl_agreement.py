"""The agreement before an NCCL pause / resume, timed alone, against the store's own floor.

    python -P benchmarks/nccl_agreement.py [--processes 2 4 8] [--rounds 200]

`jax_amem.nccl.pause()` and `resume()` first agree over the jax.distributed key-value store
(jax_amem/nccl/_agree.py); no GPU and no NCCL take part in that, so this runs N real
jax.distributed processes on CPU, on this machine. Each round, every process makes
  - the pause agreement: publish a plan (three communicators, as XLA's in the four-process
    program) and read everyone's, merged as pause() merges them;
  - the resume agreement;
  - the floor, in the same round: one bare key_value_set + blocking_key_value_get of the key
    just set (one store round trip each), and one wait_at_barrier of the same N processes.
Figures: the slowest process's p50 / p99 over the rounds (after 20 warm-up rounds). Ratio:
figure over the floor of the operations it cannot do without: a barrier (every process must
be there) for both, plus one set+get round trip for pause (it carries plans).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from nccl_support.harness import run_job  # noqa: E402

WARMUP = 20

ROUNDS = """
    import time
    from jax_amem.nccl import _agree

    peers = _agree.peers()
    plan = [{"id": i + 1, "key": f"xla/{i}/" + "0" * 40, "rank": PROCESS, "strategy": "suspend",
             "refused": False, "why": "ncclCommSuspend accepts it"} for i in range(3)]
    floor_key = f"jax_amem_bench/floor/{PROCESS}"
    times = {"pause": [], "resume": [], "set_get": [], "barrier": []}
    for r in range(WARMUP + ROUNDS):
        t0 = time.perf_counter()
        everyone = peers.exchange("pause", {"plan": plan}, 60)
        _agree.merge_plans(plan, everyone)
        t1 = time.perf_counter()
        peers.meet("resume", 60)
        t2 = time.perf_counter()
        job.key_value_set(floor_key, str(r), allow_overwrite=True)
        job.blocking_key_value_get(floor_key, 60_000)
        t3 = time.perf_counter()
        job.wait_at_barrier("jax_amem_bench_floor", 60_000)
        t4 = time.perf_counter()
        if r >= WARMUP:
            for name, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                times[name].append(seconds)
    out(times=times)
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def measure(processes: int, rounds: int, timeout: float) -> dict:
    body = f"WARMUP, ROUNDS = {WARMUP}, {rounds}\n" + textwrap.dedent(ROUNDS)
    seen = run_job(None, body, processes=processes, timeout=timeout)
    figures = {}
    for name in ("pause", "resume", "set_get", "barrier"):
        per_process = [result["times"][name] for result in seen]
        figures[name] = (max(percentile(t, 50) for t in per_process) * 1e3,
                         max(percentile(t, 99) for t in per_process) * 1e3)
    return figures


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=600, help="seconds before the processes are killed")
    args = parser.parse_args(argv)
    print(f"NCCL agreement over the jax.distributed store, CPU processes on this machine, "
          f"{args.rounds} rounds; slowest process's p50 / p99 in ms")
    print(f"{'N':>3} {'figure':<20} {'p50':>7} {'p99':>7} {'floor':<22} {'p50':>7} {'p99':>7} {'ratio':>6}")
    rows = []
    for n in args.processes:
        f = measure(n, args.rounds, args.timeout)
        set_get, barrier = f["set_get"], f["barrier"]
        floors = {"pause": ("set+get + barrier", (set_get[0] + barrier[0], set_get[1] + barrier[1])),
                  "resume": ("barrier", barrier)}
        for name in ("pause", "resume"):
            floor_name, floor = floors[name]
            value = f[name]
            print(f"{n:>3} {name + ' agreement':<20} {value[0]:>7.2f} {value[1]:>7.2f} {floor_name:<22} "
                  f"{floor[0]:>7.2f} {floor[1]:>7.2f} {value[0] / floor[0]:>5.2f}x")
        print(f"{'':>3} {'(floor parts)':<20} {'':>7} {'':>7} {'set+get':<22} {set_get[0]:>7.2f} "
              f"{set_get[1]:>7.2f}")
        print(f"{'':>3} {'':<20} {'':>7} {'':>7} {'barrier':<22} {barrier[0]:>7.2f} {barrier[1]:>7.2f}")
        rows.append({"processes": n, **f})
    return rows


if __name__ == "__main__":
    main()
