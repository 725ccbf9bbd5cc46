"""NCCL pause/resume against XLA's own communicators (and PyTorch's), on real GPUs.

Two JAX processes under jax.distributed share one GPU (different NCCL_HOSTID, so
NCCL accepts two ranks on one GPU) or take one GPU each; XLA creates and caches
its communicator; the workers pause and resume it through jax_amem.nccl and
check that the jitted cross-process sum stays bit-identical.
"""

import pytest

from gpu_workers.run_pair import run_pair


def by_phase(results, phase):
    return sorted((r for r in results if r["phase"] == phase), key=lambda r: r["rank"])


def check_pair(results, logs, cycles):
    assert len(by_phase(results, "done")) == 2, "\n".join(log[-4000:] for log in logs)
    for start in by_phase(results, "start"):
        assert start["interposer"], start["status"]
    created = by_phase(results, "created")
    owners = {c["owner"] for r in created for c in r["communicators"]}
    assert "xla" in owners
    keys = [sorted(c["key"] for c in r["communicators"]) for r in created]
    assert keys[0] == keys[1]  # both ranks see the same communicators, in the same order
    for result in by_phase(results, "cycles"):
        assert result["identical"], result["cycles"]
        assert len(result["cycles"]) == cycles
        # Measured by the driver around each communicator's teardown (synchronised), so
        # allocations by XLA's other threads do not blur it as a process-wide reading can.
        assert all(c["communicator_freed_bytes"] > 0 for c in result["cycles"]), result["cycles"]
        assert all(all(s == "recreate" for s in c["strategies"]) for c in result["cycles"])
        assert all(c["state"] == "active" for c in result["communicators"])
    return by_phase(results, "cycles")


@pytest.mark.gpu
def test_xla_communicator_pause_resume_is_bit_identical_and_guarded():
    results, logs = run_pair("xla_collective_worker.py", ["3", "recreate", "--probe-guard"])
    check_pair(results, logs, cycles=3)
    for guard in by_phase(results, "guard"):
        assert guard["raised"] and "paused by jax-amem" in guard["message"]
        assert "resume()" in guard["message"]
    assert all(r["identical"] for r in by_phase(results, "after_guard"))


@pytest.mark.gpu
def test_hundred_cycles_do_not_grow_device_or_host_memory():
    results, logs = run_pair("xla_collective_worker.py", ["100", "recreate"], timeout=600)
    for result in check_pair(results, logs, cycles=100):
        # The first cycle may settle allocator caches; after that, nothing may accumulate.
        assert result["free_growth_bytes"] <= 16 * 2**20, result["free_growth_bytes"]
        assert result["rss_growth_kib"] <= 64 * 1024, result["rss_growth_kib"]


@pytest.mark.gpu
def test_xla_and_torch_communicators_pause_together():
    pytest.importorskip("torch")
    # Two communicators on one device: each one's bytes come from the driver only when they are
    # torn down one at a time ("destroy"; NCCL 2.28.9 has no ncclCommMemStats for the parallel teardown).
    results, logs = run_pair("xla_collective_worker.py",
                             ["3", "recreate", "--torch", "--teardown", "destroy"])
    check_pair(results, logs, cycles=3)
    owners = {c["owner"] for r in by_phase(results, "cycles") for c in r["communicators"]}
    assert {"xla", "torch"} <= owners, owners


@pytest.mark.multigpu
def test_xla_communicator_over_nvlink_pause_resume():
    results, logs = run_pair("xla_collective_worker.py", ["5", "recreate", "--probe-guard"], gpus=2)
    check_pair(results, logs, cycles=5)
