"""The contract of a destination written by address: memory that JAX does not own (this
process's PyTorch tensors, another process's tensors mapped through CUDA IPC, a rollout
engine's parameters), written at the addresses it gives.

A destination of this kind is `ByAddress`: everything the swap reads of it is declared there.
It hands its buffers over as data (`targets()`: one `Target` per name, after its own checks),
and `check` compares them with a plan: the one check every path writing by address shares
(in process, over CUDA IPC, into an engine's workers).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Protocol, runtime_checkable

import numpy as np

from ..reshard import Owner
from .errors import SwapError


class Target(NamedTuple):
    """One named buffer written by address: a whole single-device tensor."""
    name: str
    owner: Owner              # (process, JAX device id) the plan names it by
    device: object            # the JAX device whose stream writes it
    shape: tuple[int, ...]
    dtype: np.dtype
    address: int
    nbytes: int
    where: str                # for messages: "cuda:0", "the exporter's cuda:1", ...


@runtime_checkable
class ByAddress(Protocol):
    """What the swap reads of a destination it writes by address."""

    writes_by_address: bool   # True: this contract (JAX arrays are `by_donation.ByDonation`)
    # Everything `targets()`'s checks depend on besides the addresses: names, shapes, dtypes,
    # devices, tied groups. With the addresses (`addresses()`), the cache key of a program.
    signature: tuple
    # This process's PyTorch tensors by name, when the destination is that: large whole copies
    # then go to PyTorch's own copy_ (in_process/torch_copies.py), and a swap that repeats
    # the last one is recognised by identity and `repeat_readers()` (in_process/repeat.py). None
    # for memory that is not this process's PyTorch tensors.
    torch_tensors: Mapping | None

    def names(self) -> list[str]: ...
    def tied(self) -> list[tuple[str, ...]]: ...   # names that are one buffer (tied weights)
    def layouts(self) -> dict: ...                  # {name: reshard.Layout}: what to plan for
    def targets(self) -> dict[str, Target]: ...     # checked (writable, open, not JAX memory)
    def addresses(self) -> tuple: ...               # cheap, read on every swap (a cache key)
    # Where torch_tensors is not None (repeats are recognised only then): per fact of a tensor,
    # a chain of C callables, and which facts the swap's own write moves (read again after it).
    def repeat_readers(self) -> tuple[list, list]: ...
    def before_writing(self, devices) -> None: ...  # what must finish before the first write
    # The same for the direct launch (in_process/direct.py), which runs its copies on a CUDA stream
    # of its own choosing: per CUDA ordinal, the stream to queue them on, after what must finish
    # first (no host wait where the stream orders it). before_writing's bookkeeping is
    # `while_launched`'s: called once every copy is queued (or one failed to launch), before the
    # swap waits for them, so that it runs while the device copies.
    def before_launch(self, ordinals) -> dict[int, int]: ...
    def while_launched(self) -> None: ...
    def host_bytes(self, name: str, owner) -> np.ndarray: ...  # uint8, for verify=True


def check(targets: Mapping[str, Target], plan, process: int) -> dict[tuple[str, Owner], object]:
    """{(name, owner): JAX device} of every buffer `plan` writes here, after checking each
    against the plan: on an owner the plan writes, of the shard's shape and dtype, one tensor
    on one device, no two buffers sharing a byte. The names were checked already (names.check):
    a name the plan does not write is a tied twin of one it does."""
    out = {}
    for name, target in targets.items():
        layout = plan.dst_layouts.get(name)
        if layout is None:
            continue
        check_shard(target, layout)
        local = [o for o in layout.owners if o.process == process and o != target.owner]
        if local:
            raise SwapError(f"the plan also puts shards of {name!r} on owner(s) {[tuple(o) for o in local]} of "
                            "this process; a destination written by address is one tensor on one device")
        out[(name, target.owner)] = target.device
    check_disjoint((str(t.device), t.address, t.nbytes, t.name) for t in targets.values()
                   if t.name in plan.dst_layouts)
    return out


def check_shard(target: Target, layout) -> None:
    """SwapError unless the plan's shard of `target.owner` is `target`'s shape and dtype."""
    name = target.name
    if target.owner not in layout.owner_index:
        raise SwapError(f"destination {name!r} is on {target.where} (owner {tuple(target.owner)}), but the plan "
                        f"puts it on owner(s) {[tuple(o) for o in layout.owners][:8]}: make the plan for where "
                        "the tensor lives (nothing was written)")
    _, want = layout.shard_box(target.owner)
    if tuple(target.shape) != tuple(want):
        raise SwapError(f"destination {name!r} has shape {tuple(target.shape)}; the plan's shard for it has shape "
                        f"{tuple(want)} (nothing was written)")
    if np.dtype(target.dtype) != layout.dtype:
        raise SwapError(f"destination {name!r} has dtype {np.dtype(target.dtype).name}; the plan writes "
                        f"{layout.dtype.name} (cast on the sender with the rule's cast=; nothing was written)")


def check_disjoint(ranges) -> None:
    """SwapError naming two destinations whose bytes overlap: ranges are (device, address,
    nbytes, name). Identical buffers (tied weights) and partly overlapping views alike: two
    writers of one byte would race on the GPU and leave one of them wrong."""
    last = {}
    for device, start, nbytes, name in sorted(r for r in ranges if r[2] > 0):
        before = last.get(device)
        if before is not None and start < before[0]:
            raise SwapError(f"destinations {before[1]!r} and {name!r} share memory (tied weights, or views of one "
                            "storage?): give each buffer once, e.g. dict(model.named_parameters()), and drop the "
                            "other's rule (nothing was written)")
        if before is None or start + nbytes > before[0]:
            last[device] = (start + nbytes, name)
