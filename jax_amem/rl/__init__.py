"""The end-to-end RL loop: a JAX (Flax) trainer and a PyTorch (transformers) rollout taking turns.

    from jax_amem import rl
    result = rl.run(*rl.QUICK)          # (PolicyConfig, LoopConfig)
    print(rl.summary_table(result))

See docs/demo.md. Needs the `test` extra's packages: flax, optax, torch, transformers.
"""

from .config import DEFAULT, QUICK, LoopConfig, PolicyConfig
from .loop import LOGITS_TOLERANCE, PHASES, LogitsCheck, LoopResult, run
from .summary import sparkline, summary_table
from .task import SortTask

__all__ = ["DEFAULT", "LOGITS_TOLERANCE", "LogitsCheck", "LoopConfig", "LoopResult", "PHASES",
           "PolicyConfig", "QUICK", "SortTask", "run", "sparkline",
           "summary_table"]
