"""XLA's own communicators paused and resumed under `auto`, 2 and 4 JAX processes on one GPU.

Each process has its own NCCL_HOSTID (NCCL then accepts several ranks on one GPU). Four
processes form a 2x2 mesh and sum over each axis and over both, so XLA creates three
communicators per process. The workers (tests/gpu_workers/xla_mesh_worker.py) compare
every step bit for bit with the unpaused result. This pytest process never starts a JAX
GPU backend itself: the workers are processes of their own.

With NCCL >= 2.29.7 (JAX_AMEM_NCCL_LIBRARY) `auto` must suspend XLA's communicators; with
an older NCCL the same tests check that it recreates them. Tests about suspend alone skip,
naming the NCCL version.
"""

import pytest

import jax_amem
from gpu_workers.run_pair import run_pair

SUSPEND_SINCE = 22907


def nccl_version() -> int:
    return jax_amem.nccl.nccl_version()


def expected_xla_strategy() -> str:
    return "suspend" if nccl_version() >= SUSPEND_SINCE else "recreate"


def needs_suspend():
    if nccl_version() < SUSPEND_SINCE:
        pytest.skip(f"needs NCCL >= 2.29.7 for ncclCommSuspend; the loaded NCCL is {nccl_version()} "
                    "(set JAX_AMEM_NCCL_LIBRARY to a newer libnccl.so.2)")


def phase(results, name, processes):
    found = sorted((r for r in results if r["phase"] == name), key=lambda r: r["rank"])
    assert len(found) in (0, processes), [r["rank"] for r in found]
    return found


def run(processes, cycles, *flags, timeout=420, env=None):
    results, logs = run_pair("xla_mesh_worker.py", [str(processes), str(cycles), "auto", *flags],
                             processes=processes, timeout=timeout, extra_env=env)
    done = phase(results, "done", processes)
    assert len(done) == processes, "\n\n".join(log[-3000:] for log in logs)
    return results


def check_cycles(results, processes, cycles, xla_comms_per_process):
    for result in phase(results, "cycles", processes):
        assert result["identical"] and result["cycles"] == cycles, result
        xla = [c for c in result["first_report"] if c["owner"] == "xla"]
        assert len(xla) == xla_comms_per_process, result["first_report"]
        for comm in xla:
            assert comm["last_strategy"] == expected_xla_strategy(), comm
            assert comm["why"], comm
            if comm["last_strategy"] == "suspend":  # NCCL's own per-communicator count
                assert comm["bytes_freed"] == comm["suspendable_bytes"] >= 0, comm
                assert comm["bytes_kept"] >= 0, comm
        if expected_xla_strategy() == "suspend":
            assert sum(c["bytes_freed"] for c in xla) > 0, xla
        assert all(c["state"] == "active" for c in result["communicators"])
        # This process's device memory (NVML, per process) flat after the first cycle; host RSS
        # not growing over the second half (NCCL's first re-initialisations settle malloc's
        # arenas). The whole GPU's free memory moves with the other processes on it:
        # benchmarks/nccl_pause.py reports it with the program alone on the GPU.
        samples = result["samples"]
        if samples[0]["source"] == "nvml per-process":
            assert abs(samples[-1]["used"] - samples[0]["used"]) <= 16 * 2**20, samples
        middle = samples[len(samples) // 2]
        assert samples[-1]["rss"] - middle["rss"] <= 64 * 2**20, samples
    return phase(results, "cycles", processes)


def check_guard(results, processes):
    for guard in phase(results, "guard", processes):
        assert guard["error"] is not None, guard
        assert "paused by jax-amem" in guard["error"][1] and "resume()" in guard["error"][1], guard
        assert guard["refused_calls"] > 0 and guard["identical_after"], guard


@pytest.mark.gpu
def test_two_processes_auto_is_bit_identical_and_guarded():
    results = run(2, 20, "--probe-guard")
    check_cycles(results, 2, 20, xla_comms_per_process=1)
    check_guard(results, 2)


@pytest.mark.gpu
def test_four_processes_2x2_mesh_auto_with_a_forced_split():
    results = run(4, 100, "--split", "--probe-guard")
    for result in check_cycles(results, 4, 100, xla_comms_per_process=3):
        own = [c for c in result["first_report"] if c["owner"] != "xla"]
        assert len(own) == 2, result["first_report"]  # the root of our own and its split
        for comm in own:
            assert comm["last_strategy"] == "recreate", comm
            if nccl_version() >= SUSPEND_SINCE:
                assert "memory manager" in comm["why"], comm
    for split in phase(results, "split", 4):  # the cost keep_suspendable is measured against
        print(f"split without keep_suspendable: {split['split_seconds'] * 1e3:.1f} ms, "
              f"{split['split_device_bytes'] / 2**20:.1f} MiB")
    for refused in phase(results, "refused", 4):  # explicit suspend: refused everywhere, untouched
        assert refused["error"][0] == "NcclPauseError" and "cannot suspend" in refused["error"][1]
        assert refused["states"] == ["active"]
    assert len(phase(results, "refused", 4)) == (4 if nccl_version() >= SUSPEND_SINCE else 0)
    check_guard(results, 4)


@pytest.mark.gpu
def test_keep_suspendable_makes_the_split_suspendable():
    needs_suspend()
    results = run(4, 10, "--split", "--keep-suspendable")
    for result in check_cycles(results, 4, 10, xla_comms_per_process=3):
        assert {c["last_strategy"] for c in result["first_report"]} == {"suspend"}, result["first_report"]
    for split in phase(results, "split", 4):
        assert split["keep_suspendable"] is True
        print(f"split with keep_suspendable: {split['split_seconds'] * 1e3:.1f} ms, "
              f"{split['split_device_bytes'] / 2**20:.1f} MiB")


@pytest.mark.gpu
def test_a_process_that_never_joins_and_a_broken_communicator():
    results = run(2, 2, "--break", "--stall")
    broken = phase(results, "break", 2)
    assert broken[0]["error"][0] == "NcclPauseError" and broken[0]["states"] == ["broken"], broken[0]
    assert "jax_amem.nccl.recover()" in broken[0]["use"][1], broken[0]  # the guard's message via XLA
    for result in broken:
        assert result["recovered"] == ["active"] and result["identical_after"], result
    stalled = phase(results, "stall", 2)
    assert "timed out after 5 s" in stalled[0]["error"][1] and "Nothing was changed" in stalled[0]["error"][1]
    assert 4 < stalled[0]["seconds"] < 60
    for result in stalled:  # every communicator active and usable on every process
        assert result["states"] == ["active"] and result["identical_after"], result
