"""One of 2 or 4 JAX processes on one GPU (one NCCL_HOSTID each) pausing XLA's own communicators.

Two processes: a 1-D mesh ("x"), a jitted sum over it. Four processes: a 2x2 mesh ("x", "y")
and jitted sums over x, over y and over both, so XLA creates three communicators per
process. Every cycle pauses with `jax_amem.nccl.pause(strategy)`, resumes, runs the steps
and compares them bit for bit with the unpaused results. Prints RESULT lines (JSON).

usage: python -P xla_mesh_worker.py RANK PORT NPROC CYCLES STRATEGY [options]
  --split             also a root communicator of our own (ncclCommInitRankConfig, splitShare=1)
                      and a split of it, made through the interposer: the case NCCL refuses
                      to suspend (auto must recreate those two, and say why)
  --keep-suspendable  jax_amem.nccl.keep_suspendable() before the first collective
  --probe-guard       run the steps while paused: XLA must raise the project's message
  --stall             the last process never joins a pause: the others time out, nothing changes
  --break             process 0 pauses alone without agreement (agree=False): its communicators
                      break; every process then calls recover()
  --baselines         recreate-parallel on XLA's communicators, and the naive destroy +
                      sequential init on communicators of the same shapes, in the same run
"""

import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -P` does not add the script's folder

import jax_amem  # first: puts the NCCL interposer in front

if "--keep-suspendable" in sys.argv:
    jax_amem.nccl.keep_suspendable()  # before the first collective

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from own_comms import OwnComms  # noqa: E402

WIDTH = 1 << 18


def emit(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def used_by_this_process():
    """(device bytes this process holds, where the figure comes from): NVML per process when
    it can see us, else a device-wide figure that every process on the GPU moves."""
    from jax_amem.memory import nvml
    try:
        return nvml.process_used(jax.local_devices()[0].local_hardware_id)
    except Exception:  # noqa: BLE001 - the CPU dry run: no driver
        return 0, "none"


def percentile(values, q):
    return float(np.percentile(np.asarray(values), q)) if values else -1.0


def make_steps(nproc: int, rank: int):
    """The jitted steps and their input; run() returns each step's local result."""
    if nproc == 2:
        mesh = jax.make_mesh((2,), ("x",))
        local = np.random.default_rng(rank).standard_normal((1, WIDTH)).astype(np.float32)
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), local, (2, WIDTH))
        steps = [jax.jit(lambda a: jnp.sum(a * 1.5, axis=0), out_shardings=NamedSharding(mesh, P()))]
    else:
        mesh = jax.make_mesh((2, 2), ("x", "y"))
        local = np.random.default_rng(rank).standard_normal((1, 1, WIDTH)).astype(np.float32)
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x", "y")), local,
                                                   (2, 2, WIDTH))
        steps = [jax.jit(lambda a: jnp.sum(a * 1.5, axis=0), out_shardings=NamedSharding(mesh, P("y"))),
                 jax.jit(lambda a: jnp.sum(a * 1.5, axis=1), out_shardings=NamedSharding(mesh, P("x"))),
                 jax.jit(lambda a: jnp.sum(a * 1.5, axis=(0, 1)), out_shardings=NamedSharding(mesh, P()))]

    def run():
        return [np.asarray(step(x).addressable_data(0)) for step in steps]
    return run


def same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def attempt(call):
    try:
        call()
    except Exception as error:  # noqa: BLE001 - reported
        return [type(error).__name__, str(error)[:3000]]
    return None


def rows():
    return [c.__dict__ for c in jax_amem.nccl.communicators()]


# Where a cycle's time goes (NcclReport): the agreements over the store, NCCL's own part.
SPLIT = ("pause_agree", "pause_nccl", "resume_agree", "resume_nccl")


def cycles_phase(run, reference, cycles, strategy, free):
    timings, first, samples = [], None, []
    split = {name: [] for name in SPLIT}
    every = max(1, cycles // 10)
    identical = True
    for cycle in range(cycles):
        t0 = time.perf_counter()
        report = jax_amem.nccl.pause(strategy)
        t1 = time.perf_counter()
        restored = jax_amem.nccl.resume()
        t2 = time.perf_counter()
        timings.append((t1 - t0, t2 - t1))
        for name, seconds in zip(SPLIT, (report.agree_seconds, report.seconds,
                                         restored.agree_seconds, restored.seconds)):
            split[name].append(seconds)
        if first is None:
            first = [c.__dict__ for c in report.communicators]
        if cycle % every == 0 or cycle == cycles - 1:
            used, source = used_by_this_process()
            samples.append({"cycle": cycle, "free": free(), "used": used, "source": source,
                            "rss": rss_bytes()})
        if not same(run(), reference):
            identical = False
            break
    pauses, resumes = [t[0] for t in timings], [t[1] for t in timings]
    totals = [p + r for p, r in timings]
    return {"cycles": len(timings), "identical": identical, "first_report": first, "samples": samples,
            "pause_p50": percentile(pauses, 50), "pause_p99": percentile(pauses, 99),
            "resume_p50": percentile(resumes, 50), "resume_p99": percentile(resumes, 99),
            "total_p50": percentile(totals, 50), "total_p99": percentile(totals, 99),
            "split": {name: [percentile(v, 50), percentile(v, 99)] for name, v in split.items()}}


def baselines(run, reference, store, rank, own, repeats=3):
    """recreate-parallel on XLA's communicators; naive destroy + sequential init on mirrors."""
    recreate = []
    owner = "xla" if jax_amem.nccl.communicators(owner="xla") else None  # None: the CPU dry run
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax_amem.nccl.pause("recreate", owner=owner, teardown="parallel")
        t1 = time.perf_counter()
        jax_amem.nccl.resume()
        recreate.append((t1 - t0, time.perf_counter() - t1))
    ok = same(run(), reference)
    # Mirrors: one communicator of our own per XLA communicator, with the same ranks.
    mine = {c.key: (c.rank, c.nranks) for c in jax_amem.nccl.communicators(owner="xla")}
    if owner is None:  # the CPU dry run: the fake NCCL cannot initialise across processes
        mine = {}
    store.key_value_set(f"mirror/keys/{rank}", json.dumps(sorted(mine)))
    store.wait_at_barrier("mirror_keys", 60_000)
    nproc = jax.process_count()
    keys = sorted({k for p in range(nproc)
                   for k in json.loads(store.blocking_key_value_get(f"mirror/keys/{p}", 60_000))})
    generation = [0]

    def init_all():
        generation[0] += 1
        return {key: own.init(f"mirror/{generation[0]}/{key}", mine[key][1], mine[key][0])
                for key in keys if key in mine}

    mirrors = init_all()
    naive = []
    for _ in range(repeats):
        store.wait_at_barrier(f"naive_{generation[0]}", 60_000)
        t0 = time.perf_counter()
        for key in sorted(mirrors):
            own.destroy(mirrors[key])
        t1 = time.perf_counter()
        mirrors = init_all()  # one after another, each with a fresh id through the store
        naive.append((t1 - t0, time.perf_counter() - t1))
    for comm in mirrors.values():
        own.destroy(comm)
    median = lambda pairs, i: float(np.median([p[i] for p in pairs]))  # noqa: E731
    return {"recreate_parallel": {"pause": median(recreate, 0), "resume": median(recreate, 1)},
            "naive": {"pause": median(naive, 0), "resume": median(naive, 1)},
            "identical_after_recreate": ok}


def main():
    rank, port, nproc, cycles, strategy = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]),
                                           int(sys.argv[4]), sys.argv[5])
    flags = set(sys.argv[6:])
    local = int(os.environ.get("WORKER_LOCAL_DEVICE", "0"))
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                               process_id=rank, local_device_ids=[local])
    from jax._src import distributed
    store = distributed.global_state.client
    emit(phase="start", rank=rank, interposer=jax_amem.nccl.is_installed(),
         status=jax_amem.nccl.status(), nccl_version=jax_amem.nccl.nccl_version(),
         can_suspend=jax_amem.nccl.can_suspend())
    run = make_steps(nproc, rank)
    reference = run()
    device = jax.local_devices()[0].local_hardware_id

    def free() -> int:  # 0 on the CPU dry run (no driver)
        return jax_amem._core.cuda.mem_get_info(device)[0] if jax_amem.gpu_status().usable else 0

    own = OwnComms(store, rank)
    if jax.default_backend() == "cpu":
        # A dry run against the fake NCCL (CPU machine): XLA makes no NCCL communicator
        # there, so a one-rank communicator of our own stands in for pause to act on.
        stand_in = own.init(f"cpu_stand_in_{rank}", 1, 0, split_share=1)  # noqa: F841
    if "--split" in flags:
        root = own.init("split_root", nproc, rank, split_share=1)
        before = free()
        child, split_seconds = own.split(root, rank % 2, rank)
        emit(phase="split", rank=rank, split_seconds=split_seconds, split_device_bytes=before - free(),
             keep_suspendable=jax_amem.nccl._api._control.keep_suspendable())
        if jax_amem.nccl.can_suspend() and not jax_amem.nccl._api._control.keep_suspendable():
            refused = attempt(lambda: jax_amem.nccl.pause("suspend"))
            emit(phase="refused", rank=rank, error=refused,
                 states=sorted({c["state"] for c in rows()}))
    emit(phase="created", rank=rank, communicators=rows())

    result = cycles_phase(run, reference, cycles, strategy, free)
    emit(phase="cycles", rank=rank, **result, communicators=rows())

    if "--baselines" in flags:
        emit(phase="baselines", rank=rank, **baselines(run, reference, store, rank, own))

    if "--probe-guard" in flags:
        jax_amem.nccl.pause(strategy)
        error = attempt(run)
        refused_calls = sum(c["refused_calls"] for c in rows())
        jax_amem.nccl.resume()
        emit(phase="guard", rank=rank, error=error, refused_calls=refused_calls,
             identical_after=same(run(), reference))

    if "--break" in flags:  # process 0 pauses alone, without agreement: its communicators break
        if rank == 0:
            error = attempt(lambda: jax_amem.nccl.pause("recreate", agree=False, timeout=5))
            states = sorted({c["state"] for c in rows()})
            use = attempt(run)
        else:
            error = use = None
            states = sorted({c["state"] for c in rows()})
        store.wait_at_barrier("broken", 120_000)
        recovered = [c.state for c in jax_amem.nccl.recover(timeout=60)]
        emit(phase="break", rank=rank, error=error, states=states, use=use, recovered=recovered,
             identical_after=same(run(), reference))

    if "--stall" in flags:  # last: the agreement numbers differ afterwards
        if rank != nproc - 1:
            start = time.perf_counter()
            error = attempt(lambda: jax_amem.nccl.pause("auto", timeout=5))
            seconds = time.perf_counter() - start
        else:
            error, seconds = None, 0.0
        store.wait_at_barrier("after_stall", 120_000)
        emit(phase="stall", rank=rank, error=error, seconds=seconds,
             states=sorted({c["state"] for c in rows()}), identical_after=same(run(), reference))

    jax.distributed.shutdown()
    emit(phase="done", rank=rank)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -P leaves it out
    from exit_on_error import run_main
    run_main(main)
