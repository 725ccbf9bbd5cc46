"""The swap's front door: `swap`, `verify`, `forget`, the verbs users call.

`swap` takes the destination as it is given and hands the work to where the rollout lives:
this process (in_process/: PyTorch tensors, jax.Arrays, another process's tensors mapped
through CUDA IPC) or another host (cross_host/: a trainer's NCCL link).
"""

from __future__ import annotations

from . import cache, checks
from .cross_host import Link, send
from .destinations import describe
from .errors import SwapError
from .in_process import run as in_process
from .report import NcclSwapReport, SwapReport, number_version


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
    if isinstance(dst, Link):
        return _send_over(dst, src_params, rules, plan, verify, version)
    return in_process.swap(src_params, describe(dst), rules, plan, verify, version, progress)


def _send_over(link, src_params, rules, plan, verify, version):
    """The NCCL transport behind `swap(params, link, plan=...)`: checks what it cannot do first."""
    if plan is None or rules is not None:
        raise SwapError("a swap over an NCCL link needs plan= (the global plan both sides built from the same "
                        "layouts and rules), not rules=: nothing was sent")
    if version is None:
        raise SwapError("a swap over an NCCL link needs version= (the rollout's receive() passes the same one): "
                        "nothing was sent")
    if verify:
        raise SwapError("verify=True is not available over an NCCL link (the bytes land in another process); "
                        "verify on the rollout's side with jax_amem.swapping.verify: nothing was sent")
    return send(src_params, plan, link, number_version(version))


def verify(src_params, dst, *, rules=None, plan=None) -> int:
    """Checks that `dst` holds what a swap of `src_params` would write (per-segment checksums
    on the host); returns the bytes checked, or raises SwapError naming the first mismatch."""
    rules = checks.swap_arguments(rules, plan, False, None)
    return in_process.verify(src_params, describe(dst), rules, plan)


def forget() -> None:
    """Drops every cached plan, program, packing and device table of the swap (each program of
    the address route holds its tensors' addresses, never the tensors)."""
    in_process.forget()
    cache.forget()
