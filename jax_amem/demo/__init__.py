"""The demo: the RL loop jax-amem is built for, a JAX (Flax) trainer and a PyTorch (transformers)
rollout taking turns. Not part of the library: it has its own extra (`pip install 'jax-amem[demo]'`).

    python -m jax_amem demo             # the command (cli.py)

    from jax_amem import demo
    result = demo.run(*demo.QUICK)      # (PolicyConfig, LoopConfig)
    print(demo.summary_table(result))

The real-size preset (`--preset qwen3-1.7b`, a 1.72B Qwen3-style trainer and a bf16 rollout,
the switch against its measured bounds and two baselines) lives in `real_size/`.

See docs/demo.md. The loop's packages (flax, optax, torch, transformers) are imported on first
use, so `jax_amem.demo.memory_view` (used by `python -m jax_amem report`) works without them.
"""

import importlib

_EXPORTS = {
    "DEFAULT": "config", "QUICK": "config", "LoopConfig": "config", "PolicyConfig": "config",
    "LOGITS_TOLERANCE": "loop", "PHASES": "loop", "LogitsCheck": "loop", "LoopResult": "loop",
    "run": "loop", "SortTask": "task", "sparkline": "summary", "summary_table": "summary",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'jax_amem.demo' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
