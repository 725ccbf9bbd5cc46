"""Runs a plan with numpy copies: the reference executor (tests, and a model for the swap's).

A sender prepares each view it sends once (`shard.transpose(perm).astype(dtype)`,
row-major), then every transfer copies its segments byte for byte into the
receiver's destination shard.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import PlanError
from .layout import Owner
from .plan_data import BLOCK_BEGIN, BLOCK_END, DST_OWNER, DST_TENSOR, SRC_OWNER, VIEW, Plan
from . import blocks as B


def prepare_view(shard: np.ndarray, perm, dtype, affine=None, box_start=None) -> np.ndarray:
    """The bytes a sender copies from: its shard transposed and cast, row-major; with constant
    steps (`affine`, for a shard whose box on the source starts at `box_start`), their result."""
    view = np.transpose(np.asarray(shard), perm)
    if affine is not None:
        return np.ascontiguousarray(affine.apply_numpy(view, dtype, box_start, perm))
    return np.ascontiguousarray(view.astype(np.dtype(dtype)))


def shards_of(name: str, array) -> dict[tuple[str, Owner], np.ndarray]:
    """`{(name, owner): numpy shard}` for every addressable shard of a jax.Array."""
    return {(name, Owner(s.device.process_index, s.device.id)): np.asarray(s.data)
            for s in array.addressable_shards}


def empty_destination(plan: Plan, fill: int = 0xA5) -> dict[tuple[str, Owner], np.ndarray]:
    """Destination shards filled with `fill` bytes, so unwritten bytes show."""
    out = {}
    for name, layout in plan.dst_layouts.items():
        for owner in layout.owners:
            _, shape = layout.shard_box(owner)
            buffer = np.full(int(np.prod(shape, dtype=np.int64)) * layout.dtype.itemsize, fill, np.uint8)
            out[(name, owner)] = buffer.view(layout.dtype).reshape(shape)
    return out


def execute(plan: Plan, sources: Mapping[tuple[str, Owner], np.ndarray],
            destinations: Mapping[tuple[str, Owner], np.ndarray] | None = None):
    """Writes every transfer of `plan` into `destinations` (made with
    `empty_destination` when None) and returns them."""
    if not isinstance(plan, Plan):
        raise PlanError(f"execute_numpy: plan is {type(plan).__name__}, not a Plan (jax_amem.plan makes one)")
    for what, given in (("sources", sources), ("destinations", destinations)):
        if not isinstance(given, Mapping) and (given is not None or what == "sources"):
            raise PlanError(f"execute_numpy: {what} is {type(given).__name__}: give a mapping of (name, Owner) "
                            "to numpy arrays, one per shard")
    out = dict(destinations) if destinations is not None else empty_destination(plan)
    prepared: dict[tuple[int, int], np.ndarray] = {}
    names = plan.dst_names
    for row in plan.transfers.tolist():
        view, src_owner = row[VIEW], plan.owner_of(row[SRC_OWNER])
        key = (view, row[SRC_OWNER])
        if key not in prepared:
            name, perm, dtype = plan.views[view]
            if (name, src_owner) not in sources:
                raise PlanError(f"source {name!r}: no shard given for owner {tuple(src_owner)}")
            box_start, _ = plan.src_layouts[name].shard_box(src_owner)
            try:
                prepared[key] = prepare_view(np.asarray(sources[(name, src_owner)]), perm, dtype, plan.affine(view),
                                             box_start).reshape(-1).view(np.uint8)
            except (TypeError, ValueError) as error:
                raise PlanError(f"source {name!r} on owner {tuple(src_owner)}: not the shard the plan reads "
                                f"({error})") from None
        src = prepared[key]
        where = (names[row[DST_TENSOR]], plan.owner_of(row[DST_OWNER]))
        if where not in out:
            raise PlanError(f"destination {where[0]!r}: no shard given for owner {tuple(where[1])}")
        dst = out[where]
        dst_bytes = dst.reshape(-1).view(np.uint8)
        for s, d, n in B.expand(plan.blocks[row[BLOCK_BEGIN]:row[BLOCK_END]]).tolist():
            dst_bytes[d:d + n] = src[s:s + n]
    return out
