"""One of two processes comparing every pause strategy on the same communicators, and their host RSS.

usage: python -P nccl_strategies_worker.py RANK PORT COUNTS SIZE_METHODS [RSS_COUNT RSS_METHODS [RSS_SECONDS]]
  COUNTS        e.g. 4,8,32: the first N communicators of our own (2 ranks; NCCL_BUFFSIZE and
                NCCL_MIN/MAX_NCHANNELS, set by the caller, size them), each used by an all-reduce first
  SIZE_METHODS  METHOD:CYCLES,... (or "" for none) run on each count in this order; METHOD is suspend, recreate,
                recreate_inturn (recreate, teardown="destroy": no threads), recreate_notrim
                (recreate with JAX_AMEM_NCCL_TRIM=0: free host memory left to glibc), naive (destroy each in
                turn, initialise each in turn with fresh ids), naive_group (the same, initialised in one
                NCCL group: NCCL's own part of recreate, without jax-amem), auto (on the rates measured so far
                in this process) or auto0 (auto after cost_rates(reset=True): its starting rates). Methods NCCL lacks (suspend before 2.29.7) are skipped.
  RSS_COUNT     communicators for the long cycles (the first ones)
  RSS_METHODS   METHOD:CYCLES,...: host RSS read after every cycle
  RSS_SECONDS   each RSS method stops after this many seconds of cycles, at the same cycle on both
                ranks (rank 0 decides, through the coordinator's key-value store), and reports the
                cycles it ran (0 or absent: every cycle asked)

Each cycle: barrier, pause(METHOD, ids=the count's), resume(), the same all-reduce on each of those
communicators (a recreated one connects again here), checked bit for bit against the first. Prints
RESULT lines (JSON): phase "sizes" per (count, method), phase "rss" per method.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -P leaves it out

import jax_amem  # first: puts the NCCL interposer in front
import jax
import numpy as np

from nccl_scale_worker import Job, emit, percentile, rss  # noqa: E402


def new_ids(seen: set) -> list:
    """Ids of the communicators tracked since the last call, in creation order."""
    fresh = sorted(c.id for c in jax_amem.nccl.communicators() if c.id not in seen)
    seen.update(fresh)
    return fresh


def naive_cycle(job: Job, handles: list, ids: list, seen: set, count: int, tag: str,
                grouped: bool = False) -> tuple:
    """Destroy the first `count` in turn, initialise them again in turn (`grouped`: in one NCCL
    group): (pause, resume) seconds."""
    t0 = time.perf_counter()
    for handle in handles[:count]:
        assert job.lib.ncclCommDestroy(handle) == 0
    t1 = time.perf_counter()
    job.barrier(f"{tag}/destroyed")
    t2 = time.perf_counter()
    fresh = job.init(count, grouped)
    t3 = time.perf_counter()
    handles[:count] = fresh
    ids[:count] = new_ids(seen)
    return t1 - t0, t3 - t2


def go_on(job: Job, tag: str, begun: float, budget_s: float) -> bool:
    """Whether both ranks run the cycle `tag`: rank 0 says, by the time spent since `begun`, and
    rank 1 reads its word (a rank stopping alone would leave the other at the next barrier)."""
    key = f"strategies/{tag}/go"
    if job.rank == 0:
        go = time.perf_counter() - begun < budget_s
        job.store.key_value_set(key, "1" if go else "0")
        return go
    word = job.store.blocking_key_value_get(key, 300_000)
    job.store.key_value_delete(key)   # the coordinator keeps nothing per cycle
    return word == "1"


def run_method(job: Job, handles, ids, seen, reference, count: int, method: str, cycles: int,
               tag: str, sample_rss: bool, budget_s: float = 0.0) -> dict:
    pauses, resumes, firsts, rss_samples = [], [], [], []
    begun = time.perf_counter()
    chosen, why, identical, freed = {}, "", True, 0
    if method == "auto0":
        jax_amem.nccl.cost_rates(reset=True)
    if method == "recreate_notrim":
        os.environ["JAX_AMEM_NCCL_TRIM"] = "0"  # read by the interposer at each pause and resume
    rates_before = jax_amem.nccl.cost_rates()
    for cycle in range(cycles):
        if budget_s > 0 and not go_on(job, f"{tag}/{cycle}", begun, budget_s):
            break
        job.barrier(f"{tag}/{cycle}")
        if method in ("naive", "naive_group"):
            pause_s, resume_s = naive_cycle(job, handles, ids, seen, count, f"{tag}/{cycle}", method == "naive_group")
        else:
            t0 = time.perf_counter()
            strategy = {"auto0": "auto", "recreate_inturn": "recreate", "recreate_notrim": "recreate"}.get(method, method)
            teardown = "destroy" if method == "recreate_inturn" else "parallel"
            report = jax_amem.nccl.pause(strategy, ids=ids[:count], teardown=teardown)
            t1 = time.perf_counter()
            jax_amem.nccl.resume()
            t2 = time.perf_counter()
            pause_s, resume_s = t1 - t0, t2 - t1
            if cycle == 0:
                for c in report.communicators:
                    chosen[c.last_strategy] = chosen.get(c.last_strategy, 0) + 1
                why = report.communicators[0].why if report.communicators else ""
                freed = sum(max(c.bytes_freed, 0) for c in report.communicators)
        t3 = time.perf_counter()
        results = job.all_reduce(handles[:count])
        firsts.append(time.perf_counter() - t3)
        pauses.append(pause_s)
        resumes.append(resume_s)
        if results != reference[:count]:
            identical = False
            break
        if sample_rss:
            rss_samples.append(rss())
    os.environ.pop("JAX_AMEM_NCCL_TRIM", None)
    totals = [p + r for p, r in zip(pauses, resumes)]
    return {"count": count, "method": method, "cycles": len(totals), "identical": identical,
            "pause_p50": percentile(pauses, 50), "resume_p50": percentile(resumes, 50),
            "total_p50": percentile(totals, 50), "total_min": min(totals), "total_max": max(totals),
            "first_collective_p50": percentile(firsts, 50), "strategies": chosen, "why": why,
            "freed": freed, "rates_before": rates_before, "rss": rss_samples,
            "seconds": sum(totals) + sum(firsts)}


def growth_per_100(samples: list) -> tuple[float, float]:
    """(least-squares slope over the second half, first-to-last) in bytes per 100 cycles."""
    if len(samples) < 4:
        return 0.0, 0.0
    half = samples[len(samples) // 2:]
    slope = float(np.polyfit(np.arange(len(half)), np.asarray(half, dtype=float), 1)[0])
    return slope * 100, (samples[-1] - samples[0]) * 100 / (len(samples) - 1)


def specs(text: str) -> list:
    return [(m.split(":")[0], int(m.split(":")[1])) for m in text.split(",") if m]


def main():
    rank, port = int(sys.argv[1]), sys.argv[2]
    counts = [int(c) for c in sys.argv[3].split(",")]
    size_methods = specs(sys.argv[4])
    rss_count = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    rss_methods = specs(sys.argv[6]) if len(sys.argv) > 6 else []
    rss_seconds = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=rank, local_device_ids=[0])
    from jax._src import distributed
    job = Job(rank, distributed.global_state.client, jax.local_devices()[0].local_hardware_id)
    can_suspend = jax_amem.nccl.can_suspend()
    emit(phase="start", rank=rank, nccl_version=jax_amem.nccl.nccl_version(), can_suspend=can_suspend,
         env={k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "JAX_AMEM_NCCL"))})
    seen: set = set()
    new_ids(seen)
    total = max(counts + [rss_count])
    t0 = time.perf_counter()
    handles = job.init(total)
    ids = new_ids(seen)
    reference = job.all_reduce(handles)
    emit(phase="setup", rank=rank, count=total, init_connect_s=time.perf_counter() - t0,
         memstats=job.memstats(handles[:1]), device_used=job.used(), rss=rss())
    for count in counts:
        for method, cycles in size_methods:
            if method == "suspend" and not can_suspend:
                continue
            row = run_method(job, handles, ids, seen, reference, count, method, cycles,
                             f"sizes/{count}/{method}", False)
            row.pop("rss")
            emit(phase="sizes", rank=rank, **row)
    for method, cycles in rss_methods:
        if method == "suspend" and not can_suspend:
            continue
        row = run_method(job, handles, ids, seen, reference, rss_count, method, cycles, f"rss/{method}", True,
                         rss_seconds)
        slope, average = growth_per_100(row["rss"])
        emit(phase="rss", rank=rank, method=method, count=rss_count, cycles=row["cycles"],
             identical=row["identical"], strategies=row["strategies"], per_100_slope=slope,
             per_100_average=average, rss_first=row["rss"][0] if row["rss"] else 0,
             rss_last=row["rss"][-1] if row["rss"] else 0, seconds=row["seconds"],
             total_p50=row["total_p50"])
    job.barrier("end")
    emit(phase="done", rank=rank)


if __name__ == "__main__":
    from exit_on_error import run_main
    run_main(main)
