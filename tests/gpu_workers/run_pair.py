"""Starts two (or more) worker processes on this machine and collects their RESULT lines.

Every process gets a different NCCL_HOSTID, so NCCL accepts several ranks on one GPU
(it sees several hosts and uses its socket transport); with 2+ GPUs each worker
takes its own GPU (WORKER_LOCAL_DEVICE) and the hosts stay real.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


PORT_TAKEN = "Address already in use"
PORT_ATTEMPTS = 3


def free_port() -> int:
    """A port free now on the IPv4 wildcard address, which the coordinator binds (a port bound on
    any address of this host is refused here)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def collect(procs: list[subprocess.Popen], timeout: float, grace: float = 30) -> list[str]:
    """Each process's output (stdout, stderr merged into it). All are killed on `timeout`, and
    `grace` seconds after one of them fails: its peers would otherwise wait for it in a
    collective or the store until the timeout, spending minutes on a known failure."""
    chunks: list[list[str]] = [[] for _ in procs]
    readers = [threading.Thread(target=lambda p=p, out=out: out.append(p.stdout.read()), daemon=True)
               for p, out in zip(procs, chunks)]
    for reader in readers:
        reader.start()
    start, failed_at, note = time.monotonic(), None, ""
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
            failed_at = now
        if now - start > timeout:
            note = "\n<killed: timeout>"
        elif failed_at is not None and now - failed_at > grace:
            failed = [k for k, p in enumerate(procs) if p.poll() not in (None, 0)]
            note = f"\n<killed: process {failed[0]} failed {grace:.0f} s before>"
        if note:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.2)
    for p, reader in zip(procs, readers):
        p.wait()
        reader.join()
    return ["".join(out) + (note if p.returncode and note else "") for p, out in zip(procs, chunks)]


def run_pair(worker: str, args: list[str], gpus: int = 1, timeout: float = 300,
             extra_env: dict | None = None, processes: int = 2) -> tuple[list[dict], list[str]]:
    """Each worker gets RANK PORT *args; returns every RESULT line and each worker's output.

    A port free when chosen can be taken before the coordinator binds it: by another run
    started beside this one, or by an ephemeral port of a gRPC client (seen on the H100 and
    H200 with runs back to back or side by side). Then nothing ran (no RESULT line, a worker
    says "Address already in use"), and the pair starts again on other ports, up to
    PORT_ATTEMPTS times."""
    for attempt in range(PORT_ATTEMPTS):
        results, logs = _run_once(worker, args, gpus, timeout, extra_env, processes)
        if results or not any(PORT_TAKEN in log for log in logs):
            break
        print(f"run_pair: {worker}'s port was taken before it bound (attempt {attempt + 1} of {PORT_ATTEMPTS}); "
              "again on other ports", file=sys.stderr)
    return results, logs


def _ports() -> tuple[str, str]:
    """The coordinator's port and a spare (a second rendezvous, torch.distributed beside JAX's,
    needs its own: port + 1 can be an ephemeral port a gRPC client of the first one holds)."""
    port = free_port()
    spare = free_port()
    while spare == port:
        spare = free_port()
    return str(port), str(spare)


def _run_once(worker, args, gpus, timeout, extra_env, processes) -> tuple[list[dict], list[str]]:
    port, spare_port = _ports()
    procs = []
    for rank in range(processes):
        env = dict(os.environ)
        env.update(extra_env or {})
        env["PYTHONUNBUFFERED"] = "1"
        env["WORKER_SPARE_PORT"] = spare_port
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        # Several processes share one GPU: each preallocates only its share.
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.3" if processes <= 2 else str(0.6 / processes))
        if gpus >= 2:
            env["WORKER_LOCAL_DEVICE"] = str(rank)
        else:
            env["NCCL_HOSTID"] = f"jax-amem-test-host-{rank}"
            env["WORKER_LOCAL_DEVICE"] = "0"
        path = Path(worker) if os.path.isabs(worker) else Path(__file__).resolve().parent / worker
        procs.append(subprocess.Popen([sys.executable, "-P", str(path), str(rank), port, *args],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    results, logs = [], []
    for out in collect(procs, timeout):
        logs.append(out)
        for line in out.splitlines():
            if line.startswith("RESULT "):
                results.append(json.loads(line[len("RESULT "):]))
    return results, logs

if __name__ == "__main__":
    results, logs = run_pair(sys.argv[1], sys.argv[2:])
    for log in logs:
        print(log[-6000:])
