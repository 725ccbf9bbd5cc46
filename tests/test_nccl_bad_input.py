"""Bad selections are refused with a clear error before anything is touched; empty ones are no-ops."""


from nccl_support.fixtures import fake_with_suspend  # noqa: F401 (a fixture)
from nccl_support.harness import run_scenario



def test_bad_ids_are_refused_and_nothing_is_touched(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comms = init_config(lib, make_id("bad"), 2, split_share=1)
        before = len(fake_log())
        errors = {name: attempt(lambda ids=ids: nccl.pause(ids=ids)) for name, ids in {
            "duplicate": [1, 1], "negative": [-1], "too_big": [2**64], "not_int": ["1"],
            "bool": [True], "not_a_list": 1, "unknown": [1, 99]}.items()}
        out(errors=errors, states=[c.state for c in nccl.communicators()],
            new_calls=fake_log()[before:], paused=nccl.paused_ids())
    """, env={"FAKE_NCCL_VERSION": "23007"})
    errors = seen["errors"]
    assert errors["duplicate"][0] == "ValueError" and "given twice" in errors["duplicate"][1]
    assert errors["negative"][0] == "ValueError" and "out of range" in errors["negative"][1]
    assert errors["too_big"][0] == "ValueError" and "out of range" in errors["too_big"][1]
    assert errors["not_int"][0] == errors["bool"][0] == errors["not_a_list"][0] == "TypeError"
    assert errors["unknown"][0] == "NcclPauseError" and "no communicator with id 99" in errors["unknown"][1]
    assert seen["states"] == ["active", "active"] and seen["new_calls"] == [] and seen["paused"] == []


def test_duplicate_ids_reaching_the_c_api_are_refused_too(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        init_config(lib, make_id("dup"), 1, split_share=1)
        from jax_amem.nccl import _api
        error = attempt(lambda: _api._control.pause([1, 1], "auto", ["suspend", "suspend"], 5.0, "destroy"))
        out(error=error, states=[c.state for c in nccl.communicators()])
    """, env={"FAKE_NCCL_VERSION": "23007"})
    assert seen["error"][0] == "NcclPauseError" and "given twice" in seen["error"][1]
    assert seen["states"] == ["active"]


def test_paused_with_no_communicators_is_a_no_op(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        with nccl.paused() as report:
            inside = len(report.communicators)
        out(inside=inside, paused=nccl.paused_ids(), resume=attempt(nccl.resume))
    """)
    assert seen["inside"] == 0 and seen["paused"] == []
    assert "nothing to resume" in seen["resume"][1]  # an explicit resume still says so
