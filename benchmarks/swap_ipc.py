"""The swap into another process's tensors (CUDA IPC) against the same swap into tensors of
this process, same bytes, same run, one GPU.

    python -P benchmarks/swap_ipc.py [--large-mib 512 --large-count 4] [--small-count 2000 --small-kib 16]

This process is the trainer (JAX) and also holds PyTorch tensors for the in-process swap; a
rollout process (this script with --rollout) holds the same tensors, exports them
(RolloutIpc) and says ready / waits for done each round. Columns: the in-process swap, the
swap through IPC (both the warm `SwapReport.seconds`: the whole call, blocked until the
GPU is done), their ratio (goal: IPC within 10%, ratio >= 0.90), and the round through the
store (TrainerIpc.swap: wait for ready, swap, publish done) as the trainer sees it. Medians
of --repeats rounds; the IPC bytes are checked once with `jax_amem.swapping.verify` (read back
through the mapping).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")  # leave room for the rollout process

import numpy as np

import jax_amem  # noqa: E402  (before JAX starts)
from jax_amem.swapping import verify
from jax_amem.swapping.same_host.ready_done import RolloutIpc, TrainerIpc
from jax_amem.swapping.store import TorchStore


def cases(args) -> list[tuple[str, int, int]]:
    """(name, tensors, float32 elements per tensor)."""
    out = [(f"large{k or ''}", args.large_count, int(mib * 2**18)) for k, mib in enumerate(args.large_mib)]
    return out + [("small", args.small_count, int(args.small_kib * 2**8))]


def rollout(args) -> None:
    """The other process: per case, its tensors exported, `repeats + 1` rounds, then freed."""
    import torch

    store = TorchStore.connect("127.0.0.1", args.rollout, timeout=600)
    for name, count, elements in cases(args):
        tensors = {f"t{i}": torch.empty(elements, dtype=torch.float32, device="cuda") for i in range(count)}
        end = RolloutIpc(store, tensors, group=name, timeout=600)
        for version in range(1, args.repeats + 2):
            end.ready(version)
            end.wait(version)
        end.wait_closed()
        del end, tensors
        torch.cuda.empty_cache()


def run_case(store, name: str, count: int, elements: int, device, repeats: int) -> dict:
    import jax
    import torch

    rng = np.random.default_rng(0)
    src = {f"t{i}": jax.device_put(rng.standard_normal(elements, dtype=np.float32), device) for i in range(count)}
    jax.block_until_ready(src)
    local = {k: torch.empty(elements, dtype=torch.float32, device=f"cuda:{device.local_hardware_id}") for k in src}
    jax_amem.swap(src, local, progress=False)
    here = statistics.median(jax_amem.swap(src, local, progress=False).seconds for _ in range(repeats))
    del local
    torch.cuda.empty_cache()

    end = TrainerIpc(store, group=name, timeout=600)
    end.swap(src, 1, progress=False)  # maps the handles, compiles the program
    swaps, rounds = [], []
    for version in range(2, repeats + 2):
        start = time.perf_counter()
        swaps.append(end.swap(src, version, progress=False).seconds)
        rounds.append(time.perf_counter() - start)
    checked = verify(src, end.remote)
    end.close()
    return {"case": name, "tensors": count, "bytes": count * elements * 4, "here_s": here,
            "ipc_s": statistics.median(swaps), "round_s": statistics.median(rounds), "verified": checked}


def print_table(rows: list[dict], where: str) -> None:
    gbs = lambda r, key: r["bytes"] / r[key] / 1e9
    print(f"swap into another process's tensors (CUDA IPC) vs into this process's, on {where} (same run; medians)")
    print(f"{'case':>8} {'tensors':>8} {'MiB':>8} {'here GB/s':>10} {'IPC GB/s':>9} {'IPC/here':>9} "
          f"{'round GB/s':>11} {'round ms':>9} {'verified':>9}")
    for r in rows:
        print(f"{r['case']:>8} {r['tensors']:>8} {r['bytes'] / 2**20:>8.1f} {gbs(r, 'here_s'):>10.2f} "
              f"{gbs(r, 'ipc_s'):>9.2f} {r['here_s'] / r['ipc_s']:>9.2f} {gbs(r, 'round_s'):>11.2f} "
              f"{r['round_s'] * 1e3:>9.2f} {'yes' if r['verified'] == r['bytes'] else 'NO':>9}")


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-mib", type=float, nargs="+", default=[512], help="MiB per large tensor, a case each")
    parser.add_argument("--large-count", type=int, default=4)
    parser.add_argument("--small-count", type=int, default=2000)
    parser.add_argument("--small-kib", type=float, default=16)
    parser.add_argument("--repeats", type=int, default=20, help="timed rounds per figure")
    parser.add_argument("--rollout", type=int, default=None, help=argparse.SUPPRESS)  # the other process: store port
    args = parser.parse_args(argv)
    if args.rollout is not None:
        return rollout(args)
    import jax
    from torch.distributed import TCPStore

    gpus = jax.devices("gpu") if jax_amem.gpu_status().usable else []
    if not gpus:
        sys.exit(f"benchmarks/swap_ipc.py needs a GPU: {jax_amem.gpu_status().why_not()}")
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    argv_out = list(argv if argv is not None else sys.argv[1:])
    other = subprocess.Popen([sys.executable, "-P", os.path.abspath(__file__), *argv_out, "--rollout", str(server.port)],
                             env={**os.environ, "PYTORCH_CUDA_ALLOC_CONF": ""})
    try:
        rows = [run_case(TorchStore(server), *case, gpus[0], args.repeats) for case in cases(args)]
    except BaseException:
        other.kill()  # it would wait for rounds that never come
        raise
    if other.wait(timeout=600) != 0:
        print(f"the rollout process exited with {other.returncode}", file=sys.stderr)
    print_table(rows, f"{gpus[0].device_kind}")
    return rows


if __name__ == "__main__":
    main()
