"""Choosing XLA's allocator at import, and the report (CPU)."""

import os
import subprocess
import sys

import pytest

import jax.numpy as jnp

import jax_amem
from jax_amem.memory import allocator

VAR = allocator.ALLOCATOR_VARIABLE


def run_python(code: str, **env) -> str:
    environment = {k: v for k, v in os.environ.items()
                   if k not in (VAR, allocator.OPT_OUT_VARIABLE)}
    environment.update(env)
    return subprocess.Popen([sys.executable, "-P", "-c", code], env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


REPORT = ("import os, jax_amem; s = jax_amem.memory.allocator_status(); "
          f"print(os.environ.get('{VAR}'), s.allocator, s.configured_by_jax_amem, s.returns_pool, "
          "'|', s.note)")


def test_import_chooses_cuda_async_unless_told_otherwise():
    # Fresh interpreters, in parallel: XLA reads the variable once per process.
    cases = {
        "fresh": run_python(REPORT),
        "user choice": run_python(REPORT, **{VAR: "platform"}),
        "opted out": run_python(REPORT, **{allocator.OPT_OUT_VARIABLE: "0"}),
        "jax first": run_python("import jax; jax.devices(); " + REPORT),
    }
    out = {}
    for name, process in cases.items():
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
        out[name] = stdout.strip()
    assert out["fresh"].startswith("cuda_async cuda_async True True | ")
    assert out["user choice"].startswith("platform platform False True | ")
    assert "set by the user" in out["user choice"]
    assert out["opted out"].startswith("None default False False | ")
    assert out["jax first"].startswith("None default False False | ")
    assert "before jax_amem could choose" in out["jax first"]


def test_the_problem_message_says_how_to_fix_it():
    status = allocator.AllocatorStatus("default", False, f"{VAR} unset")
    message = allocator.pool_return_problem(status)
    assert "keeps its pool" in message and "import jax_amem before JAX starts" in message
    assert f"{VAR}=cuda_async" in message
    assert allocator.pool_return_problem(allocator.AllocatorStatus("cuda_async", True, "")) == ""


def test_configure_after_jax_started_changes_nothing(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    jnp.ones(1)  # JAX is running
    status = jax_amem.memory.configure_allocator()
    assert VAR not in os.environ and status.allocator == "default"


def test_memory_report_without_gpu_says_so_and_prints():
    if jax_amem.gpu_status().driver_available:
        pytest.skip("a CUDA driver is present")
    x = jnp.arange(1000.0)
    jax_amem.pause(keep=[x])
    try:
        report = jax_amem.memory_report()
    finally:
        jax_amem.resume()
    assert report.devices == [] and report.paused and report.host_kept_bytes == 4000
    text = str(report)
    assert "no GPU: the CUDA driver" in text and "kept arrays on host 3.9 KiB" in text
    assert report.to_dict()["pool"]["in_use_bytes"] == 4096
