"""One of two JAX processes sharing one GPU (or one GPU each) under jax.distributed.

Run by tests/test_nccl_gpu.py and benchmarks/nccl_pause.py. XLA creates its own
NCCL communicator for the cross-process sum; the worker pauses and resumes it
through jax_amem.nccl and checks the sum stays bit-identical. Prints one JSON
line per phase (prefixed "RESULT ").

usage: python -P xla_collective_worker.py RANK PORT CYCLES STRATEGY [--probe-guard] [--torch]
  --torch  also runs a torch.distributed (NCCL) all-reduce in the same process, so that
           XLA's and PyTorch's communicators are paused and resumed together
Environment: NCCL_HOSTID must differ per process when both share one GPU.
"""

import json
import os
import resource
import sys
import time

import jax_amem  # first: puts the NCCL interposer in front
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P


def emit(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def free_bytes(device_index: int) -> int:
    return jax_amem._core.cuda.mem_get_info(device_index)[0]


def start_torch(rank: int, port: int, local: int):
    """A PyTorch NCCL process group beside XLA's; returns a check that its sum is right."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(local)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, device_id=torch.device("cuda", local))

    def check() -> bool:
        value = torch.full((1024,), float(rank + 1), device="cuda")
        dist.all_reduce(value)
        return bool(torch.all(value == 3.0).item())

    assert check()
    return check


def main():
    rank, port, cycles, strategy = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    probe_guard = "--probe-guard" in sys.argv
    with_torch = "--torch" in sys.argv
    # "destroy" (one after another) gives every communicator the driver's reading around its
    # own teardown; under "parallel" several on one device report NCCL's count (none < 2.29).
    teardown = sys.argv[sys.argv.index("--teardown") + 1] if "--teardown" in sys.argv else "parallel"
    local = int(os.environ.get("WORKER_LOCAL_DEVICE", "0"))
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=rank, local_device_ids=[local])
    emit(phase="start", rank=rank, interposer=jax_amem.nccl.is_installed(),
         status=jax_amem.nccl.status(), devices=str(jax.devices()))
    mesh = jax.make_mesh((2,), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    rows = np.random.default_rng(rank).standard_normal((1, 1 << 20)).astype(np.float32)
    x = jax.make_array_from_process_local_data(sharding, rows, (2, 1 << 20))
    step = jax.jit(lambda a: jnp.sum(a * 1.5, axis=0), out_shardings=NamedSharding(mesh, P()))
    reference = np.asarray(step(x).addressable_data(0))
    torch_port = int(os.environ["WORKER_SPARE_PORT"])  # not port + 1: see run_pair
    torch_check = start_torch(rank, torch_port, local) if with_torch else (lambda: True)
    comms = jax_amem.nccl.communicators()
    emit(phase="created", rank=rank, communicators=[c.__dict__ for c in comms])
    device_index = jax.local_devices()[0].local_hardware_id
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    free0 = free_bytes(device_index)
    timings = []
    for cycle in range(cycles):
        free_before = free_bytes(device_index)
        t0 = time.perf_counter()
        paused = jax_amem.nccl.pause(strategy, teardown=teardown)
        t1 = time.perf_counter()
        free_paused = free_bytes(device_index)
        resumed = jax_amem.nccl.resume()
        t2 = time.perf_counter()
        out = np.asarray(step(x).addressable_data(0))
        same = bool(np.array_equal(out, reference)) and torch_check()
        timings.append({"pause_s": t1 - t0, "resume_s": t2 - t1,
                        "freed_bytes": free_paused - free_before, "identical": same,
                        "communicator_freed_bytes": sum(c.bytes_freed for c in paused.communicators),
                        "strategies": [c.last_strategy for c in paused.communicators]})
        if not same:
            break
    emit(phase="cycles", rank=rank, cycles=timings,
         free_growth_bytes=free0 - free_bytes(device_index),
         rss_growth_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0,
         identical=all(t["identical"] for t in timings),
         communicators=[c.__dict__ for c in jax_amem.nccl.communicators()])
    if probe_guard:
        jax_amem.nccl.pause(strategy)
        try:
            np.asarray(step(x).addressable_data(0))
            emit(phase="guard", rank=rank, raised=False, message="")
        except Exception as error:  # noqa: BLE001 - we report what XLA raised
            emit(phase="guard", rank=rank, raised=True, type=type(error).__name__,
                 message=str(error)[:2000])
        jax_amem.nccl.resume()
        try:
            out = np.asarray(step(x).addressable_data(0))
            emit(phase="after_guard", rank=rank, identical=bool(np.array_equal(out, reference)))
        except Exception as error:  # noqa: BLE001
            emit(phase="after_guard", rank=rank, identical=False, message=str(error)[:2000])
    jax.distributed.shutdown()
    emit(phase="done", rank=rank)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -P leaves it out
    from exit_on_error import run_main
    run_main(main)
