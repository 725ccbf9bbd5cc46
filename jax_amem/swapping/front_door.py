"""The swap's front door: `swap`, `verify`, `forget`, the verbs users call.

`swap` turns the destination into a `Destination` (destinations.py) and hands it the work:
each kind knows where its rollout lives (this process: in_process/; another host:
cross_host/), so this door names no transport.
"""

from __future__ import annotations

from . import cache, checks
from .destinations import describe
from .report import NcclSwapReport, SwapReport


def swap(src_params, dst, *, rules=None, plan=None, verify=False, version=None,
         progress=None) -> SwapReport | NcclSwapReport:
    """Writes `src_params` (a pytree of jax.Arrays, any sharding) into `dst`, in place.

    dst: a mapping name -> torch.Tensor (a model's `state_dict()` or `dict(named_parameters())`,
    on CPU or CUDA; written by address), a pytree of jax.Arrays (written by donation: the
    report's `dst` holds the new pytree, the arrays passed in are deleted), another process's
    tensors (`open_remote(descriptor)`, CUDA IPC), or a trainer's NCCL link
    (`cross_host.connect`; needs `plan=` and `version=`, returns an NcclSwapReport). rules:
    `jax_amem.reshard.rules` (None: same names). plan: a `reshard.Plan` instead of rules (for
    destinations that are slices of a larger tensor, e.g. one tensor-parallel rank).
    Everything is checked before any byte moves: on SwapError the destination is untouched.
    verify: compare per-segment checksums afterwards, SwapError naming the first mismatch.
    progress: True / False / None (auto: a tqdm bar for swaps that take more than a moment).
    """
    rules = checks.swap_arguments(rules, plan, verify, progress)
    return describe(dst).swap_from(src_params, rules=rules, plan=plan, verify=verify, version=version,
                                   progress=progress)


def verify(src_params, dst, *, rules=None, plan=None) -> int:
    """Checks that `dst` holds what a swap of `src_params` would write (per-segment checksums
    on the host); returns the bytes checked, or raises SwapError naming the first mismatch."""
    rules = checks.swap_arguments(rules, plan, False, None)
    return describe(dst).verify_from(src_params, rules=rules, plan=plan)


def forget() -> None:
    """Drops every cached plan, program, packing and device table of the swap, in process and
    cross host (jax_amem.swapping.cache; each program of the address route holds its tensors'
    addresses, never the tensors)."""
    cache.forget()
