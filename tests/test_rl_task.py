"""The demo's task, reward and advantages on hand-made examples, and the summary's small helpers."""

import numpy as np
import pytest

from jax_amem.demo.summary import first_and_last, sparkline
from jax_amem.demo.task import BOS, SEP, SortTask
from jax_amem.demo.train import group_advantages


def prompt(*digits):
    return [BOS, *digits, SEP]


def test_reward_is_the_fraction_of_positions_holding_the_sorted_digit():
    task = SortTask(digits=4)
    prompts = np.array([prompt(3, 1, 2, 1)] * 5)
    answers = np.array([
        [1, 1, 2, 3],      # sorted: all right
        [3, 2, 1, 1],      # reversed: no position right
        [1, 1, 3, 2],      # the first two right
        [1, 9, 9, 3],      # first and last right
        [SEP, BOS, 2, 0],  # special tokens are never right; position 3 right
    ])
    np.testing.assert_array_equal(task.rewards(prompts, answers), [1.0, 0.0, 0.5, 0.5, 0.25])
    assert task.rewards(prompts, answers).dtype == np.float32


def test_reward_handles_repeated_and_extreme_digits():
    task = SortTask(digits=3)
    prompts = np.array([prompt(9, 0, 9), prompt(5, 5, 5)])
    np.testing.assert_array_equal(task.rewards(prompts, np.array([[0, 9, 9], [5, 5, 4]])),
                                  np.array([1.0, 2 / 3], np.float32))


def test_prompts_are_bos_digits_sep_and_seeded():
    task = SortTask(digits=5)
    a = task.prompts(np.random.default_rng(7), 50)
    b = task.prompts(np.random.default_rng(7), 50)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (50, task.prompt_length) == (50, 7) and a.dtype == np.int32
    assert (a[:, 0] == BOS).all() and (a[:, -1] == SEP).all()
    assert a[:, 1:-1].min() >= 0 and a[:, 1:-1].max() <= 9 and len(np.unique(a[:, 1:-1])) == 10
    np.testing.assert_array_equal(task.targets(a[:1]), [sorted(a[0, 1:-1])])


@pytest.mark.parametrize("prompts, answers, message", [
    (np.zeros((2, 5)), np.zeros((2, 4)), r"prompts must have shape \(B, 6\), got \(2, 5\)"),
    (np.zeros(6), np.zeros(4), r"prompts must have shape \(B, 6\), got \(6,\)"),
    (np.zeros((2, 6)), np.zeros((2, 10)), r"answers must have shape \(2, 4\) .*got \(2, 10\)"),
    (np.zeros((2, 6)), np.zeros((3, 4)), r"answers must have shape \(2, 4\) .*got \(3, 4\)"),
])
def test_reward_rejects_wrong_shapes(prompts, answers, message):
    with pytest.raises(ValueError, match=message):
        SortTask(digits=4).rewards(prompts, answers)


def test_group_advantages_are_relative_to_each_group():
    rewards = np.array([1.0, 0.0, 0.5, 0.5,    # group 1: mean 0.5, std sqrt(0.125)
                        0.25, 0.25, 0.25, 0.25])  # group 2: all equal -> no signal
    adv = group_advantages(rewards, group_size=4)
    std = np.sqrt(0.125)
    np.testing.assert_allclose(adv[:4], [0.5 / std, -0.5 / std, 0.0, 0.0], rtol=1e-5)
    np.testing.assert_array_equal(adv[4:], 0.0)
    assert adv.dtype == np.float32


def test_group_advantages_need_whole_groups():
    with pytest.raises(ValueError, match=r"rewards \(shape \(6,\)\) must be one row of whole groups of group_size=4"):
        group_advantages(np.zeros(6), group_size=4)
    with pytest.raises(ValueError, match="group_size=0"):
        group_advantages(np.zeros(6), group_size=0)


def test_sparkline_runs_from_the_lowest_to_the_highest_bucket():
    assert sparkline([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([0.5] * 4) == "▁▁▁▁"
    assert sparkline([]) == ""
    assert len(sparkline(np.linspace(0, 1, 1000), width=30)) == 30
    assert sparkline([0, 0, 1, 1], width=2) == "▁█"


def test_first_and_last_average_a_tenth_of_the_run():
    rewards = list(range(100))
    assert first_and_last(rewards) == (4.5, 94.5)       # 10 each end
    assert first_and_last([1.0, 3.0]) == (1.0, 3.0)     # at least one
    assert first_and_last(list(range(40))) == (1.5, 37.5)  # 4 each end
