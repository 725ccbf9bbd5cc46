"""Benchmark worker: N NCCL communicators between two processes, paused and resumed.

Prints RESULT lines with, per method: bytes freed (CUDA driver), pause time,
resume time. Methods: jax_amem recreate (destroy teardown), jax_amem recreate
(abort teardown), recreate (all destroys on their own threads), suspend where the NCCL
has it, and the naive baseline measured
in the same run (destroy every communicator, then initialise each again one
after another, each with a fresh unique id through the usual rendezvous: the
jax.distributed key-value store).

usage: python -P nccl_comms_worker.py RANK PORT COUNT
"""

import ctypes
import json
import os
import sys
import time

import jax_amem  # first: puts the NCCL interposer in front
import jax
import numpy as np


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def emit(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def main():
    rank, port, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    local = int(os.environ.get("WORKER_LOCAL_DEVICE", "0"))
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=rank, local_device_ids=[local])
    from jax._src import distributed
    store = distributed.global_state.client
    jax.devices()  # start the backend: CUDA context current on this thread
    lib = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD)
    lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    sequence = [0]

    def rendezvous_id() -> UniqueId:
        """Rank 0 makes a unique id, the store carries it to rank 1: the usual rendezvous."""
        sequence[0] += 1
        key = f"bench/id/{sequence[0]}"
        uid = UniqueId()
        if rank == 0:
            lib.ncclGetUniqueId(ctypes.byref(uid))
            # bytes(uid), not uid.internal: a c_char array stops at the first zero byte.
            store.key_value_set_bytes(key, bytes(uid))
        else:
            ctypes.memmove(ctypes.byref(uid), store.blocking_key_value_get_bytes(key, 60_000), 128)
        return uid

    def init_one() -> ctypes.c_void_p:
        comm = ctypes.c_void_p()
        assert lib.ncclCommInitRank(ctypes.byref(comm), 2, rendezvous_id(), rank) == 0
        return comm

    def free() -> int:
        return jax_amem._core.cuda.mem_get_info(local)[0]

    def barrier(name):
        store.wait_at_barrier(f"bench/{name}", 60_000)

    t0 = time.perf_counter()
    comms = [init_one() for _ in range(count)]
    first_init_s = time.perf_counter() - t0
    free_idle_before = free()
    emit(phase="setup", rank=rank, count=count, first_init_s=first_init_s,
         nccl_version=lib.amem_nccl_real_version(), has_suspend=bool(lib.amem_nccl_has_suspend()))

    rows = []
    teardowns = {"recreate": "destroy", "recreate-abort": "abort", "recreate-parallel": "parallel"}
    for method in ["recreate", "recreate-abort", "recreate-parallel", "suspend"]:
        if method == "suspend" and not lib.amem_nccl_has_suspend():
            rows.append({"method": method, "skipped": f"NCCL {lib.amem_nccl_real_version()} has no ncclCommSuspend"})
            continue
        barrier(method + "-start")
        before = free()
        t0 = time.perf_counter()
        jax_amem.nccl.pause("recreate" if method.startswith("recreate") else "suspend",
                            owner="other", teardown=teardowns.get(method, "destroy"))
        pause_s = time.perf_counter() - t0
        freed = free() - before
        barrier(method + "-paused")
        t0 = time.perf_counter()
        jax_amem.nccl.resume()
        resume_s = time.perf_counter() - t0
        rows.append({"method": method, "freed_bytes": freed, "pause_s": pause_s, "resume_s": resume_s})

    # Naive baseline: destroy all, then re-initialise each one after another.
    barrier("naive-start")
    raw = [c for c in jax_amem.nccl.communicators(owner="other")]
    before = free()
    t0 = time.perf_counter()
    for comm in comms:
        lib.ncclCommDestroy(comm)
    destroy_s = time.perf_counter() - t0
    freed = free() - before
    barrier("naive-destroyed")
    t0 = time.perf_counter()
    comms = [init_one() for _ in range(count)]
    init_s = time.perf_counter() - t0
    rows.append({"method": "naive destroy + sequential init", "freed_bytes": freed,
                 "pause_s": destroy_s, "resume_s": init_s})
    emit(phase="rows", rank=rank, rows=rows, idle_free=free_idle_before, tracked=len(raw))
    barrier("end")
    jax.distributed.shutdown()
    emit(phase="done", rank=rank)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -P leaves it out
    from exit_on_error import run_main
    run_main(main)
