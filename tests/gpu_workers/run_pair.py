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
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def collect(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """Each process's output (stdout and stderr as piped); on a timeout all are killed."""
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            out, err = proc.communicate()
            out += "\n<killed: timeout>"
        outputs.append(out + (err or ""))
    return outputs


def run_pair(worker: str, args: list[str], gpus: int = 1, timeout: float = 300,
             extra_env: dict | None = None, processes: int = 2) -> tuple[list[dict], list[str]]:
    """Each worker gets RANK PORT *args; returns every RESULT line and each worker's output."""
    port = str(free_port())
    procs = []
    for rank in range(processes):
        env = dict(os.environ)
        env.update(extra_env or {})
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        # Several processes share one GPU: each preallocates only its share.
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.3" if processes <= 2 else str(0.6 / processes))
        if gpus >= 2:
            env["WORKER_LOCAL_DEVICE"] = str(rank)
        else:
            env["NCCL_HOSTID"] = f"jax-amem-test-host-{rank}"
            env["WORKER_LOCAL_DEVICE"] = "0"
        path = Path(__file__).resolve().parent / worker
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
