"""The end-to-end RL loop: a JAX (Flax) trainer and a PyTorch (transformers) rollout taking turns.

    from jax_amem import rl
    result = rl.run(*rl.QUICK)          # (PolicyConfig, LoopConfig)
    print(rl.summary_table(result))

See docs/demo.md. The loop needs the `test` extra's packages (flax, optax, torch,
transformers); they are imported on first use, so `jax_amem.rl.memory_view`
(used by `python -m jax_amem report`) works without them.
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
        raise AttributeError(f"module 'jax_amem.rl' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
