"""`plan(...)` and `Planner`: from layouts and rules to a cached, checked Plan.

    planner = Planner(sources, destinations, rules)      # lowers rules, indexes layouts once
    whole = planner.plan()                               # the global plan
    mine = planner.plan(owner=(process, device))         # one rank's part, built alone

Plans are cached by a key of their inputs (layouts, rules lowered to pieces,
options) and the owner; a failure leaves the cache as it was.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Mapping

from .from_jax import layouts_of
from .layout import Layout, LayoutError, Owner
from .lowering import lower
from .plan_data import Plan, PlanError
from .problem import Problem

DEFAULT_SPLIT_BYTES = 1 << 20  # below this an item goes whole to one replica
CACHE_SIZE = 64

_cache: "OrderedDict[tuple, Plan]" = OrderedDict()


def cache_info() -> dict:
    return {"entries": len(_cache), "keys": list(_cache)}


def clear_cache() -> None:
    _cache.clear()


def _as_layouts(tensors, side: str) -> dict[str, Layout]:
    if isinstance(tensors, Layout):
        return {"tensor": tensors}
    if isinstance(tensors, Mapping) and all(isinstance(v, Layout) for v in tensors.values()):
        return dict(tensors)
    try:
        return layouts_of(tensors)
    except Exception as error:
        raise LayoutError(f"{side}: give a Layout, a mapping of names to Layouts, or a pytree of "
                          f"sharded arrays ({error})") from error


class Planner:
    """Lowers rules and indexes layouts once; plans globally or for one owner."""

    def __init__(self, sources, destinations, rules=None, *, split_bytes: int = DEFAULT_SPLIT_BYTES):
        src = _as_layouts(sources, "sources")
        dst = _as_layouts(destinations, "destinations")
        for name, layout in [*src.items(), *dst.items()]:  # byte offsets are int64 from here on
            if math.prod(layout.shape) * layout.dtype.itemsize >= 2**63:
                raise LayoutError(f"tensor {name!r} of shape {layout.shape} ({layout.dtype}) has more bytes than int64 counts")
        pieces = lower(rules, src, dst)
        if isinstance(split_bytes, bool) or not isinstance(split_bytes, int) or not 1 <= split_bytes < 2**63:
            raise PlanError(f"split_bytes must be an int >= 1, got {split_bytes!r}")
        self.problem = Problem.build(src, dst, pieces, split_bytes)
        self.key = self.problem.key

    def plan(self, owner=None, *, planner: str = "native", check: bool = False, cache: bool = True) -> Plan:
        try:
            owner = Owner(*owner) if owner is not None else None
        except TypeError:
            raise PlanError(f"owner must be a (process, device) pair, got {owner!r}") from None
        owner_id = self.problem.owner_id(owner) if owner is not None else None
        cache_key = (self.key, owner, planner)
        if cache and cache_key in _cache:
            _cache.move_to_end(cache_key)
            return _cache[cache_key]
        if planner == "native":
            from .native import plan_native
            transfers, blocks = plan_native(self.problem, owner_id)
        elif planner == "reference":
            from .reference import ReferencePlanner
            transfers, blocks = ReferencePlanner(self.problem).plan(owner_id)
        else:
            raise PlanError(f"planner must be 'native' or 'reference', got {planner!r}")
        pb = self.problem
        result = Plan(
            key=self.key, owners=pb.owners,
            src_layouts=dict(zip(pb.src_names, pb.src_layouts)),
            dst_layouts=dict(zip(pb.dst_names, pb.dst_layouts)),
            views=[(pb.src_names[s], perm, dtype) for s, perm, dtype in pb.view_keys],
            transfers=transfers, blocks=blocks, owner=owner, planner=planner,
            affines=tuple(pb.view_affines) if any(a is not None for a in pb.view_affines) else ())
        if check:
            result.check()
        if cache:  # only complete, (optionally) checked plans enter the cache
            _cache[cache_key] = result
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
        return result


def plan(sources, destinations, rules=None, *, owner=None, split_bytes: int = DEFAULT_SPLIT_BYTES,
         planner: str = "native", check: bool = False, cache: bool = True) -> Plan:
    """The plan moving `sources` (trainer side) into `destinations` (rollout side).

    `sources` / `destinations`: a Layout (one tensor), a `{name: Layout}` mapping, or a
    pytree of sharded jax.Arrays. `rules`: None (same names, same shapes) or a list of
    `Rule` / `Piece` (see `jax_amem.reshard.rules`). `owner`: build only that rank's part.
    """
    return Planner(sources, destinations, rules, split_bytes=split_bytes).plan(
        owner, planner=planner, check=check, cache=cache)
