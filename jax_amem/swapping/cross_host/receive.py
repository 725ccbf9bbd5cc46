"""The rollout's side of the NCCL transport: `receive` checks the link and the version, then
hands the destinations to the receiver of their kind, PyTorch tensors (receive_torch.py) or
a pytree of jax.Arrays (receive_jax.py); each checks its destinations, answers every
trainer's offer (handshake.py), receives in place and says `done`.
"""

from __future__ import annotations

import time

from .. import torch_bridge
from ..errors import SwapError
from ..report import NcclSwapReport
from . import receive_jax, receive_torch
from .pairs import check_plan_and_link, check_version


def receive(dst, plan, link, version: int) -> NcclSwapReport:
    """Rollout: receives this rank's part of `plan` into `dst`, in place, and returns when the
    values are in. `dst`: {name: torch.Tensor} (this owner's shards, on the link's device,
    written by address), or a pytree of jax.Arrays (named as the plan's destinations, laid
    out as `destination_layouts(tree, link.owner.process)`; this owner's shards are donated
    and `report.dst` is the new pytree, in the same memory)."""
    start = time.perf_counter()
    version = check_version(version)
    check_plan_and_link(plan, link, "receive")
    if link.role != "rollout":
        raise SwapError(f"receive() on a {link.role} link: the rollout receives, the trainer calls send()")
    link._require_open()
    into = receive_torch if torch_bridge.is_tensor_mapping(dst) else receive_jax
    return into.receive(dst, plan, link, version, start)
