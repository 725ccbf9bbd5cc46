"""The real-size demo's code path at a CPU size (`--preset qwen3-tiny`): a Qwen3-style Flax
trainer with Adam, a bf16 transformers Qwen3ForCausalLM rollout, `jax_amem.reserve()`, two
iterations of pause / generate / resume / train / swap, the bit-exact and logits checks, both
baselines and the summary. The sizes are checked against a parameter-count formula written
from the architecture, the bytes moved against the trees' own sizes. The `gpu` test runs a
medium preset and checks what a CPU cannot show: device memory freed and the peaks."""

import argparse
import dataclasses
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("flax")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import jax  # noqa: E402

from jax_amem.demo import cli  # noqa: E402
from jax_amem.demo.config import PolicyConfig  # noqa: E402
from jax_amem.demo.real_size import presets, record  # noqa: E402
from jax_amem.demo.real_size.checks import LOGITS_TOLERANCE  # noqa: E402
from jax_amem.demo.real_size.loop import run  # noqa: E402
from jax_amem.demo.real_size.summary import parameters, summary_table  # noqa: E402

TINY = presets.QWEN3_TINY
ADAM_COUNT_BYTES = 4  # optax's Adam step count, one int32 (clip_by_global_norm keeps no state)


@pytest.fixture(scope="module")
def tiny():
    result = run(TINY)
    yield result


def test_the_tiny_preset_runs_every_step_of_the_loop(tiny, never_left_paused):
    p = TINY.policy
    n = parameters(p)
    assert tiny.param_bytes == 4 * n                          # float32 trainer
    assert tiny.opt_state_bytes == 2 * 4 * n + ADAM_COUNT_BYTES  # Adam's two moments + its count
    assert tiny.rollout_bytes == 2 * n                        # bf16 rollout, tied head counted once
    assert len(tiny.iterations) == TINY.loop.iterations == 2
    state = tiny.param_bytes + tiny.opt_state_bytes
    assert tiny.reserve.bytes >= state and tiny.reserve.pool_seconds >= 0 and tiny.reserve.compile_seconds > 0
    for it in tiny.iterations:
        assert it.pause.bytes_offloaded == state and it.pause.arrays_dropped == 0
        assert it.resume.bytes_reloaded == state
        assert it.swap.bytes == tiny.rollout_bytes and it.swap.buffers == 2 + p.num_layers * 11
        assert it.rollout_seconds > 0 and it.train_seconds > 0 and 0 <= it.reward <= 1
    c = tiny.ceilings
    assert c.pinned_down_gb_s > 0 and c.pinned_up_gb_s > 0 and c.device_copy_gb_s > 0
    if not tiny.on_gpu:
        assert all(it.peak_iteration is None and it.pause.bytes_freed == 0 for it in tiny.iterations)


def test_the_swap_is_bit_exact_and_the_logits_agree(tiny):
    (exact,) = tiny.exact_checks
    assert exact.ok, exact.mismatched
    assert exact.iteration == 0 and exact.tensors == 2 + TINY.policy.num_layers * 11
    assert exact.bytes == tiny.rollout_bytes
    assert tiny.logits_checks and all(c.ok for c in tiny.logits_checks)
    assert all(c.tolerance == LOGITS_TOLERANCE["bfloat16"] for c in tiny.logits_checks)
    assert 0 < max(c.relative for c in tiny.logits_checks) < LOGITS_TOLERANCE["bfloat16"]
    assert tiny.checks_ok


def test_both_baselines_ran_on_the_same_model(tiny):
    host = tiny.host_baseline
    assert host.bytes_fetched == tiny.param_bytes
    assert host.get_seconds > 0 and host.convert_seconds > 0 and host.load_seconds > 0
    resident = tiny.resident_baseline
    assert resident.fitted and resident.error is None
    assert resident.iterations == TINY.no_pause_iterations == len(resident.rollout_seconds)


def test_the_summary_names_every_figure(tiny):
    out = summary_table(tiny)
    for expected in ("preset qwen3-tiny", "0.076M parameters", "Qwen3ForCausalLM, bfloat16",
                     "reserve(): ", "outside the switch", "ceilings measured in this run",
                     "\npause ", "\nswap ", "\nresume ", "\nswitch ", "pinned bound", "device bound",
                     "first pause", "0 garbage collections",
                     "baseline (a), what users do today: jax.device_get",
                     "baseline (b), no pause, both models resident: 1 iteration(s)",
                     "exact check (iteration 0): OK: 24 rollout tensors",
                     "logits check: OK", "a systems preset"):
        assert expected in out, f"{expected!r} missing from:\n{out}"
    if not tiny.on_gpu:
        assert "memory: no GPU here" in out


def test_the_exact_check_catches_a_wrong_byte(tiny):
    """The oracle is not vacuous: one changed element of one tensor is named."""
    from jax_amem.demo.loop import Rollout, Trainer
    from jax_amem.demo.real_size.checks import exact_check

    trainer = Trainer(TINY.policy, TINY.loop, TINY.task)
    roll = Rollout(TINY.policy, dtype=torch.bfloat16, params=trainer.params)
    roll.load(trainer.params)
    assert exact_check(trainer.params, roll.model, TINY.policy, 0).ok
    name = "model.layers.1.self_attn.k_norm.weight"
    with torch.no_grad():
        roll.tensors[name][3] += 1
    assert exact_check(trainer.params, roll.model, TINY.policy, 0).mismatched == (name,)


def test_the_qwen3_1_7b_preset_is_qwen3_1_7b_with_16_gb_of_trainer_state():
    from jax_amem.demo.policy import init_params
    from jax_amem.demo.weights import swap_rules

    policy = presets.QWEN3_1_7B.policy
    shapes = jax.eval_shape(lambda: init_params(policy, 0))   # nothing allocated
    n = sum(x.size for x in jax.tree_util.tree_leaves(shapes))
    assert n == parameters(policy) == 1_720_574_976
    assert 3 * 4 * n >= 16e9                                  # float32 parameters + Adam's two moments
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(policy.to_hf_config())
    hf = {name: tuple(t.shape) for name, t in model.named_parameters()}
    assert sum(t.numel() for t in model.parameters()) == n
    assert {r.dst for r in swap_rules(policy, shapes, cast="bfloat16")} == set(hf)


def _args(*argv):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_preset_flags():
    assert cli.PRESET_NAMES == ("small", *presets.PRESETS)
    assert cli.REAL_SIZE_DEFAULT_GIB == presets.PRESETS[cli.REAL_SIZE_DEFAULT].min_device_gib
    assert cli.preset_name(_args("--preset", "qwen3-tiny")) == "qwen3-tiny"
    assert cli.preset_name(_args("--quick")) == "small"
    if jax.devices()[0].platform == "cpu":
        assert cli.preset_name(_args()) == "small"
    with pytest.raises(SystemExit, match="--quick runs the small preset"):
        cli.preset_name(_args("--quick", "--preset", "qwen3-tiny"))
    with pytest.raises(SystemExit, match="--drop-state is for the real-size presets"):
        cli.preset_name(_args("--preset", "small", "--drop-state"))
    preset = cli._real_size_preset(_args("--iterations", "5", "--seed", "3"), "qwen3-tiny")
    assert (preset.loop.iterations, preset.loop.seed) == (5, 3)
    assert preset.policy == TINY.policy


def test_a_non_qwen3_policy_is_refused():
    with pytest.raises(ValueError, match="Qwen3-style"):
        dataclasses.replace(TINY, policy=PolicyConfig())


def test_json_is_for_real_size_presets_and_a_folder_that_exists(tmp_path):
    with pytest.raises(SystemExit, match="--json .*written by the real-size presets"):
        cli.preset_name(_args("--preset", "small", "--json", str(tmp_path / "f.json")))
    with pytest.raises(SystemExit, match="does not exist or is not writable"):
        cli.preset_name(_args("--preset", "qwen3-tiny", "--json", str(tmp_path / "missing" / "f.json")))
    assert cli.preset_name(_args("--preset", "qwen3-tiny", "--json", str(tmp_path / "f.json"))) == "qwen3-tiny"


def test_the_figures_record_is_the_summary_as_data(tiny):
    figures = json.loads(json.dumps(record.figures(tiny)))  # JSON-ready: survives a round trip
    assert figures["preset"] == "qwen3-tiny" and figures["parameters"] == parameters(TINY.policy)
    parts = {r["part"]: r for r in figures["switch"]}
    assert parts["switch"]["seconds"] == pytest.approx(sum(parts[p]["seconds"] for p in ("pause", "swap", "resume")))
    assert [i["pause"]["seconds"] for i in figures["iterations"]] == [i.pause.seconds for i in tiny.iterations]
    assert figures["host_baseline"]["seconds"] == tiny.host_baseline.seconds
    assert figures["checks"]["ok"] is tiny.checks_ok is True


def test_the_command_runs_the_tiny_preset_with_the_state_dropped(tmp_path):
    env = dict(os.environ)
    env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    done = subprocess.run([sys.executable, "-P", "-m", "jax_amem", "demo", "--preset", "qwen3-tiny",
                           "--drop-state", "--iterations", "2", "--json", str(tmp_path / "tiny.json")],
                          capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    params = 4 * parameters(TINY.policy)
    assert "Adam state dropped at each pause" in out
    assert f"{params / 1e3:.2f} kB to host" in out      # only the parameters are copied out
    assert "iteration 2/2: pause" in out and "exact check (iteration 0): OK" in out and "logits check: OK" in out
    figures = json.loads((tmp_path / "tiny.json").read_text())
    assert figures["drop_state"] is True and len(figures["iterations"]) == 2
    assert figures["iterations"][-1]["pause"]["bytes_offloaded"] == params


@pytest.mark.gpu
def test_a_medium_preset_on_the_gpu_frees_the_trainer_state_during_the_rollout(never_left_paused):
    medium = dataclasses.replace(
        TINY, name="qwen3-medium",
        policy=PolicyConfig(family="qwen3", vocab_size=32768, hidden_size=1024, num_layers=4, num_heads=16,
                            num_kv_heads=8, head_dim=64, intermediate_size=3072, max_positions=64,
                            tie_embeddings=True))
    result = run(medium)
    state = result.param_bytes + result.opt_state_bytes
    assert state == 3 * 4 * parameters(medium.policy) + ADAM_COUNT_BYTES and state > 0.9e9
    assert result.on_gpu and result.ceilings.pinned
    assert result.checks_ok, (result.exact_checks, result.logits_checks)
    for it in result.iterations:
        assert it.pause.bytes_freed >= 0.9 * state, (it.pause.bytes_freed, state)
        assert it.pause.collections == 0
    resident = result.resident_baseline
    assert resident.fitted, resident.error
    paused_rollout = max(it.peak_rollout for it in result.iterations)
    assert resident.peak_rollout - paused_rollout >= 0.9 * state, (resident.peak_rollout, paused_rollout)
    assert "memory: each pause freed" in summary_table(result)


def test_a_resident_baseline_that_does_not_fit_is_reported_not_raised(tiny):
    """Baseline (b) catches PyTorch's and XLA's out-of-memory errors (and nothing else), and the
    summary says it did not fit."""
    from jax_amem.demo.real_size import baselines
    from jax_amem.demo.real_size.loop import _Run
    from jax_amem.demo.real_size.memory_peak import PeakSampler

    class Stub:
        sampler = PeakSampler(None)
        preset = TINY

        def __init__(self, error):
            self.error, self.calls = error, 0

        def prompts(self):
            return None

        def generate(self, prompts, iteration):
            self.calls += 1
            if self.calls == 2:
                raise self.error
            return None, 0.5, None

        def learn(self, prompts, tokens):
            return 0.0, 0.0, 0.1, None

    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    out = _Run.resident(Stub(oom), 3)
    assert out.iterations == 1 and not out.fitted and out.error.startswith("OutOfMemoryError: CUDA out of memory")
    xla = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 21474836480 bytes.")
    assert _Run.resident(Stub(xla), 3).error.startswith("RuntimeError: RESOURCE_EXHAUSTED")
    with pytest.raises(ValueError, match="not memory"):
        _Run.resident(Stub(ValueError("not memory")), 3)
    assert baselines.is_out_of_memory(oom) and not baselines.is_out_of_memory(ValueError("x"))
    out_text = summary_table(dataclasses.replace(tiny, resident_baseline=_Run.resident(Stub(oom), 3)))
    assert "baseline (b), no pause: did not fit (OutOfMemoryError: CUDA out of memory" in out_text
