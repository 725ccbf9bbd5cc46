"""The NCCL interposer's bookkeeping, ordering, guard and error paths, against a fake NCCL.

The fake (tests/nccl_support/fake_nccl.cc) stands in for libnccl on machines
without a GPU; it logs calls and reports use of a destroyed or suspended
communicator as FAULT. The proof against XLA's real communicators is
tests/test_nccl_gpu.py.
"""

import subprocess
import sys

import pytest


from nccl_support.fixtures import fake, fake_with_suspend  # noqa: F401 (fixtures)
from nccl_support.harness import build_fake, run_scenario




def test_interposer_is_what_dlopen_returns_and_forwards_the_rest(fake):
    seen = run_scenario(fake, """
        lib = interposer()
        version = ctypes.c_int()
        lib.ncclGetVersion(ctypes.byref(version))   # not defined by us: reaches the fake
        out(installed=nccl.is_installed(), status=nccl.status(),
            front=bool(lib.amem_nccl_is_front()), version=version.value)
    """)
    assert seen == {"installed": True, "status": "", "front": True, "version": 22809}


def test_communicators_are_tracked_with_rank_size_key_and_owner(fake):
    seen = run_scenario(fake, """
        lib = interposer()
        comms = init_ranks(lib, make_id("job-a"), 2)
        child = ctypes.c_void_p()
        assert lib.ncclCommSplit(comms[0], 3, 0, ctypes.byref(child), None) == 0
        rows = [c.__dict__ for c in nccl.communicators()]
        lib.ncclCommDestroy(child)
        out(rows=rows, after_destroy=len(nccl.communicators()))
    """)
    rows = seen["rows"]
    assert [(r["rank"], r["nranks"], r["state"], r["owner"]) for r in rows] == [
        (0, 2, "active", "other"), (1, 2, "active", "other"), (0, 2, "active", "other")]
    assert rows[0]["key"] == rows[1]["key"]
    assert rows[2]["key"] == rows[0]["key"] + "/split0.c3"
    assert [r["created_by"] for r in rows] == ["ncclCommInitRank", "ncclCommInitRank", "ncclCommSplit"]
    assert seen["after_destroy"] == 2


def test_recreate_pause_resume_keeps_handles_and_data(fake):
    seen = run_scenario(fake, """
        lib = interposer()
        comms = init_ranks(lib, make_id("job-b"), 2)
        before = all_reduce(lib, comms[0], [1, 2, 3])
        report = nccl.pause("recreate", teardown="destroy")  # in turn: a fixed call order
        paused_states = [c.state for c in nccl.communicators()]
        nccl.resume()
        after = all_reduce(lib, comms[0], [1, 2, 3])
        out(before=before, after=after, paused_states=paused_states,
            strategies=[c.last_strategy for c in report.communicators],
            states=[c.state for c in nccl.communicators()], log=fake_log())
    """)
    assert seen["before"] == seen["after"] == [0, [1.0, 2.0, 3.0]]
    assert seen["paused_states"] == ["paused", "paused"]
    assert seen["states"] == ["active", "active"]
    assert seen["strategies"] == ["recreate", "recreate"]
    log = seen["log"]
    assert not [line for line in log if line.startswith("FAULT")]
    # Rank 0 makes the new communicator's id for the plan; it reaches rank 1 with the plan, so
    # nothing runs over the old communicator before it is destroyed.
    start = log.index("ncclGetUniqueId fake-id-1")
    assert log[start:start + 4] == ["ncclGetUniqueId fake-id-1", "ncclCommDestroy comm1.r0",
                                    "ncclCommDestroy comm2.r1", "ncclGroupStart"]
    # Both ranks re-initialise with that id, inside one group.
    assert log[start + 4:start + 7] == [
        "ncclCommInitRank comm3.r0 id=fake-id-1", "ncclCommInitRank comm4.r1 id=fake-id-1",
        "ncclGroupEnd"]
    assert log[-1] == "ncclAllReduce comm3.r0 n=3"


def test_recreate_sends_the_id_over_the_communicator_where_no_plan_carries_it(fake):
    seen = run_scenario(fake, """
        lib = interposer()
        comms = init_ranks(lib, make_id("job-b2"), 2)
        nccl.pause("recreate", teardown="destroy")
        nccl.resume()
        out(after=all_reduce(lib, comms[1], [5]), log=fake_log())
    """, env={"JAX_AMEM_NCCL_IDS": "communicator"})
    log = seen["log"]
    assert seen["after"] == [0, [5.0]]
    assert not [line for line in log if line.startswith("FAULT")]
    start = log.index("ncclGetUniqueId fake-id-1")  # made by rank 0 just before its broadcast
    assert log[start:start + 8] == [
        "ncclGetUniqueId fake-id-1", "ncclGroupStart",
        "ncclBroadcast comm1.r0 root=0", "ncclBroadcast comm2.r1 root=0", "ncclGroupEnd",
        "ncclCommDestroy comm1.r0", "ncclCommDestroy comm2.r1", "ncclGroupStart"]
    assert log[start + 8:start + 10] == ["ncclCommInitRank comm3.r0 id=fake-id-1",
                                         "ncclCommInitRank comm4.r1 id=fake-id-1"]


def test_an_id_used_by_one_pause_is_never_sent_by_the_next(fake):
    """The id rank 0 made for one pause's plan is spent once the communicator is recreated with
    it: a later pause whose ids go over the communicator makes a fresh one (NCCL cannot
    initialise a communicator twice from one id)."""
    seen = run_scenario(fake, """
        import os
        lib = interposer()
        comms = init_ranks(lib, make_id("job-reuse"), 2)
        nccl.pause("recreate")
        nccl.resume()
        os.environ["JAX_AMEM_NCCL_IDS"] = "communicator"
        before = len(fake_log())
        nccl.pause("recreate")
        nccl.resume()
        out(after=all_reduce(lib, comms[1], [5]), log=fake_log()[before:])
    """)
    log = seen["log"]
    assert seen["after"] == [0, [5.0]]
    made = [line.split()[-1] for line in log if line.startswith("ncclGetUniqueId")]
    assert made == ["fake-id-2"], log  # not fake-id-1, which the first resume used
    assert f"ncclBroadcast comm3.r0 root=0" in log and "ncclCommInitRank comm5.r0 id=fake-id-2" in log, log


def test_guard_refuses_calls_while_paused_without_reaching_nccl(fake):
    seen = run_scenario(fake, """
        lib = interposer()
        comm = init_ranks(lib, make_id("job-c"), 1)[0]
        nccl.pause()
        code, _ = all_reduce(lib, comm, [5])
        message = lib.ncclGetLastError(comm).decode()
        count, error = ctypes.c_int(), ctypes.c_int(-1)
        count_code = lib.ncclCommCount(comm, ctypes.byref(count))
        async_code = lib.ncclCommGetAsyncError(comm, ctypes.byref(error))
        nccl.resume()
        out(code=code, message=message, count=[count_code, count.value],
            async_error=[async_code, error.value], log=fake_log())
    """)
    assert seen["code"] == 5  # ncclInvalidUsage: an error for XLA, not a GPU fault
    assert "paused by jax-amem" in seen["message"] and "resume()" in seen["message"]
    assert seen["count"] == [0, 1]         # answered by the proxy while paused
    assert seen["async_error"] == [0, 0]   # XLA's health check sees no error
    assert not [line for line in seen["log"] if "AllReduce" in line or line.startswith("FAULT")]


def test_error_paths_leave_state_intact(fake):
    seen = run_scenario(fake, """
        lib = interposer()
        comm = init_ranks(lib, make_id("job-d"), 1)[0]
        errors = {}
        def attempt(name, call):
            try:
                call()
                errors[name] = None
            except Exception as error:
                errors[name] = [type(error).__name__, str(error)]
        attempt("resume_without_pause", nccl.resume)
        attempt("suspend_unavailable", lambda: nccl.pause("suspend"))
        state_after_refusal = [c.state for c in nccl.communicators()]
        attempt("bad_strategy", lambda: nccl.pause("fast"))
        attempt("unknown_id", lambda: nccl.pause(ids=[99]))
        handle = ctypes.c_void_p()
        assert lib.ncclCommRegister(comm, None, 64, ctypes.byref(handle)) == 0
        attempt("registered", lambda: nccl.pause("recreate"))
        state_with_registration = [c.state for c in nccl.communicators()]
        assert lib.ncclCommDeregister(comm, handle) == 0
        nccl.pause("recreate")
        attempt("pause_paused_id", lambda: nccl.pause(ids=[1]))
        nccl.resume()
        out(errors=errors, state_after_refusal=state_after_refusal,
            state_with_registration=state_with_registration,
            final=[c.state for c in nccl.communicators()], log=fake_log())
    """)
    errors = seen["errors"]
    assert errors["resume_without_pause"][0] == "NcclPauseError"
    assert "nothing to resume" in errors["resume_without_pause"][1]
    assert "NCCL >= 2.29.7" in errors["suspend_unavailable"][1]
    assert "recreate" in errors["suspend_unavailable"][1]
    assert errors["bad_strategy"][0] == "NcclArgumentError"
    assert "no communicator with id 99" in errors["unknown_id"][1]
    assert "1 registered buffer(s)" in errors["registered"][1]
    assert "is paused, not active" in errors["pause_paused_id"][1]
    assert seen["state_after_refusal"] == seen["state_with_registration"] == ["active"]
    assert seen["final"] == ["active"]
    assert not [line for line in seen["log"] if line.startswith("FAULT")]


def test_every_rank_pauses_in_the_same_order_whatever_the_creation_order(fake):
    body = """
        lib = interposer()
        order = os.environ["CREATE_ORDER"].split(",")
        comms = {name: init_ranks(lib, make_id(name), 1)[0] for name in order}
        nccl.pause("recreate")
        keys = [c.key for c in nccl.communicators(state="paused")]
        nccl.resume()
        out(keys=keys)
    """
    first = run_scenario(fake, body, env={"CREATE_ORDER": "alpha,beta,gamma"})
    second = run_scenario(fake, body, env={"CREATE_ORDER": "gamma,alpha,beta"})
    assert first["keys"] == second["keys"] and len(set(first["keys"])) == 3


@pytest.mark.parametrize("overlap", ["threads", "group"])
def test_auto_picks_suspend_where_nccl_has_it(fake_with_suspend, overlap):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comms = init_ranks(lib, make_id("job-e"), 2)
        report = nccl.pause("auto")
        code, _ = all_reduce(lib, comms[0], [1])
        nccl.resume()
        after = all_reduce(lib, comms[0], [4])
        out(strategies=[c.last_strategy for c in report.communicators], paused_code=code,
            after=after, log=fake_log())
    """, env={"FAKE_NCCL_VERSION": "23200", **({"JAX_AMEM_NCCL_OVERLAP": overlap} if overlap != "threads" else {})})
    assert seen["strategies"] == ["suspend", "suspend"]
    assert seen["paused_code"] == 5
    assert seen["after"] == [0, [4.0]]
    log = seen["log"]
    assert not [line for line in log if line.startswith("FAULT")]
    suspends = [line for line in log if line.startswith("ncclCommSuspend")]
    assert sorted(suspends) == ["ncclCommSuspend comm1.r0 flags=1", "ncclCommSuspend comm2.r1 flags=1"]
    if overlap == "group":  # one group for both ranks (NCCL >= 2.30.3)
        first = log.index(suspends[0])
        assert log[first - 1:first + 3] == ["ncclGroupStart", "ncclCommSuspend comm1.r0 flags=1",
                                            "ncclCommSuspend comm2.r1 flags=1", "ncclGroupEnd"]
    else:  # the default: each on a thread of its own, outside any group
        assert "ncclGroupStart" not in log[:log.index("ncclCommResume comm1.r0")]
    # Same handles, no re-initialisation.
    assert "ncclCommResume comm1.r0" in log and not [l for l in log if "Init" in l and "comm3" in l]


def test_async_resume_returns_a_future(fake):
    seen = run_scenario(fake, """
        lib = interposer()
        comm = init_ranks(lib, make_id("job-f"), 1)[0]
        nccl.pause()
        future = nccl.resume(async_=True)
        code, values = all_reduce(lib, comm, [7])   # waits for the resume, does not fail
        report = future.result(timeout=30)
        out(code=code, values=values, action=report.action, states=[c.state for c in nccl.communicators()])
    """)
    assert seen == {"code": 0, "values": [7.0], "action": "resume", "states": ["active"]}


def test_disabled_and_too_late_are_explained(fake, tmp_path):
    disabled = run_scenario(fake, """
        try:
            nccl.pause()
            out(raised=None)
        except nccl.NcclNotInstalledError as error:
            out(raised=str(error))
    """, env={"JAX_AMEM_NCCL": "0"})
    assert "disabled by JAX_AMEM_NCCL=0" in disabled["raised"]
    early_fake = build_fake(tmp_path, soname="libnccl.so.2")
    code = (f"import ctypes, os; ctypes.CDLL({str(early_fake)!r}, mode=os.RTLD_GLOBAL)\n"
            "import jax_amem; print('STATUS', jax_amem.nccl.status())\n"
            "try:\n    jax_amem.nccl.pause()\nexcept jax_amem.nccl.NcclNotInstalledError as error:\n"
            "    print('PAUSE', error)\n")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, "JAX_AMEM_NCCL_LIBRARY": str(fake)})
    why = f"NCCL ({early_fake.resolve()}) was loaded into this process before jax_amem, by another library"
    assert f"STATUS {why}" in done.stdout and "python -m jax_amem run" in done.stdout, done.stdout + done.stderr
    # Said at the import, as a warning, and again by pause(), which pauses nothing.
    assert f"RuntimeWarning: jax_amem.nccl cannot pause NCCL in this process: {why}" in done.stderr, done.stderr
    assert f"PAUSE jax_amem.nccl is not active in this process: {why}" in done.stdout
    assert "Nothing was paused." in done.stdout


def test_the_library_that_loaded_nccl_first_is_named():
    from jax_amem.nccl import _loader

    torch = _loader.loaded_first_reason("/v/nvidia/nccl/lib/libnccl.so.2", ["/v/torch/lib/libtorch_cuda.so"], {})
    assert torch.startswith("NCCL (/v/nvidia/nccl/lib/libnccl.so.2) was loaded into this process before "
                            "jax_amem, by PyTorch (torch was imported before jax_amem), so its communicators")
    jax = _loader.loaded_first_reason(None, ["/v/jax_plugins/xla_cuda13/xla_cuda_plugin.so"], {"jax": None})
    assert jax.startswith("NCCL was loaded into this process before jax_amem, by JAX's GPU backend (a JAX "
                          "computation, or jax.devices(), ran before jax_amem was imported)")
    both = _loader.loaded_first_reason(None, ["/v/jax_plugins/xla_cuda13/xla_cuda_plugin.so"], {"torch": None})
    assert "by PyTorch (torch was imported before jax_amem) and JAX's GPU backend" in both
    for reason in (torch, jax, both):
        assert reason.endswith("Import jax_amem first (before torch and before any JAX computation), or start "
                               "the program with `python -m jax_amem run script.py`.")


def test_launcher_preloads_the_interposer(fake, tmp_path):
    script = tmp_path / "program.py"
    script.write_text("import ctypes, os\n"
                      "lib = ctypes.CDLL('libnccl.so.2', mode=os.RTLD_NOLOAD)\n"
                      "print('FRONT', lib.amem_nccl_is_front())\n"
                      "import jax_amem; print('INSTALLED', jax_amem.nccl.is_installed())\n")
    import os
    done = subprocess.run([sys.executable, "-P", "-m", "jax_amem", "run", str(script)],
                          capture_output=True, text=True,
                          env={**os.environ, "JAX_AMEM_NCCL_LIBRARY": str(fake)})
    assert "FRONT 1" in done.stdout and "INSTALLED True" in done.stdout, done.stdout + done.stderr


def test_parallel_teardown_destroys_every_communicator_once(fake):
    seen = run_scenario(fake, """
        lib = interposer()
        comms = [init_ranks(lib, make_id(f"job-g{i}"), 1)[0] for i in range(4)]
        report = nccl.pause("recreate", teardown="parallel")
        try:
            nccl.pause("recreate", teardown="sideways")
            bad = None
        except ValueError as error:
            bad = str(error)
        nccl.resume()
        values = [all_reduce(lib, c, [i])[1] for i, c in enumerate(comms)]
        out(states=[c.state for c in report.communicators], bad=bad, values=values, log=fake_log())
    """)
    assert seen["states"] == ["paused"] * 4
    assert "teardown must be one of" in seen["bad"]
    assert seen["values"] == [[0.0], [1.0], [2.0], [3.0]]
    destroyed = sorted(line for line in seen["log"] if line.startswith("ncclCommDestroy"))
    assert destroyed == [f"ncclCommDestroy comm{i}.r0" for i in range(1, 5)]
    assert not [line for line in seen["log"] if line.startswith("FAULT")]
