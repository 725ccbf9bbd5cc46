"""Bad selections are refused with a clear error before anything is touched; empty ones are no-ops."""


from nccl_support.fixtures import fake_with_suspend  # noqa: F401 (a fixture)
from nccl_support.harness import run_scenario

NEW_NCCL = {"FAKE_NCCL_VERSION": "23007"}  # a fake NCCL with ncclCommSuspend (>= 2.29.7)



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
    # NcclArgumentError: a member of the family, and the ValueError / TypeError these were before it
    assert errors["duplicate"][0] == "NcclArgumentError" and "given twice" in errors["duplicate"][1]
    assert errors["negative"][0] == "NcclArgumentError" and "out of range" in errors["negative"][1]
    assert errors["too_big"][0] == "NcclArgumentError" and "out of range" in errors["too_big"][1]
    assert errors["not_int"][0] == errors["bool"][0] == errors["not_a_list"][0] == "NcclArgumentError"
    assert errors["unknown"][0] == "NcclPauseError" and "no communicator with id 99" in errors["unknown"][1]
    assert seen["states"] == ["active", "active"] and seen["new_calls"] == [] and seen["paused"] == []


def test_duplicate_ids_reaching_the_c_api_are_refused_too(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        init_config(lib, make_id("dup"), 1, split_share=1)
        from jax_amem.nccl import _api
        error = attempt(lambda: _api._control.pause([1, 1], "auto", ["suspend", "suspend"], [None, None], 5.0, "destroy"))
        out(error=error, states=[c.state for c in nccl.communicators()])
    """, env={"FAKE_NCCL_VERSION": "23007"})
    assert seen["error"][0] == "NcclPauseError" and "given twice" in seen["error"][1]
    assert seen["states"] == ["active"]


def test_paused_with_no_communicators_is_a_no_op(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        with nccl.paused() as p:
            inside = len(p.info.communicators)
            during = nccl.is_paused()
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            earlier_form = len(p.communicators)   # `as report:` of earlier versions: still read, warned
        out(inside=inside, during=during, restored=repr(p.restored), earlier_form=earlier_form,
            warned=[w.category.__name__ for w in caught], paused=nccl.paused_ids(), resume=attempt(nccl.resume))
    """)
    assert seen["inside"] == 0 and seen["paused"] == [] and seen["during"] is False
    assert seen["restored"] == "None"  # nothing was paused, so nothing resumed
    assert seen["earlier_form"] == 0 and seen["warned"] == ["DeprecationWarning"]
    assert "nothing to resume" in seen["resume"][1]  # an explicit resume still says so


def test_paused_gives_the_pause_and_the_resume_reports_like_the_whole_process_pause(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comm = init_config(lib, make_id("one"), 1, split_share=1)[0]
        with nccl.paused() as p:
            during = nccl.is_paused()
            strategies = [c.last_strategy for c in p.info.communicators]
        out(during=during, after=nccl.is_paused(), strategies=strategies,
            resumed=[c.state for c in p.restored.communicators], kind=type(p.restored).__name__)
    """, env=NEW_NCCL)
    assert seen == {"during": True, "after": False, "strategies": ["suspend"], "resumed": ["active"],
                    "kind": "NcclReport"}


def test_bad_timeouts_and_flags_are_refused_alone_too(fake_with_suspend):
    """Without jax.distributed (the agreement is skipped): a NaN or negative timeout reached NCCL's
    wait loop, and agree="no" (a true string) agreed."""
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        comms = init_config(lib, make_id("flags"), 1, split_share=1)
        before = len(fake_log())
        errors = [attempt(lambda: nccl.pause(timeout=float("nan"))), attempt(lambda: nccl.pause(timeout=-5)),
                  attempt(lambda: nccl.pause(agree="no")), attempt(lambda: nccl.pause(timeout="soon"))]
        untouched = fake_log()[before:] == [] and [c.state for c in nccl.communicators()] == ["active"]
        nccl.pause(timeout=5)
        errors += [attempt(lambda: nccl.resume(timeout=0)), attempt(lambda: nccl.resume(async_="yes")),
                   attempt(lambda: nccl.recover(timeout=float("-inf")))]
        still = [c.state for c in nccl.communicators()]
        nccl.resume(timeout=5)
        out(errors=errors, untouched=untouched, still=still, states=[c.state for c in nccl.communicators()])
    """, env={"FAKE_NCCL_VERSION": "23007"})
    assert [e[0] for e in seen["errors"]] == ["NcclArgumentError"] * 7, seen["errors"]
    assert "jax_amem.nccl.pause(agree='no'): agree is True or False, not str" in seen["errors"][2][1]
    assert "jax_amem.nccl.resume(timeout=0): timeout must be a finite number of seconds, above 0" in seen["errors"][4][1]
    assert seen["untouched"] and seen["still"] == ["paused"] and seen["states"] == ["active"]


def test_cost_rates_reset_must_be_a_bool_and_forgets_nothing_when_refused(fake_with_suspend):
    seen = run_scenario(fake_with_suspend, """
        lib = interposer()
        init_config(lib, make_id("rates"), 1, split_share=1)
        nccl.pause("recreate")
        nccl.resume()
        error = attempt(lambda: nccl.cost_rates(reset="yes"))
        out(error=error, samples=nccl.cost_rates()["teardown_samples"])
    """, env={"FAKE_NCCL_VERSION": "23007"})
    assert seen["error"] == ["NcclArgumentError",
                             "jax_amem.nccl.cost_rates(reset='yes'): reset is True or False, not str"]
    assert seen["samples"] == 1
