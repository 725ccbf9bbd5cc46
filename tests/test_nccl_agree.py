"""Processes agree on a pause over the jax.distributed key-value store before any NCCL call.

The merge is checked as a pure function; the store, the barrier and the timeout with two
real jax.distributed processes on CPU, each in front of the fake NCCL (whose log shows
whether NCCL was reached at all).
"""

import pytest

from jax_amem.nccl._agree import agreed_next_ids, merge_plans
from jax_amem.nccl._control import NcclPauseError
from nccl_support.fixtures import fake_with_suspend  # noqa: F401 (a fixture)
from nccl_support.harness import run_job

NEW_NCCL = {"FAKE_NCCL_VERSION": "23007"}


def entry(key, strategy, refused=False, why="", nranks=2):
    return {"id": 1, "key": key, "rank": 0, "nranks": nranks, "strategy": strategy, "refused": refused, "why": why}


def test_merge_takes_recreate_where_any_rank_must():
    # A split with NCCL_SPLIT_NOCOLOR leaves the parent shared on some ranks only.
    mine = [entry("parent", "suspend"), entry("other", "suspend")]
    theirs = [entry("parent", "recreate"), entry("parent/split0.c0", "recreate"), entry("other", "suspend")]
    assert merge_plans(mine, [{"plan": mine}, {"plan": theirs}]) == ["recreate", "suspend"]


def test_merge_stops_every_process_on_a_refusal_anywhere():
    mine = [entry("k", "suspend")]
    theirs = [entry("k", "suspend", refused=True, why="cannot suspend communicator k: shares")]
    with pytest.raises(NcclPauseError, match="nothing was paused: process 1: cannot suspend"):
        merge_plans(mine, [{"plan": mine}, {"plan": theirs}])


def test_merge_with_nothing_anywhere_is_empty():
    assert merge_plans([], [{"plan": []}, {"plan": []}]) == []



def test_next_ids_come_from_rank_0_of_each_communicator_to_recreate():
    mine = [dict(entry("a", "recreate"), rank=1), dict(entry("b", "suspend"), rank=1),
            dict(entry("c", "suspend"), rank=1)]
    theirs = [dict(entry("a", "recreate"), next_id="ab" * 128), dict(entry("b", "suspend"), next_id=""),
              dict(entry("c", "recreate"), next_id="")]
    # c: recreated after the merge, but rank 0 had planned to suspend it and made no id.
    strategies = merge_plans(mine, [{"plan": mine}, {"plan": theirs}])
    assert strategies == ["recreate", "suspend", "recreate"]
    assert agreed_next_ids(mine, strategies, [{"plan": mine}, {"plan": theirs}]) == [
        bytes([0xAB]) * 128, None, None]


def test_an_id_no_plan_read_here_can_hand_to_every_rank_goes_over_the_communicator():
    """A communicator with a rank outside the plans read (a cross-host link's rollout, a process
    without jax.distributed): rank 0 does not use the id it made for its plan, so it joins the
    broadcast its peer waits for instead of tearing the communicator down alone."""
    alone = [dict(entry("link", "recreate"), next_id="ab" * 128)]
    assert agreed_next_ids(alone, ["recreate"], [{"plan": alone}]) == [None]
    peer = [dict(entry("link", "recreate"), rank=1)]
    assert agreed_next_ids(peer, ["recreate"], [{"plan": peer}]) == [None]
    # Both ranks read: the id travels with the plans.
    assert agreed_next_ids(peer, ["recreate"], [{"plan": alone}, {"plan": peer}]) == [bytes([0xAB]) * 128]
    # A communicator of one rank needs no peer.
    single = [dict(entry("one", "recreate", nranks=1), next_id="cd" * 128)]
    assert agreed_next_ids(single, ["recreate"], [{"plan": single}]) == [bytes([0xCD]) * 128]


def test_two_processes_without_an_agreement_exchange_the_id_over_the_communicator(fake_with_suspend):
    """Each process pauses alone (agree=False, as a trainer and a rollout joined only by their
    link do): rank 0 made an id for its plan, but no plan carried it to rank 1, so both ranks
    take it over the communicator before it is destroyed (on the H200:
    tests/test_swap_nccl.py's pause between swaps, where rank 1 waited for a broadcast rank 0
    never joined)."""
    seen = run_job(fake_with_suspend, """
        lib = interposer()
        comm = init_config(lib, make_id("link-key"), 2, split_share=1, ranks=[PROCESS])[0]
        before = len(fake_log())
        report = nccl.pause("recreate", agree=False)
        restored = nccl.resume(agree=False)
        out(calls=fake_log()[before:], rows=[(c.state, c.last_strategy) for c in report.communicators],
            resumed=[c.state for c in restored.communicators], after=all_reduce(lib, comm, [PROCESS])[1])
    """, env=NEW_NCCL)
    # The fake's collectives stay in their process: it marks rank 1's broadcast, whose root is in
    # the other process, as a FAULT; what matters is that each rank joins it before its teardown.
    for process, result in enumerate(seen):
        assert result["rows"] == [["paused", "recreate"]] and result["resumed"] == ["active"], result
        calls = result["calls"]
        broadcast = [k for k, line in enumerate(calls) if f"ncclBroadcast comm1.r{process} " in line]
        destroy = calls.index(f"ncclCommDestroy comm1.r{process}")
        assert broadcast and broadcast[0] < destroy, calls  # rank 0 too: before its teardown
        # Rank 0 sends the id it made for its plan, and makes no second one (whose bootstrap
        # root would wait for ranks that never come); rank 1 makes none.
        assert len([line for line in calls if line.startswith("ncclGetUniqueId")]) == 1 - process, calls
        assert result["after"] == [float(process)]


def test_recreate_ids_travel_in_the_agreement_and_one_snapshot_per_call(fake_with_suspend):
    seen = run_job(fake_with_suspend, """
        from jax_amem.nccl import _control
        snapshots = []
        real_snapshot = _control.Control.snapshot
        _control.Control.snapshot = lambda self: snapshots.append(1) or real_snapshot(self)
        lib = interposer()
        comm = init_config(lib, make_id("two-process-key"), 2, split_share=1, ranks=[PROCESS])[0]
        before = len(fake_log())
        report = nccl.pause("recreate")
        paused_snapshots = len(snapshots)
        restored = nccl.resume()
        out(calls=fake_log()[before:], pause_snapshots=paused_snapshots,
            resume_snapshots=len(snapshots) - paused_snapshots,
            rows=[(c.state, c.last_strategy) for c in report.communicators],
            resumed=[c.state for c in restored.communicators],
            after=all_reduce(lib, comm, [PROCESS])[1])
    """, env=NEW_NCCL)
    made, used = seen[0]["calls"][0], seen[1]["calls"]
    assert made.startswith("ncclGetUniqueId fake-id-")  # rank 0's process made it for its plan
    new_id = made.split()[-1]
    # Process 1 never made an id nor ran a collective: the agreement carried rank 0's id.
    assert used == ["ncclCommDestroy comm1.r1", "ncclGroupStart",
                    f"ncclCommInitRankConfig comm2.r1 id={new_id} splitShare=0", "ncclGroupEnd"]
    assert not [line for line in seen[0]["calls"] if "Broadcast" in line or "AllReduce" in line]
    for process, result in enumerate(seen):
        assert result["pause_snapshots"] == 1 and result["resume_snapshots"] == 1
        assert result["rows"] == [["paused", "recreate"]] and result["resumed"] == ["active"]
        assert result["after"] == [float(process)]


def test_agreed_pause_and_resume_on_two_processes(fake_with_suspend):
    seen = run_job(fake_with_suspend, """
        lib = interposer()
        comm = init_config(lib, make_id(f"p{PROCESS}"), 1, split_share=1)[0]
        report = nccl.pause("auto")
        states = [c.state for c in nccl.communicators()]
        restored = nccl.resume()
        alone = nccl.pause("auto", agree=False)
        nccl.resume(agree=False)
        out(strategies=[c.last_strategy for c in report.communicators], states=states,
            after=all_reduce(lib, comm, [PROCESS])[1],
            agreed=[report.agree_seconds > 0, restored.agree_seconds > 0, alone.agree_seconds])
    """, env=NEW_NCCL)
    for process, result in enumerate(seen):
        assert result == {"strategies": ["suspend"], "states": ["paused"], "after": [float(process)],
                          "agreed": [True, True, 0.0]}


def test_a_refusal_on_one_process_stops_both_before_anything_is_touched(fake_with_suspend):
    seen = run_job(fake_with_suspend, """
        lib = interposer()
        comm = init_config(lib, make_id("shared-key"), 2, split_share=1, ranks=[PROCESS])[0]
        if PROCESS == 0:
            child = split(lib, comm, 0)   # on process 0 only: its parent shares, process 1's does not
        before = len(fake_log())
        error = attempt(lambda: nccl.pause("suspend", ids=[1]))
        out(error=error, states=[c.state for c in nccl.communicators()], new_calls=fake_log()[before:])
    """, env=NEW_NCCL)
    for result in seen:
        assert result["error"][0] == "NcclPauseError"
        assert "nothing was paused: process 0: cannot suspend" in result["error"][1]
        assert set(result["states"]) == {"active"} and result["new_calls"] == []


def test_a_process_that_never_joins_leaves_every_communicator_active(fake_with_suspend):
    seen = run_job(fake_with_suspend, """
        import time
        lib = interposer()
        comm = init_config(lib, make_id(f"t{PROCESS}"), 1, split_share=1)[0]
        if PROCESS == 0:
            before = len(fake_log())
            start = time.perf_counter()
            error = attempt(lambda: nccl.pause("auto", timeout=2))
            out(error=error, seconds=time.perf_counter() - start, new_calls=fake_log()[before:])
        else:
            time.sleep(4)  # never calls pause
        out(states=[c.state for c in nccl.communicators()], after=all_reduce(lib, comm, [5])[1],
            paused_ids=nccl.paused_ids())
    """, env=NEW_NCCL)
    first = seen[0]
    assert first["error"][0] == "NcclPauseError"
    assert "timed out after 2 s" in first["error"][1] and "Nothing was changed" in first["error"][1]
    assert "[1]" in first["error"][1]  # names the process that did not come
    assert 1.5 < first["seconds"] < 30
    assert first["new_calls"] == []
    for result in seen:
        assert result["states"] == ["active"] and result["after"] == [5.0] and result["paused_ids"] == []


def test_paused_with_no_communicator_anywhere_is_a_no_op(fake_with_suspend):
    seen = run_job(fake_with_suspend, """
        with nccl.paused() as p:
            inside = len(p.info.communicators)
        out(inside=inside, paused=nccl.paused_ids())
    """)
    assert seen == [{"inside": 0, "paused": []}] * 2


def test_only_one_process_with_communicators_still_resumes_together(fake_with_suspend):
    seen = run_job(fake_with_suspend, """
        lib = interposer()
        if PROCESS == 0:
            comm = init_config(lib, make_id("only-here"), 1, split_share=1)[0]
        with nccl.paused() as p:
            strategies = [c.last_strategy for c in p.info.communicators]
        out(strategies=strategies, states=[c.state for c in nccl.communicators()])
    """, env=NEW_NCCL)
    assert seen == [{"strategies": ["suspend"], "states": ["active"]},
                    {"strategies": [], "states": []}]


def test_whole_process_pause_joins_the_agreement_without_communicators_of_its_own(fake_with_suspend):
    # jax_amem.pause() pauses NCCL as a collective: process 1 has no communicator, and before it
    # took part the other process waited at the barrier until its timeout.
    seen = run_job(fake_with_suspend, """
        import time
        lib = interposer()
        if PROCESS == 0:
            comm = init_config(lib, make_id("only-on-0"), 1, split_share=1)[0]
        start = time.perf_counter()
        info = jax_amem.pause()
        inside = [c.state for c in nccl.communicators()]
        restored = jax_amem.resume()
        out(nccl_paused=info.nccl_paused, nccl_resumed=restored.nccl_resumed, inside=inside,
            after=[c.state for c in nccl.communicators()], fast=time.perf_counter() - start < 20)
    """, env=NEW_NCCL)
    assert seen == [{"nccl_paused": True, "nccl_resumed": True, "inside": ["paused"], "after": ["active"],
                     "fast": True},
                    {"nccl_paused": True, "nccl_resumed": True, "inside": [], "after": [], "fast": True}]


def test_whole_process_pause_with_no_communicator_anywhere_owes_no_nccl_resume(fake_with_suspend):
    seen = run_job(fake_with_suspend, """
        info = jax_amem.pause()
        restored = jax_amem.resume()
        out(nccl_paused=info.nccl_paused, nccl_resumed=restored.nccl_resumed)
    """)
    assert seen == [{"nccl_paused": False, "nccl_resumed": False}] * 2


def test_a_thousand_agreements_read_only_their_own_round_and_keep_the_store_bounded():
    # Entries live in two overwritten slots: every round must read that round's payloads
    # (never the slot's older entry), with one process late now and then, a refusal travelling
    # in some rounds, and the store holding 2 entries per process at the end.
    seen = run_job(None, """
        import time
        from jax_amem.nccl import _agree
        peers = _agree.peers()
        wrong, refusals = [], 0
        for r in range(1000):
            if r % 2:
                peers.meet("resume", 30)
                continue
            if r % 97 == PROCESS:
                time.sleep(0.02)  # late, inside the timeout
            refused = PROCESS == 1 and r % 10 == 0
            plan = [{"id": 1, "key": f"k{r}", "rank": PROCESS, "strategy": "suspend",
                     "refused": refused, "why": f"no at {r}"}]
            everyone = peers.exchange("pause", {"plan": plan, "round": r, "process": PROCESS}, 30)
            if [(e["round"], e["process"]) for e in everyone] != [(r, 0), (r, 1)]:
                wrong.append(r)
            try:
                _agree.merge_plans(plan, everyone)
            except nccl.NcclPauseError as error:
                refusals += f"process 1: no at {r}" in str(error)
        keys = sorted(key for key, _ in job.key_value_dir_get("jax_amem/nccl/"))
        out(wrong=wrong, refusals=refusals, keys=keys)
    """, timeout=300)
    slots = [f"jax_amem/nccl/agree/{slot}/{p}" for slot in (0, 1) for p in (0, 1)]
    assert seen == [{"wrong": [], "refusals": 100, "keys": slots}] * 2


def test_a_process_that_stops_after_many_rounds_is_named_not_read_from_its_older_entry():
    # Its slot still holds its entry from two agreements before: that is not this agreement.
    # When it comes at last, its call fails at once instead of waiting out its own timeout, and
    # as the other started no agreement meanwhile, the next one finds them in step.
    seen = run_job(None, """
        import time
        from jax_amem.nccl import _agree
        peers = _agree.peers()
        for r in range(20):
            peers.exchange("pause", {"r": r}, 30)
        if PROCESS == 1:
            time.sleep(4)  # late: comes after process 0 timed out
        start = time.perf_counter()
        error = attempt(lambda: peers.exchange("pause", {"r": 20}, 2 if PROCESS == 0 else 30))
        out(error=error, seconds=time.perf_counter() - start)
        if PROCESS == 0:
            time.sleep(5)  # starts no other agreement before process 1 came
        out(next=peers.exchange("pause", {"r": 21, "p": PROCESS}, 30))  # in step again
    """, timeout=120)
    early, late = seen
    assert early["error"][0] == "NcclPauseError" and 1.5 < early["seconds"] < 30
    assert "agreement 21; not seen: process(es) [1]" in early["error"][1]
    assert "Nothing was changed" in early["error"][1]
    assert late["error"][0] == "NcclPauseError" and late["seconds"] < 2
    assert "every process set its entry: this one came after the others had timed out" in late["error"][1]
    assert early["next"] == late["next"] == [{"r": 21, "p": 0}, {"r": 21, "p": 1}]


def test_processes_out_of_step_are_told_so_instead_of_reading_another_call_s_entry():
    # Process 0 pauses while process 1 resumes: the pause reads an entry of another kind and
    # refuses it, naming what process 1 is doing (resume reads nothing and cannot tell).
    seen = run_job(None, """
        from jax_amem.nccl import _agree
        peers = _agree.peers()
        peers.exchange("pause", {}, 30)
        if PROCESS == 0:
            out(error=attempt(lambda: peers.exchange("pause", {"plan": []}, 30)))
        else:
            out(error=attempt(lambda: peers.meet("resume", 30)))
    """)
    assert seen[1] == {"error": None}
    assert seen[0]["error"][0] == "NcclPauseError"
    assert ("pause() is agreement 2 of this process, but the job is out of step "
            "(process 1: agreement 2 (resume))") in seen[0]["error"][1]


BAD_TIMEOUTS = "[0, -1, float('nan'), float('inf'), '60', None, True, 1e9]"


def test_bad_timeouts_are_refused_before_the_agreement_and_leave_the_job_in_step(fake_with_suspend):
    """A bad timeout (0, negative, NaN, inf, a string...) used to reach the store: NaN, inf and
    strings failed inside the barrier call and read as "timed out after nan s", and every refused
    call had used up one agreement number, so the next good pause found the job out of step."""
    seen = run_job(fake_with_suspend, f"""
        lib = interposer()
        comm = init_config(lib, make_id(f"b{{PROCESS}}"), 1, split_share=1)[0]
        errors = []
        if PROCESS == 0:
            before = len(fake_log())
            for bad in {BAD_TIMEOUTS}:
                errors.append(attempt(lambda: nccl.pause("auto", timeout=bad)))
            errors.append(attempt(lambda: nccl.recover(timeout=float('nan'))))
            untouched = fake_log()[before:] == [] and [c.state for c in nccl.communicators()] == ["active"]
        else:
            untouched = True
        report = nccl.pause("auto", timeout=30)
        if PROCESS == 0:
            for bad in {BAD_TIMEOUTS}:
                errors.append(attempt(lambda: nccl.resume(timeout=bad)))
        nccl.resume(timeout=30)
        out(errors=errors, untouched=untouched, paused=[c.last_strategy for c in report.communicators],
            after=all_reduce(lib, comm, [PROCESS])[1])
    """, env=NEW_NCCL)
    first = seen[0]
    kinds = [e[0] for e in first["errors"]]
    assert kinds == ["NcclArgumentError"] * 17, first["errors"]
    assert "jax_amem.nccl.pause(timeout=nan): timeout must be a finite number of seconds, above 0" in first["errors"][2][1]
    assert "jax_amem.nccl.pause(timeout='60'): timeout is a number of seconds, not str" in first["errors"][4][1]
    assert "jax_amem.nccl.recover(timeout=nan)" in first["errors"][8][1]
    assert "jax_amem.nccl.resume(timeout=-1)" in first["errors"][10][1]
    for process, result in enumerate(seen):
        assert result["untouched"] and result["paused"] == ["suspend"] and result["after"] == [float(process)]


def test_a_call_while_an_async_resume_runs_is_refused_and_the_job_stays_in_step(fake_with_suspend):
    """resume(async_=True) agrees on its own thread: a pause, resume or recover made meanwhile took
    the next agreement number first (or ran a second resume), putting this process out of step."""
    seen = run_job(fake_with_suspend, """
        import time
        lib = interposer()
        comm = init_config(lib, make_id(f"a{PROCESS}"), 1, split_share=1)[0]
        nccl.pause("auto")
        errors = []
        if PROCESS == 0:
            future = nccl.resume(async_=True)
            errors = [attempt(lambda: nccl.resume()), attempt(lambda: nccl.pause("auto")),
                      attempt(lambda: nccl.recover())]
            future.result()
        else:
            time.sleep(1)  # process 0's resume waits at the barrier meanwhile
            nccl.resume()
        nccl.pause("auto")
        nccl.resume()
        out(errors=errors, states=[c.state for c in nccl.communicators()],
            after=all_reduce(lib, comm, [PROCESS])[1])
    """, env=NEW_NCCL)
    assert [e[0] for e in seen[0]["errors"]] == ["NcclPauseError"] * 3, seen[0]["errors"]
    for verb, error in zip(("resume", "pause", "recover"), seen[0]["errors"]):
        assert f"jax_amem.nccl.{verb}() while a resume is still running" in error[1]
        assert "wait for that Future first" in error[1]
    for process, result in enumerate(seen):
        assert result["states"] == ["active"] and result["after"] == [float(process)]


def test_paused_resumes_with_the_timeout_it_was_given(fake_with_suspend):
    """nccl.paused(timeout=2) resumed with the default 60 s: a process that never resumed held the
    others a minute instead of 2 s."""
    seen = run_job(fake_with_suspend, """
        import time
        lib = interposer()
        comm = init_config(lib, make_id(f"c{PROCESS}"), 1, split_share=1)[0]
        if PROCESS == 0:
            def leave():
                with nccl.paused(timeout=2):
                    pass
            start = time.perf_counter()
            error = attempt(leave)
            out(error=error, seconds=time.perf_counter() - start)
        else:
            nccl.pause("auto", timeout=2)
            time.sleep(12)  # never resumes
            out(error=None, seconds=0)
    """, env=NEW_NCCL)
    assert seen[0]["error"][0] == "NcclPauseError" and "timed out after 2 s" in seen[0]["error"][1]
    assert seen[0]["seconds"] < 10
