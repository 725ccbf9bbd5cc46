"""Benchmark worker: the NCCL swap (send/receive of a plan's buckets) against a plain NCCL
send/recv of the same number of bytes, one contiguous buffer, on the same communicator, in
the same run. Process 0 is the JAX trainer, process 1 the PyTorch rollout. Times are taken on
the rollout, from a common barrier to the received bytes being in place (synchronised).

usage: python -P nccl_swap_bench_worker.py RANK PORT MIB TENSORS BUCKET_MIB REPEAT
"""

import statistics
import sys
import time

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -P` does not add the script's folder
import nccl_swap_common as common  # noqa: E402


def layouts(mib: int, tensors: int):
    import numpy as np

    from jax_amem.reshard import Layout

    cols = 4096
    rows = max(1, (mib << 20) // (4 * cols * tensors))
    src = {f"w{i}": Layout.single((rows, cols), np.float32, common.TRAINER_OWNER) for i in range(tensors)}
    dst = {f"w{i}": Layout.single((rows, cols), np.float32, common.ROLLOUT_OWNER) for i in range(tensors)}
    return src, dst, (rows, cols)


def trainer(port, mib, tensors, bucket_mib, repeat):
    import jax
    import jax.numpy as jnp

    from jax_amem import reshard
    from jax_amem._native import core
    from jax_amem.swapping import cross_host as nt

    src, dst, shape = layouts(mib, tensors)
    gpu = jax.devices("gpu")[0]
    params = {n: jax.device_put(jnp.full(shape, i, jnp.float32), gpu) for i, n in enumerate(src)}
    plan = reshard.plan(src, dst)
    link = common.link("trainer", port, bucket_bytes=bucket_mib << 20)
    plain = jax.device_put(jnp.zeros((plan.nbytes,), jnp.uint8), gpu).block_until_ready()
    for run in range(repeat + 1):  # run 0 warms up (compiles, connects NCCL's peers)
        common.barrier(link, f"swap{run}")
        report = nt.send(params, plan, link, run)
        common.barrier(link, f"plain{run}")
        core.transport.send_bytes(plain.unsafe_buffer_pointer(), plan.nbytes, 1, link.comm, 0, link.device)
        core.transport.synchronize_stream(0, link.device)
    common.emit(role="trainer", staging=report.staging_bytes, buckets=report.buckets)
    common.barrier(link, "end")
    link.close()


def rollout(port, mib, tensors, bucket_mib, repeat):
    import torch

    from jax_amem import reshard
    from jax_amem._native import core
    from jax_amem.swapping import cross_host as nt

    torch.cuda.set_device(0)
    src, dst, shape = layouts(mib, tensors)
    plan = reshard.plan(src, dst)
    out = {n: torch.empty(shape, dtype=torch.float32, device="cuda") for n in dst}
    plain = torch.empty(plan.nbytes, dtype=torch.uint8, device="cuda")
    common.store("rollout", port)  # the TCPStore server, before the trainer connects
    link = common.link("rollout", port, bucket_bytes=bucket_mib << 20)
    swap_s, plain_s = [], []
    for run in range(repeat + 1):
        common.barrier(link, f"swap{run}")
        t0 = time.perf_counter()
        report = nt.receive(out, plan, link, run)
        swap_s.append(time.perf_counter() - t0)
        common.barrier(link, f"plain{run}")
        t0 = time.perf_counter()
        stream = torch.cuda.current_stream().cuda_stream
        core.transport.recv_bytes(plain.data_ptr(), plan.nbytes, 0, link.comm, stream, link.device)
        torch.cuda.synchronize()
        plain_s.append(time.perf_counter() - t0)
    ok = all(bool((t == float(i)).all()) for i, t in enumerate(out.values()))
    common.emit(role="rollout", bytes=plan.nbytes, buckets=report.buckets, staging=report.staging_bytes,
                swap_s=statistics.median(swap_s[1:]), plain_s=statistics.median(plain_s[1:]),
                swap_all=swap_s, plain_all=plain_s, values_ok=ok)
    common.barrier(link, "end")
    link.close()


def main():
    rank, port = int(sys.argv[1]), sys.argv[2]
    mib, tensors, bucket_mib, repeat = (int(x) for x in sys.argv[3:7])
    role = common.start(rank)
    (trainer if role == "trainer" else rollout)(port, mib, tensors, bucket_mib, repeat)
    common.emit(role=role, phase="done")


if __name__ == "__main__":
    main()
