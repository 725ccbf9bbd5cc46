"""The RL loop on a GPU: the rollout model lives on the GPU, the swap is device-local, the pause
around the rollout gives the trainer's state back to the driver, and the loop still learns."""

import pytest

pytest.importorskip("flax")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from jax_amem import demo  # noqa: E402
from jax_amem.demo.summary import first_and_last  # noqa: E402
from jax_amem.swapping.report import DEVICE_LOCAL  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("never_left_paused")]


def test_the_quick_loop_learns_on_the_gpu():
    result = demo.run(*demo.QUICK)
    assert result.platform.startswith("gpu") and result.rollout_device == "cuda:0"
    first, last = first_and_last(result.rewards)
    assert last > first + 0.12, (first, last)
    assert result.checks_ok, result.checks
    # Trainer and rollout on the same GPU: every byte is copied on the device, none via the host.
    assert all(set(s.transports) == {DEVICE_LOCAL} for s in result.swaps), result.swaps[-1]


def test_the_pause_gives_the_trainer_state_back_during_the_rollout():
    # ~0.6 GB of parameters and Adam state, so the driver's figures are far above its granularity.
    policy = demo.PolicyConfig(vocab_size=4096, hidden_size=1024, num_layers=4, num_heads=16, num_kv_heads=4,
                             head_dim=64, intermediate_size=2816)
    loop = demo.LoopConfig(iterations=3, prompts_per_iteration=4, group_size=4, check_every=3)
    result = demo.run(policy, loop)
    state = result.param_bytes + result.opt_state_bytes
    assert state > 500 * 2**20
    for info in result.pauses:
        assert info.pool_returned, info.pool_note
        assert info.bytes_freed >= 0.9 * state, (info.bytes_freed, state)
    before, during = result.memory_before.devices[0], result.memory_paused.devices[0]
    assert before.process_bytes - during.process_bytes >= 0.9 * state, (before, during)
    assert result.checks_ok, result.checks
