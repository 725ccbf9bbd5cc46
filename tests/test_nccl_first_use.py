"""A communicator's first collective after an initialisation is timed (NCCL connects there),
and `auto` counts that time as part of recreating it.

Against the fake NCCL (tests/nccl_support/fake_nccl.cc), which sleeps FAKE_NCCL_CONNECT_MS
at a communicator's first collective, in the call or at the end of the group it ran in, as
NCCL's runtime connect does. The GPU proof is `benchmarks/nccl_pause.py --strategies` at 16
channels, where the first collective after a recreate takes 0.2-0.8 s a communicator.
"""

from nccl_support.fixtures import fake_with_suspend  # noqa: F401 (a fixture)
from nccl_support.harness import run_scenario

NEW_NCCL = {"FAKE_NCCL_VERSION": "23007"}  # has suspend, grouped (>= 2.30.3)


def connects(ms: int) -> dict:
    return {**NEW_NCCL, "FAKE_NCCL_CONNECT_MS": str(ms)}


def test_the_first_collective_is_timed_once_and_again_after_a_recreate_not_after_a_suspend(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comms = [init_ranks(lib, make_id(f"c{i}"), 1)[0] for i in range(2)]
        before = by_creation("connect_seconds")
        all_reduce(lib, comms[0], [1])
        first = by_creation("connect_seconds")
        all_reduce(lib, comms[0], [2])       # connected: not timed again
        second = by_creation("connect_seconds")
        nccl.pause("recreate"); nccl.resume()
        os.environ["FAKE_NCCL_CONNECT_MS"] = "300"
        after_resume = by_creation("connect_seconds")  # nothing ran yet: the last measurement stays
        all_reduce(lib, comms[0], [3])
        recreated = by_creation("connect_seconds")
        nccl.pause("suspend"); nccl.resume()
        all_reduce(lib, comms[0], [4])       # a suspend keeps the connections
        suspended = by_creation("connect_seconds")
        out(before=before, first=first, second=second, after_resume=after_resume,
            recreated=recreated, suspended=suspended, result=all_reduce(lib, comms[0], [5]))
    """, env=connects(150))
    assert seen["before"] == [-1.0, -1.0]
    assert 0.15 <= seen["first"][0] < 1.0 and seen["first"][1] == -1.0
    assert seen["second"] == seen["first"]
    assert seen["after_resume"] == seen["first"]
    assert 0.3 <= seen["recreated"][0] < 1.5 and seen["recreated"][1] == -1.0
    assert seen["suspended"] == seen["recreated"]
    assert seen["result"] == [0, [5.0]]


def test_first_collectives_in_a_group_share_the_time_of_the_outermost_end(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comms = [init_ranks(lib, make_id(f"g{i}"), 1)[0] for i in range(3)]
        assert lib.ncclGroupStart() == 0
        assert lib.ncclGroupStart() == 0
        all_reduce(lib, comms[0], [1])
        all_reduce(lib, comms[1], [2])
        assert lib.ncclGroupEnd() == 0
        inner = by_creation("connect_seconds")  # NCCL connects at the outermost end
        assert lib.ncclGroupEnd() == 0
        outer = by_creation("connect_seconds")
        unmatched = lib.ncclGroupEnd()       # NCCL's answer, passed on
        out(inner=inner, outer=outer, unmatched=unmatched,
            log=[line for line in fake_log() if line.startswith("ncclGroup")])
    """, env=connects(200))
    assert seen["inner"] == [-1.0, -1.0, -1.0]
    shared = seen["outer"][0]
    assert 0.2 <= shared < 1.0                      # 2 x 200 ms, shared between the two
    assert seen["outer"] == [shared, shared, -1.0]
    assert seen["unmatched"] == 0
    assert seen["log"] == ["ncclGroupStart", "ncclGroupStart", "ncclGroupEnd", "ncclGroupEnd", "ncclGroupEnd"]


def test_a_nonblocking_first_collective_is_timed_until_the_communicator_answers_done(fake_with_suspend):
    # As XLA with --xla_gpu_nccl_blocking_communicators=false: the call returns ncclInProgress,
    # the connection runs on, and XLA polls ncclCommGetAsyncError until it answers done.
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comms = [init_ranks(lib, make_id(f"n{i}"), 1)[0] for i in range(3)]
        def until_done(comm):
            state = ctypes.c_int(7)
            while state.value == 7:
                assert lib.ncclCommGetAsyncError(comm, ctypes.byref(state)) == 0
            return state.value
        code = all_reduce(lib, comms[0], [1])[0]
        in_flight = by_creation("connect_seconds")
        done = until_done(comms[0])
        alone = by_creation("connect_seconds")
        assert lib.ncclGroupStart() == 0
        grouped = [all_reduce(lib, c, [2])[0] for c in comms[1:]]
        group_end = lib.ncclGroupEnd()
        states = [until_done(c) for c in comms[1:]]
        out(code=code, in_flight=in_flight, done=done, alone=alone, grouped=grouped,
            group_end=group_end, states=states, after=by_creation("connect_seconds"))
    """, env={**connects(150), "FAKE_NCCL_NONBLOCKING": "1"})
    assert seen["code"] == 7 and seen["in_flight"] == [-1.0, -1.0, -1.0] and seen["done"] == 0
    assert 0.15 <= seen["alone"][0] < 1.0 and seen["alone"][1:] == [-1.0, -1.0]
    assert seen["grouped"] == [0, 0] and seen["group_end"] == 7 and seen["states"] == [0, 0]
    assert seen["after"][0] == seen["alone"][0]
    assert all(0.15 <= shared < 1.0 for shared in seen["after"][1:])   # 2 x 150 ms, shared


# The fake's communicators hold 1000, 2000 and 3000 suspendable bytes (1000 x creation order):
# at GiB / 10000 s per GiB they suspend in 0.1, 0.2 and 0.3 s; learn=0 keeps the rates as set.
RATES = f"suspend_s_per_gib={2**30 / 10000},resume_s_per_gib=0,teardown_s=0.03,init_s=0.1,learn=0"


def auto_after_first_collectives(fake, connect_ms: int) -> dict:
    return run_scenario(fake, """
        lib = interposer()
        comms = [init_config(lib, make_id(f"l{i}"), 1, split_share=1)[0] for i in range(3)]
        for i, c in enumerate(comms):
            all_reduce(lib, c, [i])
        os.environ["JAX_AMEM_NCCL_COST"] = %r
        report = nccl.pause("auto")
        nccl.resume()
        out(rows=[(c.suspendable_bytes, c.last_strategy, c.why) for c in report.communicators],
            after=[all_reduce(lib, c, [i])[1] for i, c in enumerate(comms)])
    """ % RATES, env=connects(connect_ms))


def test_auto_recreates_the_largest_where_their_connections_are_quick(fake_with_suspend):
    # Suspend all: 0.6 s. Recreate the two largest: max(0.1, 0.03 + 0.2) + 0.05 = 0.28 s,
    # plus their first collectives' microseconds: the two largest, as without connections.
    seen = auto_after_first_collectives(fake_with_suspend, 0)
    chosen = sorted((bytes_, strategy) for bytes_, strategy, _ in seen["rows"])
    assert chosen == [(1000, "suspend"), (2000, "recreate"), (3000, "recreate")]
    assert seen["after"] == [[0.0], [1.0], [2.0]]


def test_auto_suspends_where_connecting_again_costs_more_than_a_recreate_saves(fake_with_suspend):
    # The same, each communicator's first collective 0.2 s: recreating the 3000 alone costs
    # max(0.3, 0.13) + 0.065 + 0.2 = 0.565 s, more than 90% of suspending all (0.6 s); two
    # or three cost more still. So every one suspends, and the why says what it counted.
    seen = auto_after_first_collectives(fake_with_suspend, 200)
    assert [strategy for _, strategy, _ in seen["rows"]] == ["suspend"] * 3
    for _, _, why in seen["rows"]:
        assert "; recreating includes connecting again at the first collective, " in why
        assert ", its first collective 2" in why   # 200-something ms, its own
    assert seen["after"] == [[0.0], [1.0], [2.0]]
