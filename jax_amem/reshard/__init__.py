"""The resharding planner: which bytes go from which trainer shard to which rollout buffer.

    from jax_amem import reshard
    plan = reshard.plan(params, rollout_layouts, rules=reshard.rules.hf_llama(32, tp=2, fused_qkv=True))
    plan.check(); print(plan)

See docs/reshard.md for the plan's data format (the executor's contract).
"""

from . import rules
from .blocks import expand
from .from_jax import layouts_of, names_tree, tree_names
from .layout import MAX_RANK, Layout, LayoutError, Owner
from .lowering import RuleError
from .numpy_exec import execute as execute_numpy
from .plan_data import TRANSFER_COLUMNS, Plan, PlanError
from .planning import DEFAULT_SPLIT_BYTES, Planner, cache_info, clear_cache, plan
from .rule_types import Part, Piece, Rule
from .simulation import Bandwidths, simulate

__all__ = [
    "Bandwidths", "DEFAULT_SPLIT_BYTES", "Layout", "LayoutError", "MAX_RANK", "Owner", "Part", "Piece",
    "Plan", "PlanError", "Planner", "Rule", "RuleError", "TRANSFER_COLUMNS", "cache_info", "clear_cache",
    "execute_numpy", "expand", "layouts_of", "names_tree", "plan", "rules", "simulate", "tree_names",
]
