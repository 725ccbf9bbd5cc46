"""The command line: `python -m jax_amem demo --quick` runs the RL loop and prints the summary;
`python -m jax_amem report` says what a pause would free; bad flags are refused clearly."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("flax")
pytest.importorskip("torch")
pytest.importorskip("transformers")


def run_cli(*args, timeout=180, **env_changes):
    env = dict(os.environ, **env_changes)
    env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    # -P: the installed package, not the source tree, as in the Makefile.
    return subprocess.run([sys.executable, "-P", "-m", "jax_amem", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_demo_quick_runs_the_loop_and_prints_the_summary():
    done = run_cli("demo", "--quick")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for expected in ("jax-amem demo: GRPO on 'sort 4 digits'", "reward        first 6:", "reward curve",
                     "pause", "rollout", "resume", "train", "swap (jax_amem.swap): 60 swaps",
                     "memory during rollout", "logits check: OK"):
        assert expected in out, f"{expected!r} missing from:\n{out}"
    first = float(out.split("first 6: ")[1].split()[0])
    last = float(out.split("last 6: ")[1].split()[0])
    assert last > first + 0.12
    assert "RL iterations: 100%" in done.stderr  # the progress bar


def demo_configs(*argv):
    import argparse

    from jax_amem.demo import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli._configs(parser.parse_args(list(argv)))


def test_demo_flags_change_the_preset():
    from jax_amem import demo

    assert demo_configs() == demo.DEFAULT and demo_configs("--quick") == demo.QUICK
    policy, loop = demo_configs("--quick", "--iterations", "3", "--check-every", "2", "--seed", "5")
    assert policy == demo.QUICK[0]
    assert (loop.iterations, loop.check_every, loop.seed) == (3, 2, 5)
    assert loop.learning_rate == demo.QUICK[1].learning_rate


@pytest.mark.parametrize("flag, value, message", [
    ("--iterations", "0", "--iterations must be >= 1, got 0"),
    ("--check-every", "-2", "--check-every must be >= 1, got -2"),
    ("--seed", "-1", "--seed must be >= 0, got -1"),
])
def test_demo_refuses_bad_flags(flag, value, message):
    done = run_cli("demo", "--quick", flag, value, timeout=60)
    assert done.returncode != 0 and message in done.stderr


@pytest.mark.parametrize("argv, message", [
    # a wrong preset name lists the choices and names the closest
    (["--preset", "Qwen3-1.7B"], "unknown preset 'Qwen3-1.7B': choose from small, qwen3-1.7b, qwen3-tiny; "
                                 "did you mean 'qwen3-1.7b'?"),
    (["--preset", "llama-70b"], "unknown preset 'llama-70b': choose from small, qwen3-1.7b, qwen3-tiny"),
    # contradictory flags are refused, not silently dropped (--quick --drop-state ran the small loop)
    (["--quick", "--preset", "qwen3-1.7b"], "--quick runs the small preset; drop it to run --preset qwen3-1.7b"),
    (["--quick", "--drop-state"], "--drop-state is for the real-size presets"),
    # a seed JAX and torch cannot take (an OverflowError deep in the loop before)
    (["--preset", "qwen3-tiny", "--seed", str(2**70)], f"--seed must be below 2**32 = {2**32}, got {2**70}"),
    (["--seed", str(2**32)], f"--seed must be below 2**32 = {2**32}"),
    (["--preset", "qwen3-tiny", "--iterations", "-3"], "--iterations must be >= 1, got -3"),
    # the real size without a GPU: refused before anything is built (it allocated 20 GB on CPU)
    (["--preset", "qwen3-1.7b"], "--preset qwen3-1.7b needs a GPU with 60 GiB or more (JAX runs on CPU here). "
                                 "Run `python -m jax_amem demo --preset qwen3-tiny`"),
    (["--preset", "qwen3-1.7b", "--drop-state", "--iterations", "1"], "needs a GPU with 60 GiB or more"),
])
def test_demo_refuses_contradictory_and_unknown_choices(argv, message):
    # JAX_PLATFORMS=cpu: on the GPU machine too, the real size must be refused, not run
    done = run_cli("demo", "--no-progress", *argv, timeout=60, JAX_PLATFORMS="cpu")
    assert done.returncode != 0 and message in done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "set-up" not in done.stdout


def test_report_says_what_a_pause_would_free():
    done = run_cli("report", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "what jax_amem.pause() would free" in out and "NCCL communicators:" in out
    assert "the demo's trainer state" in out and "while paused:" in out and "the pause:" in out
    assert "37 arrays kept" in out


@pytest.mark.parametrize("preset", ["small", "qwen3-tiny"])
def test_demo_with_a_vllm_rollout_where_vllm_is_missing_says_how_to_get_it(preset, monkeypatch, capsys):
    import argparse
    import importlib.util

    from jax_amem.demo import cli

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "vllm" else find_spec(name, *rest))
    args = argparse.Namespace(preset=preset, rollout="vllm", quick=False, drop_state=False, json=None)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "--rollout vllm: vLLM is not installed here" in err and "make test-vllm" in err
