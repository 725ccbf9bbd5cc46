"""Which strategy `auto` picks per communicator, by lineage, and what each pause reports.

Against the fake NCCL (tests/nccl_support/fake_nccl.cc), which emulates NCCL's own rule:
a child split from a parent whose config says splitShare=1 holds the parent's memory
manager, and ncclCommSuspend refuses (logs REFUSED) a communicator whose manager another
live one holds. So a wrong choice by the interposer shows up in the fake's log.
"""

import pytest

from nccl_support.fixtures import fake_with_suspend  # noqa: F401 (a fixture)
from nccl_support.harness import run_scenario

NEW_NCCL = {"FAKE_NCCL_VERSION": "23007"}  # has suspend, grouped (>= 2.30.3)



def suspends(log):
    return [line for line in log if line.startswith("ncclCommSuspend")]


def test_a_root_created_with_split_share_is_suspended(fake_with_suspend):
    # XLA's communicators: ncclCommInitRankConfig with splitShare=1, never split.
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comms = init_config(lib, make_id("xla-like"), 2, split_share=1)
        report = nccl.pause("auto")
        nccl.resume()
        out(rows=[c.__dict__ for c in report.communicators], log=fake_log())
    """, env=NEW_NCCL)
    assert [(r["last_strategy"], r["split_share"], r["shares_memory_manager"]) for r in seen["rows"]] \
        == [("suspend", True, False)] * 2
    assert all(r["why"].startswith("it has a memory manager of its own; by cost: ") for r in seen["rows"])
    # Each communicator is suspended on a thread of its own: the two calls come in either order.
    assert sorted(suspends(seen["log"])) == ["ncclCommSuspend comm1.r0 flags=1", "ncclCommSuspend comm2.r1 flags=1"]
    assert not [line for line in seen["log"] if line.startswith(("FAULT", "REFUSED"))]


def test_split_share_lineage_falls_back_to_recreate_then_suspends_once_recreated(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        parent = init_config(lib, make_id("parent"), 1, split_share=1)[0]
        child = split(lib, parent, 0)               # shares the parent's memory manager
        loner = init_config(lib, make_id("loner"), 1, split_share=1)[0]
        first = {c.key: c.__dict__ for c in nccl.pause("auto", teardown="destroy").communicators}
        nccl.resume()
        second = {c.key: c.last_strategy for c in nccl.pause("auto").communicators}
        nccl.resume()
        values = [all_reduce(lib, c, [3])[1] for c in (parent, child, loner)]
        out(first=first, second=second, values=values, log=fake_log())
    """, env=NEW_NCCL)
    first = seen["first"]
    child_key = next(k for k in first if "/" in k)
    parent_key = child_key.split("/")[0]
    assert child_key == parent_key + "/split0.c0"
    loner_key = next(k for k in first if k not in (parent_key, child_key))
    assert first[parent_key]["last_strategy"] == first[child_key]["last_strategy"] == "recreate"
    assert first[child_key]["parent_id"] == first[parent_key]["id"]
    assert "shares NCCL's memory manager with 1 other" in first[parent_key]["why"]
    assert first[loner_key]["last_strategy"] == "suspend"
    # Recreated communicators have managers of their own: the next pause suspends all three.
    assert seen["second"] == {parent_key: "suspend", child_key: "suspend", loner_key: "suspend"}
    assert seen["values"] == [[3.0]] * 3
    assert not [line for line in seen["log"] if line.startswith(("FAULT", "REFUSED"))]


def test_accounting_is_per_communicator(fake_with_suspend):
    # The fake reports 1000 x serial suspendable bytes and 500 persistent ones per communicator.
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        a = init_config(lib, make_id("a"), 1, split_share=1)[0]   # serial 1
        b = init_config(lib, make_id("b"), 1, split_share=1)[0]   # serial 2
        c = init_config(lib, make_id("c"), 1, split_share=1)[0]   # serial 3
        child = split(lib, c, 0)                                  # serial 4, shares with c
        report = nccl.pause("auto", teardown="destroy")
        nccl.resume()
        out(rows={r.id: [r.last_strategy, r.suspendable_bytes, r.bytes_freed, r.bytes_kept]
                  for r in report.communicators})
    """, env=NEW_NCCL)
    assert seen["rows"] == {
        "1": ["suspend", 1000, 1000, 500], "2": ["suspend", 2000, 2000, 500],
        # recreate frees everything NCCL counts (no driver on the CPU machine) and keeps nothing
        "3": ["recreate", 3000, 3500, 0], "4": ["recreate", 4000, 4500, 0]}


def test_explicit_suspend_on_a_shared_communicator_touches_nothing(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        parent = init_config(lib, make_id("p"), 1, split_share=1)[0]
        child = split(lib, parent, 0)
        other = init_config(lib, make_id("o"), 1, split_share=1)[0]
        before = len(fake_log())
        error = attempt(lambda: nccl.pause("suspend"))
        out(error=error, states=[c.state for c in nccl.communicators()], new_calls=fake_log()[before:])
    """, env=NEW_NCCL)
    assert seen["error"][0] == "NcclPauseError"
    assert "cannot suspend communicator" in seen["error"][1]
    assert "JAX_AMEM_NCCL_KEEP_SUSPENDABLE=1" in seen["error"][1]
    assert seen["states"] == ["active"] * 3
    assert seen["new_calls"] == []  # not even the suspendable one was touched


def test_keep_suspendable_rewrites_split_share_so_splits_stay_suspendable(fake_with_suspend):
    body = """
        lib = interposer()
        parent = init_config(lib, make_id("p"), 1, split_share=1)[0]
        child = split(lib, parent, 0)
        report = nccl.pause("auto")
        nccl.resume()
        lib_ = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD)
        out(strategies=[c.last_strategy for c in report.communicators],
            rewrites=lib_.amem_nccl_keep_suspendable_rewrites(),
            created=[l for l in fake_log() if l.startswith(("ncclCommInitRankConfig", "ncclCommSplit"))])
    """
    kept = run_scenario(fake_with_suspend, body, env={**NEW_NCCL, "JAX_AMEM_NCCL_KEEP_SUSPENDABLE": "1"})
    assert kept["strategies"] == ["suspend", "suspend"]
    assert kept["created"][0].endswith("splitShare=0")  # NCCL never saw splitShare=1
    assert kept["rewrites"] == 1
    default = run_scenario(fake_with_suspend, body, env=NEW_NCCL)
    assert default["strategies"] == ["recreate", "recreate"]
    assert default["created"][0].endswith("splitShare=1") and default["rewrites"] == 0


def test_keep_suspendable_call_must_come_before_shared_communicators(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        on = nccl.keep_suspendable()
        early = init_config(lib, make_id("early"), 1, split_share=1)[0]
        off = nccl.keep_suspendable(False)
        late = init_config(lib, make_id("late"), 1, split_share=1)[0]
        error = attempt(nccl.keep_suspendable)
        out(on=on, off=off, error=error, shares=[c.split_share for c in nccl.communicators()])
    """, env=NEW_NCCL)
    assert seen["on"] is True and seen["off"] is False
    assert seen["error"][0] == "NcclPauseError" and "before the first collective" in seen["error"][1]
    assert sorted(seen["shares"]) == [False, True]


def test_guard_holds_under_suspend_and_counts_refused_calls(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comm = init_config(lib, make_id("g"), 1, split_share=1)[0]
        nccl.pause("suspend")
        codes = [all_reduce(lib, comm, [1])[0] for _ in range(3)]
        message = lib.ncclGetLastError(comm).decode()
        count = ctypes.c_int()
        count_code = lib.ncclCommCount(comm, ctypes.byref(count))  # answered by the proxy
        refused = nccl.communicators()[0].refused_calls
        nccl.resume()
        out(codes=codes, message=message, count=[count_code, count.value], refused=refused,
            after=all_reduce(lib, comm, [2]), log=fake_log())
    """, env=NEW_NCCL)
    assert seen["codes"] == [5, 5, 5]
    assert "while it is paused by jax-amem" in seen["message"]
    assert seen["count"] == [0, 1]
    assert seen["refused"] == 3
    assert seen["after"] == [0, [2.0]]
    assert not [line for line in seen["log"] if line.startswith("FAULT")]  # NCCL never saw them


@pytest.mark.parametrize("overlap", ["threads", "serial"])
def test_ungrouped_suspends_overlap_or_run_in_key_order(fake_with_suspend, overlap):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comms = [init_config(lib, make_id(f"o{i}"), 1, split_share=1)[0] for i in range(4)]
        parent = init_config(lib, make_id("shared"), 1, split_share=1)[0]
        child = split(lib, parent, 0)
        report = nccl.pause("auto", teardown="destroy")
        nccl.resume()
        order = [c.id for c in nccl.communicators()]  # the collective (key) order
        out(strategies=[c.last_strategy for c in report.communicators], log=fake_log(), order=order)
    """, env={"FAKE_NCCL_VERSION": "22907", "JAX_AMEM_NCCL_OVERLAP": overlap})
    assert sorted(seen["strategies"]) == ["recreate"] * 2 + ["suspend"] * 4
    done = suspends(seen["log"])
    log = seen["log"]
    assert all(log[log.index(line) - 1] != "ncclGroupStart" for line in done)  # 2.29.7: no groups
    # Ids 1-4 are the fake's comm1-4 (their first pause): each suspended once.
    expected = [f"ncclCommSuspend comm{i}.r0 flags=1" for i in seen["order"] if i <= 4]
    if overlap == "serial":
        assert done == expected
    else:
        assert sorted(done) == sorted(expected)
    assert not [line for line in seen["log"] if line.startswith(("FAULT", "REFUSED"))]


def test_a_broken_communicator_names_recover_which_brings_it_back(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comm = init_ranks(lib, make_id("b"), 1)[0]
        os.environ["FAKE_FAIL_DESTROY"] = "1"
        error = attempt(lambda: nccl.pause("recreate", teardown="destroy"))
        del os.environ["FAKE_FAIL_DESTROY"]
        code, _ = all_reduce(lib, comm, [1])
        message = lib.ncclGetLastError(comm).decode()
        recovered = [c.state for c in nccl.recover()]
        out(error=error, code=code, message=message, recovered=recovered,
            after=all_reduce(lib, comm, [6]))
    """)
    assert seen["error"][0] == "NcclPauseError"
    assert seen["code"] == 5 and "jax_amem.nccl.recover()" in seen["message"]
    assert seen["recovered"] == ["active"]
    assert seen["after"] == [0, [6.0]]


# The fake's communicators hold 1000, 2000 and 3000 suspendable bytes (1000 x creation order).
# suspend_s_per_gib = GiB / 1000 bytes: 1000 bytes suspend in 1 s; learn=0 keeps the rates as set.
ONE_SECOND_PER_1000 = str(2**30 / 1000)


def auto_on_three(fake, teardown_s, init_s):
    """`auto` on three one-rank communicators (1000, 2000, 3000 bytes) at the rates given."""
    return run_scenario(fake, """
        lib = interposer()
        comms = [init_config(lib, make_id(f"l{i}"), 1, split_share=1)[0] for i in range(3)]
        os.environ["JAX_AMEM_NCCL_COST"] = (
            "suspend_s_per_gib=%s,resume_s_per_gib=0,teardown_s=%s,init_s=%s,learn=0")
        report = nccl.pause("auto")
        nccl.resume()
        out(rows=[(c.suspendable_bytes, c.last_strategy, c.why) for c in report.communicators],
            rates=nccl.cost_rates(),
            after=[all_reduce(lib, c, [i])[1] for i, c in enumerate(comms)], log=fake_log())
    """ % (ONE_SECOND_PER_1000, teardown_s, init_s), env=NEW_NCCL)


def test_auto_recreates_the_largest_communicators_where_that_costs_less(fake_with_suspend):
    # recreate(k) = 0.3 s + 1 s per communicator; suspend = 1 s per 1000 bytes; at once: the
    # longer plus half the shorter. Suspend all: 6 s. Recreate the 3000: max(3, 1.3) + 0.65 =
    # 3.65 s. The 3000 and 2000: max(1, 2.3) + 0.5 = 2.8 s. All three: 3.3 s. So the two largest.
    seen = auto_on_three(fake_with_suspend, 0.3, 1)
    chosen = sorted((bytes_, strategy) for bytes_, strategy, _ in seen["rows"])
    assert chosen == [(1000, "suspend"), (2000, "recreate"), (3000, "recreate")]
    for _, _, why in seen["rows"]:
        assert why.startswith("it has a memory manager of its own; by cost: ")
        assert "this process: suspend 1000 bytes and recreate 2 communicator(s), estimated 2.80 s for pause + resume, " \
            "against 6.00 s suspending all it can and 3.30 s recreating" in why
        assert "the starting rate" in why
    assert seen["rates"]["learn"] is False and seen["rates"]["teardown_samples"] == 0
    assert seen["after"] == [[0.0], [1.0], [2.0]]
    assert len([line for line in seen["log"] if line.startswith("ncclCommDestroy")]) == 2
    assert len([line for line in seen["log"] if line.startswith("ncclCommSuspend")]) == 1
    assert not [line for line in seen["log"] if line.startswith(("FAULT", "REFUSED"))]


def test_auto_suspends_when_recreating_saves_less_than_a_tenth(fake_with_suspend):
    # Suspend all: 6 s. Recreate all: 5.41 s (the teardown alone), less than 10% less: suspend
    # (it keeps the connections a recreate makes again at the first collective). Recreating
    # the largest one or two: max(3, 5.41) + 1.5 and max(1, 5.41) + 0.5, longer still.
    seen = auto_on_three(fake_with_suspend, 5.41, 0)
    assert [strategy for _, strategy, _ in seen["rows"]] == ["suspend"] * 3
    assert seen["after"] == [[0.0], [1.0], [2.0]]


def test_auto_on_the_starting_rates_suspends_small_communicators_and_learns_from_recreates(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comms = [init_config(lib, make_id(f"l{i}"), 1, split_share=1)[0] for i in range(2)]
        start = nccl.cost_rates()
        auto = [c.last_strategy for c in nccl.pause("auto").communicators]
        nccl.resume()
        nccl.pause("recreate")
        nccl.resume()
        learned = nccl.cost_rates()
        reset = nccl.cost_rates(reset=True)
        out(start=start, auto=auto, learned=learned, reset=reset)
    """, env=NEW_NCCL)
    start, learned, reset = seen["start"], seen["learned"], seen["reset"]
    assert (start["suspend_s_per_gib"], start["resume_s_per_gib"], start["teardown_s"], start["init_s"]) \
        == (0.7, 0.35, 0.3, 0.035)
    assert seen["auto"] == ["suspend", "suspend"]
    # The fake's suspends (3000 bytes) are below the 64 MiB a rate is learned from; the
    # recreate's teardown and re-initialisation are measured (fake: about no time at all).
    assert (learned["suspend_samples"], learned["resume_samples"]) == (0, 0)
    assert (learned["teardown_samples"], learned["init_samples"]) == (1, 1)
    assert learned["teardown_s"] < 0.3 and learned["init_s"] < 0.035
    assert reset == start


@pytest.mark.parametrize("value, named", [
    ("suspend_s_per_gib=fast", "'suspend_s_per_gib=fast' is not KEY=NUMBER"),
    ("teardown=0.3", "unknown key or value in 'teardown=0.3'"),
    ("init_s=-1", "'init_s=-1' is not KEY=NUMBER with a number >= 0"),
    ("learn=2", "unknown key or value in 'learn=2'"),
])
def test_an_unreadable_cost_variable_is_named_and_nothing_is_paused(fake_with_suspend, value, named):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comms = init_config(lib, make_id("x"), 2, split_share=1)
        os.environ["JAX_AMEM_NCCL_COST"] = %r
        error = attempt(lambda: nccl.pause("auto"))
        rates = attempt(lambda: nccl.cost_rates())
        states = [c.state for c in nccl.communicators()]
        recreated = [c.last_strategy for c in nccl.pause("recreate").communicators]  # no cost read
        nccl.resume()
        out(error=error, rates=rates, states=states, recreated=recreated, log=fake_log())
    """ % value, env=NEW_NCCL)
    assert seen["error"][0] == "NcclPauseError" and seen["error"][1].startswith("JAX_AMEM_NCCL_COST: ")
    assert named in seen["error"][1] and "Expected comma-separated KEY=NUMBER" in seen["error"][1]
    assert seen["rates"][0] == "NcclArgumentError" and named in seen["rates"][1]
    assert seen["states"] == ["active", "active"]
    assert seen["recreated"] == ["recreate", "recreate"]
    assert not [line for line in seen["log"] if line.startswith("ncclCommSuspend")]


def test_without_an_agreement_a_communicator_with_ranks_elsewhere_is_not_chosen_by_cost(fake_with_suspend):
    # Planning one rank of a two-rank communicator: its other rank could live in another process,
    # which without an agreement could choose otherwise and leave both waiting.
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comms = init_config(lib, make_id("x"), 2, split_share=1)
        os.environ["JAX_AMEM_NCCL_COST"] = "suspend_s_per_gib=1e9,teardown_s=0,init_s=0,learn=0"
        control = nccl._api._require()
        first = nccl.communicators()[0].id
        alone = control.plan([first], "auto")
        agreed = control.plan([first], "auto", agreed=True)
        both = control.plan([], "auto")
        out(alone=alone, agreed=agreed, both=both)
    """, env=NEW_NCCL)
    assert seen["alone"][0]["strategy"] == "suspend"
    assert seen["alone"][0]["why"] == ("it has a memory manager of its own; not chosen by cost: without an "
                                        "agreement another rank could choose otherwise")
    assert seen["agreed"][0]["strategy"] == "recreate"
    assert [entry["strategy"] for entry in seen["both"]] == ["recreate", "recreate"]
