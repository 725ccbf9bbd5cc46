"""Helpers for the interposer's CPU tests: build the fake NCCL, run a scenario in a fresh process.

Loading the interposer is process-wide, so every scenario runs in its own
Python process, which prints one JSON line (prefixed "OUT ") with what it saw.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from gpu_workers.run_pair import collect, free_port

FAKE_SOURCE = Path(__file__).resolve().parent / "fake_nccl.cc"

PRELUDE = textwrap.dedent("""
    import ctypes, json, os
    import numpy as np
    import jax_amem
    from jax_amem import nccl

    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]

    def interposer():
        lib = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD)  # what XLA's dlopen returns
        lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.ncclGetLastError.argtypes = [ctypes.c_void_p]
        lib.ncclGetLastError.restype = ctypes.c_char_p
        lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
        lib.ncclCommCount.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        lib.ncclCommGetAsyncError.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        lib.ncclCommSplit.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        lib.ncclCommRegister.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_void_p)]
        lib.ncclCommDeregister.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.ncclCommInitRankConfig.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                               UniqueId, ctypes.c_int, ctypes.c_void_p]
        return lib

    class Config(ctypes.Structure):  # the head of ncclConfig_t
        _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                    ("blocking", ctypes.c_int), ("cgaClusterSize", ctypes.c_int),
                    ("minCTAs", ctypes.c_int), ("maxCTAs", ctypes.c_int),
                    ("netName", ctypes.c_char_p), ("splitShare", ctypes.c_int)]

    def config(split_share):
        made = Config()
        made.size, made.splitShare = ctypes.sizeof(Config), split_share
        return made

    def init_config(lib, uid, nranks, split_share, ranks=None):
        # Communicators as XLA makes them: ncclCommInitRankConfig with a config.
        comms = []
        for rank in (range(nranks) if ranks is None else ranks):
            comm, made = ctypes.c_void_p(), config(split_share)
            assert lib.ncclCommInitRankConfig(ctypes.byref(comm), nranks, uid, rank,
                                              ctypes.byref(made)) == 0
            comms.append(comm)
        return comms

    def split(lib, comm, color, key=0):
        child = ctypes.c_void_p()
        assert lib.ncclCommSplit(comm, color, key, ctypes.byref(child), None) == 0
        return child

    def rows(**selection):
        return [c.__dict__ for c in nccl.communicators(**selection)]

    def by_creation(field):
        # One field of every communicator, in creation order (communicators() lists them by key).
        return [getattr(c, field) for c in sorted(nccl.communicators(), key=lambda c: c.id)]

    def attempt(call):
        # [error type, message], or None when the call succeeded.
        try:
            call()
        except Exception as error:
            return [type(error).__name__, str(error)]
        return None

    def fake_log():
        fake = ctypes.CDLL(os.environ["JAX_AMEM_NCCL_LIBRARY"], mode=os.RTLD_NOLOAD)
        fake.fake_nccl_log.restype = ctypes.c_char_p
        return fake.fake_nccl_log().decode().splitlines()

    def make_id(text):
        uid = UniqueId()
        uid.internal = text.encode()
        return uid

    def init_ranks(lib, uid, nranks, ranks=None):
        comms = []
        for rank in (range(nranks) if ranks is None else ranks):
            comm = ctypes.c_void_p()
            assert lib.ncclCommInitRank(ctypes.byref(comm), nranks, uid, rank) == 0
            comms.append(comm)
        return comms

    def all_reduce(lib, comm, values):
        send = np.asarray(values, np.float32)
        recv = np.zeros_like(send)
        code = lib.ncclAllReduce(send.ctypes.data, recv.ctypes.data, send.size, 7, 0, comm, None)
        return code, recv.tolist()

    def out(**fields):
        print("OUT " + json.dumps(fields), flush=True)
""")


def build_fake(folder: Path, *, with_suspend: bool = False, soname: str | None = None) -> Path:
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("the interposer tests need a C++ compiler (g++) to build the fake NCCL")
    name = "libfake_nccl" + ("_suspend" if with_suspend else "") + (".soname" if soname else "") + ".so"
    target = folder / name
    command = [compiler, "-shared", "-fPIC", "-O1", str(FAKE_SOURCE), "-o", str(target)]
    if with_suspend:
        command.insert(1, "-DFAKE_WITH_SUSPEND")
    if soname:
        command.append(f"-Wl,-soname,{soname}")
    subprocess.run(command, check=True)
    return target


def _environment(fake: Path | None, env: dict | None) -> dict:
    environment = dict(os.environ)
    environment.update({"JAX_AMEM_NCCL_HOST_EXCHANGE": "1", "JAX_PLATFORMS": "cpu"})
    if fake is not None:  # None: no NCCL library named (the store alone, e.g. the agreement benchmark)
        environment["JAX_AMEM_NCCL_LIBRARY"] = str(fake)
    environment.update(env or {})
    return environment


def _merged(stdout: str) -> dict:
    merged = {}
    for line in stdout.splitlines():
        if line.startswith("OUT "):
            merged.update(json.loads(line[4:]))
    return merged


def run_scenario(fake: Path, body: str, env: dict | None = None, timeout: float = 120) -> dict:
    """Runs PRELUDE + body in a fresh interpreter; returns the merged OUT lines."""
    code = PRELUDE + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                          env=_environment(fake, env), timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"scenario failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return _merged(done.stdout)


def run_job(fake: Path | None, body: str, processes: int = 2, env: dict | None = None,
            timeout: float = 120) -> list[dict]:
    """Runs the scenario in `processes` interpreters joined by jax.distributed (on CPU).

    Each sees PROCESS (its id) and `job` (the jax.distributed client); returns each one's OUT lines.
    """
    port = free_port()
    start = textwrap.dedent(f"""
        import jax
        PROCESS = int(os.environ["SCENARIO_PROCESS"])
        jax.distributed.initialize(coordinator_address="127.0.0.1:{port}",
                                   num_processes={processes}, process_id=PROCESS)
        from jax._src import distributed as _distributed
        job = _distributed.global_state.client
    """)
    code = PRELUDE + start + textwrap.dedent(body)
    procs = [subprocess.Popen([sys.executable, "-P", "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=_environment(fake, {**(env or {}), "SCENARIO_PROCESS": str(p)}))
             for p in range(processes)]
    results = []
    for proc, out in zip(procs, collect(procs, timeout)):
        if proc.returncode != 0:
            raise AssertionError(f"process failed ({proc.returncode}):\n{out[-6000:]}")
        results.append(_merged(out))
    return results
