"""One of two processes holding COUNT NCCL communicators of their own, paused and resumed at scale.

NCCL_BUFFSIZE / NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS (set by the caller) size the
communicators' buffers. Every communicator runs an all-reduce first, so its connections and
their buffers exist, as a communicator a training step has used. Then, per method, CYCLES
cycles of `jax_amem.nccl.pause(method)` + `resume()`, each checked bit for bit (the same
all-reduce on every communicator), with NCCL's count (ncclCommMemStats, per communicator),
this process's device memory (NVML per process) and host RSS around the pause; then the naive
rebuild (destroy each communicator in turn, initialise each in turn with a fresh id through
the key-value store) with the same readings. Prints RESULT lines (JSON).

usage: python -P nccl_scale_worker.py RANK PORT COUNT METHOD:CYCLES[,METHOD:CYCLES...] [--naive]
       [--probe] [--use K]
  COUNT     communicators, or a size (e.g. 10.5G): communicators are made 8 at a time until
            NCCL's device memory in this process (NVML) reaches it
  METHOD    a pause strategy (auto, suspend, recreate); METHOD@MODE runs it with
            JAX_AMEM_NCCL_OVERLAP=MODE (threads, group, serial)
  --naive   the naive rebuild after the methods
  --probe   on two fresh communicators: the first all-reduce (NCCL connects) and destroys, timed
  --use K   only the first K communicators run the all-reduce (each connection pins NCCL_BUFFSIZE
            of host memory per channel and direction on the socket transport)
"""

import ctypes
import json
import os
import resource
import sys
import time

import jax_amem  # first: puts the NCCL interposer in front
import jax
import numpy as np

FLOAT32, SUM = 7, 0  # ncclFloat32, ncclSum
ELEMENTS = 1 << 22   # 16 MiB per all-reduce: the SIMPLE protocol's path, as a training step's


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def emit(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def percentile(values, q):
    return float(np.percentile(np.asarray(values), q)) if values else -1.0


class Job:
    def __init__(self, rank: int, store, device: int):
        import cupy

        self.cp, self.rank, self.store, self.device = cupy, rank, store, device
        lib = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD)
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId,
                                         ctypes.c_int]
        lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
        lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        self.lib, self.generation = lib, 0
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream.use()  # cupy's own work (fill, copies back) on NCCL's stream: ordered with it
        self.send = cupy.arange(ELEMENTS, dtype=cupy.float32) * (rank + 1) / 7.0
        self.recv = cupy.empty_like(self.send)

    def ids(self, count: int) -> list:
        """Rank 0 makes `count` ids; one store key carries them all to rank 1."""
        self.generation += 1
        key = f"scale/ids/{self.generation}"
        made = [UniqueId() for _ in range(count)]
        if self.rank == 0:
            for uid in made:
                assert self.lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
            self.store.key_value_set_bytes(key, b"".join(bytes(uid) for uid in made))
        else:
            data = self.store.blocking_key_value_get_bytes(key, 120_000)
            for i, uid in enumerate(made):
                ctypes.memmove(ctypes.byref(uid), data[i * 128:(i + 1) * 128], 128)
        return made

    def init(self, count: int, grouped: bool = False) -> list:
        """One after another, as a program that makes its communicators does; `grouped`: all in
        one NCCL group (ncclGroupStart/End), as jax-amem's recreate initialises them again."""
        comms = []
        if grouped:
            assert self.lib.ncclGroupStart() == 0
        for uid in self.ids(count):
            comm = ctypes.c_void_p()
            assert self.lib.ncclCommInitRank(ctypes.byref(comm), 2, uid, self.rank) == 0
            comms.append(comm)
        if grouped:
            assert self.lib.ncclGroupEnd() == 0
        return comms

    def all_reduce(self, comms) -> list:
        """The same all-reduce on every communicator; each result's bytes (hashable)."""
        out = []
        for comm in comms:
            self.recv.fill(0)
            code = self.lib.ncclAllReduce(self.send.data.ptr, self.recv.data.ptr, ELEMENTS, FLOAT32, SUM,
                                          comm, self.stream.ptr)
            assert code == 0, f"ncclAllReduce returned {code}"
            self.stream.synchronize()
            out.append(hash(self.cp.asnumpy(self.recv).tobytes()))
        return out

    def memstats(self, comms) -> dict:
        """NCCL's own count over the communicators (ncclCommMemStats; empty before NCCL 2.29.7)."""
        if not hasattr(self.lib, "ncclCommMemStats") or not jax_amem.nccl.can_suspend():
            return {}
        total = {}
        for name, stat in (("suspendable", 0), ("persistent", 2), ("total", 3)):
            value = ctypes.c_uint64()
            total[name] = 0
            for comm in comms:
                if self.lib.ncclCommMemStats(comm, stat, ctypes.byref(value)) == 0:
                    total[name] += value.value
        return total

    def used(self) -> int:
        from jax_amem.memory import nvml
        return nvml.process_used(self.device)[0]

    def barrier(self, name: str) -> None:
        self.store.wait_at_barrier(f"scale/{name}", 300_000)


def cycles(job: Job, comms, used, reference, spec: str, count: int) -> dict:
    method, _, mode = spec.partition("@")
    if mode:
        os.environ["JAX_AMEM_NCCL_OVERLAP"] = mode  # read by the interposer at each call
    pauses, resumes, firsts, agree, nccl_part = [], [], [], [], []
    samples, identical, report_rows = [], True, None
    nccl_freed = driver_freed = 0
    every = max(1, count // 10)
    for cycle in range(count):
        job.barrier(f"{spec}/{cycle}")
        used_before = job.used()
        t0 = time.perf_counter()
        report = jax_amem.nccl.pause(method)
        t1 = time.perf_counter()
        used_paused = job.used()
        t2 = time.perf_counter()
        restored = jax_amem.nccl.resume()
        t3 = time.perf_counter()
        results = job.all_reduce(used)  # the first collective after resume: a recreated
        t4 = time.perf_counter()         # communicator connects again here
        pauses.append(t1 - t0)
        resumes.append(t3 - t2)
        firsts.append(t4 - t3)
        agree.append(report.agree_seconds + restored.agree_seconds)
        nccl_part.append(report.seconds + restored.seconds)
        if report_rows is None:
            report_rows = [c.__dict__ for c in report.communicators]
            nccl_freed = sum(max(c.bytes_freed, 0) for c in report.communicators)
            driver_freed = used_before - used_paused
        if results != reference:
            identical = False
            break
        if cycle % every == 0 or cycle == count - 1:
            samples.append({"cycle": cycle, "used": job.used(), "rss": rss()})
    os.environ.pop("JAX_AMEM_NCCL_OVERLAP", None)
    totals = [p + r for p, r in zip(pauses, resumes)]
    return {"method": spec, "cycles": len(pauses), "identical": identical,
            "pause_p50": percentile(pauses, 50), "resume_p50": percentile(resumes, 50),
            "total_p50": percentile(totals, 50), "total_p99": percentile(totals, 99),
            "pause_first": pauses[0], "resume_first": resumes[0],
            "first_collective_p50": percentile(firsts, 50), "agree_p50": percentile(agree, 50),
            "nccl_p50": percentile(nccl_part, 50), "nccl_freed": nccl_freed,
            "driver_freed": driver_freed, "samples": samples, "rows": report_rows[:2],
            "teardown_max": max((r["teardown_seconds"] for r in report_rows), default=0.0)}


def naive(job: Job, comms, use: int, reference) -> tuple[list, dict]:
    job.barrier("naive")
    used_before = job.used()
    t0 = time.perf_counter()
    for comm in comms:
        assert job.lib.ncclCommDestroy(comm) == 0
    t1 = time.perf_counter()
    used_destroyed = job.used()
    job.barrier("naive-destroyed")
    t2 = time.perf_counter()
    comms = job.init(len(comms))
    t3 = time.perf_counter()
    identical = job.all_reduce(comms[:use]) == reference
    t4 = time.perf_counter()
    return comms, {"method": "naive", "pause_p50": t1 - t0, "resume_p50": t3 - t2,
                   "total_p50": (t1 - t0) + (t3 - t2), "first_collective_p50": t4 - t3,
                   "driver_freed": used_before - used_destroyed, "identical": identical}


def probe(job: Job) -> dict:
    """Two fresh communicators: what their first all-reduce (connection) and a destroy cost."""
    out = {}
    job.barrier("probe")
    used0, rss0 = job.used(), rss()
    t0 = time.perf_counter()
    comms = job.init(2)
    out["init_2_s"] = time.perf_counter() - t0
    used1, rss1 = job.used(), rss()
    t0 = time.perf_counter()
    job.all_reduce(comms[:1])
    out["first_all_reduce_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    job.all_reduce(comms[:1])
    out["second_all_reduce_s"] = time.perf_counter() - t0
    used2, rss2 = job.used(), rss()
    out.update(init_device=used1 - used0, init_rss=rss1 - rss0, connect_device=used2 - used1,
               connect_rss=rss2 - rss1)
    job.barrier("probe-destroy")
    t0 = time.perf_counter()
    assert job.lib.ncclCommDestroy(comms[0]) == 0  # used (connected)
    out["destroy_used_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert job.lib.ncclCommDestroy(comms[1]) == 0  # never used
    out["destroy_unused_s"] = time.perf_counter() - t0
    out["destroyed_device"] = used2 - job.used()
    return out


def flag_value(argv, name, default):
    return argv[argv.index(name) + 1] if name in argv else default


def make(job: Job, count: str) -> list:
    """COUNT communicators, or (a size such as 10.5G) 8 at a time until this process's device
    memory has grown by that much; rank 0 decides when, so both make the same number."""
    if count[-1].upper() not in "KMG":
        return job.init(int(count))
    target = float(count[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[count[-1].upper()]
    start, comms = job.used(), []
    while len(comms) < 256:
        comms += job.init(8)
        key = f"scale/more/{len(comms)}"
        if job.rank == 0:
            job.store.key_value_set(key, "1" if job.used() - start < target else "0")
        if job.store.blocking_key_value_get(key, 120_000) == "0":
            break
    return comms


def main():
    rank, port = int(sys.argv[1]), sys.argv[2]
    methods = [(m.split(":")[0], int(m.split(":")[1])) for m in sys.argv[4].split(",") if m]
    flags = set(sys.argv[5:])
    flags.discard(flag_value(sys.argv, "--use", None))
    local = int(os.environ.get("WORKER_LOCAL_DEVICE", "0"))
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=rank, local_device_ids=[local])
    from jax._src import distributed
    store = distributed.global_state.client
    device = jax.local_devices()[0].local_hardware_id
    job = Job(rank, store, device)
    emit(phase="start", rank=rank, nccl_version=jax_amem.nccl.nccl_version(),
         can_suspend=jax_amem.nccl.can_suspend(),
         env={k: v for k, v in os.environ.items() if k.startswith("NCCL_")})
    if "--probe" in flags:
        emit(phase="probe", rank=rank, **probe(job))
    used0, rss0 = job.used(), rss()
    t0 = time.perf_counter()
    comms = make(job, sys.argv[3])
    init_s = time.perf_counter() - t0
    used1, rss1 = job.used(), rss()
    use = int(flag_value(sys.argv, "--use", len(comms)))
    t0 = time.perf_counter()
    reference = job.all_reduce(comms[:use])
    connect_s = time.perf_counter() - t0
    used2, rss2 = job.used(), rss()
    stats = job.memstats(comms)
    emit(phase="setup", rank=rank, count=len(comms), used_for_collectives=use, init_s=init_s,
         connect_s=connect_s, init_device=used1 - used0, connect_device=used2 - used1,
         init_rss=rss1 - rss0, connect_rss=rss2 - rss1, device_used=used2, memstats=stats)
    rows = []
    for method, n in methods:
        try:
            rows.append(cycles(job, comms, comms[:use], reference, method, n))
        except Exception as error:  # reported, then the process ends (run_pair stops its peer)
            emit(phase="method", rank=rank, method=method,
                 error=f"{type(error).__name__}: {str(error)[:2000]}")
            raise
        emit(phase="method", rank=rank, **rows[-1])
    if "--naive" in flags:
        comms, row = naive(job, comms, use, reference)
        emit(phase="method", rank=rank, **row)
    job.barrier("end")
    emit(phase="done", rank=rank)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -P leaves it out
    from exit_on_error import run_main
    run_main(main)
