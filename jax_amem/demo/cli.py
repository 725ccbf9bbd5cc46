"""`python -m jax_amem demo`: the end-to-end RL loop on the embedded default.

A JAX (Flax) trainer, FSDP-sharded over every device (the GPU when there is one,
else 8 XLA CPU devices), and a PyTorch (transformers) rollout take turns: the
trainer's memory is paused while PyTorch samples, the new weights are swapped
into the rollout model in place. Prints a progress bar and a summary table.
See docs/demo.md.
"""

from __future__ import annotations

import dataclasses
import importlib.util
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


def _configs(args):
    from .config import DEFAULT, QUICK

    policy, loop = QUICK if getattr(args, "quick", False) else DEFAULT
    changes = {name: value for name, value in (
        ("iterations", getattr(args, "iterations", None)), ("seed", getattr(args, "seed", None)),
        ("check_every", getattr(args, "check_every", None))) if value is not None}
    for name, value in changes.items():
        if value < (0 if name == "seed" else 1):
            raise SystemExit(f"--{name.replace('_', '-')} must be {'>= 0' if name == 'seed' else '>= 1'}, got {value}")
    return policy, dataclasses.replace(loop, **changes)


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
    import jax

    from .loop import run
    from .summary import summary_table

    policy, loop = _configs(args)
    device = jax.devices()[0]
    print(f"jax-amem demo on {device.platform} ({device.device_kind}), {len(jax.devices())} device(s): "
          f"{loop.iterations} iterations", flush=True)
    progress = _Progress(loop.iterations, not getattr(args, "no_progress", False))
    try:
        result = run(policy, loop, on_start=progress.on_start, on_iteration=progress.on_iteration)
    finally:
        progress.close()
    print(summary_table(result), flush=True)
    return 0 if result.checks_ok else 1
