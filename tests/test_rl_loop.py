"""The RL loop: a short seeded run learns (the reward rises clearly), and every iteration went
through pause -> rollout -> resume -> train -> swap with both models agreeing at each check."""

import dataclasses

import numpy as np
import pytest

import jax

import jax_amem

pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from jax_amem import demo  # noqa: E402
from jax_amem.demo.summary import first_and_last  # noqa: E402

pytestmark = pytest.mark.usefixtures("never_left_paused")


@pytest.fixture(scope="module")
def quick_run():
    policy, loop = demo.QUICK
    seen = []
    result = demo.run(policy, loop, on_start=lambda r: seen.append("start"),
                    on_iteration=lambda i, r: seen.append(i))
    return result, seen


def test_a_short_run_learns(quick_run):
    result, _ = quick_run
    first, last = first_and_last(result.rewards)
    # A random policy scores ~1/12; 60 seeded iterations reach ~0.34 (docs/demo.md).
    assert first < 0.15
    assert last > first + 0.12, f"reward did not rise: first {first:.3f}, last {last:.3f}"
    assert max(result.rewards[-10:]) > 2 * max(result.rewards[:10])


def test_every_iteration_ran_every_phase(quick_run):
    result, seen = quick_run
    n = demo.QUICK[1].iterations
    assert seen == ["start", *range(n)]
    assert len(result.rewards) == len(result.losses) == len(result.pauses) == len(result.swaps) == n
    for phase in demo.PHASES:
        assert len(result.phase_seconds[phase]) == n and min(result.phase_seconds[phase]) >= 0
    assert not jax_amem.is_paused()


def test_the_pause_kept_the_whole_trainer_state(quick_run):
    result, _ = quick_run
    info = result.pauses[-1]
    assert info.arrays_kept == 37  # 12 parameters, Adam's mu and nu for each, its step count
    # Every parameter and moment is split over the devices; the int32 step count is on each.
    assert info.bytes_kept == result.param_bytes + result.opt_state_bytes + 4 * (len(jax.devices()) - 1)
    assert info.bytes_offloaded == result.param_bytes + result.opt_state_bytes  # one copy per shard


def test_every_swap_wrote_all_the_parameters(quick_run):
    result, _ = quick_run
    assert {s.bytes for s in result.swaps} == {result.param_bytes}
    assert all(s.buffers == 9 * result.policy.num_layers + 3 for s in result.swaps)
    assert [s.version for s in result.swaps] == sorted(s.version for s in result.swaps)


def test_the_logits_agreed_at_every_check(quick_run):
    result, _ = quick_run
    n, every = demo.QUICK[1].iterations, demo.QUICK[1].check_every
    expected = sorted({i for i in range(n) if (i + 1) % every == 0} | {n - 1})
    assert [c.iteration for c in result.checks] == expected
    assert result.checks_ok


def test_the_summary_reports_what_happened(quick_run):
    result, _ = quick_run
    text = demo.summary_table(result)
    first, last = first_and_last(result.rewards)
    assert f"first 6: {first:.3f}   last 6: {last:.3f}" in text
    for phase in demo.PHASES:
        assert f"\n{phase:<10}" in text
    assert "logits check: OK" in text and "swap (jax_amem.swap): 60 swaps" in text
    assert "memory during rollout" in text and f"LlamaForCausalLM on {result.rollout_device}" in text


def test_a_batch_that_does_not_split_over_the_devices_is_refused():
    policy, loop = demo.QUICK
    with pytest.raises(ValueError, match=r"3 prompts x 3 samples = 9\) must divide evenly over the 8"):
        demo.run(policy, dataclasses.replace(loop, prompts_per_iteration=3, group_size=3))


def test_a_vocabulary_too_small_for_the_task_is_refused():
    with pytest.raises(ValueError, match="vocabulary of at least 12 tokens, got 10"):
        demo.run(demo.PolicyConfig(vocab_size=10), demo.QUICK[1])
