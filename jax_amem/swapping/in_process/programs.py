"""A plan compiled for this process: per destination device, groups of buffers, each group
one jitted call that prepares the source views it needs (transpose + cast, as the plan's
`views` say) and copies by one of three routes:
- "addresses" (PyTorch destinations): a few `segment_copy_to_addresses` calls per group write
  into the tensors' memory by address (addressed.py);
- "per-transfer" (JAX destinations): one `segment_copy` per transfer into donated buffers;
- "batched" (JAX destinations, opt-in): a few `segment_copy_many` calls per group (batched.py).

Several transfers into one buffer (a fused QKV, a destination assembled from many source
shards) chain inside the call; many small buffers share a call, so a model of many tensors
costs a few Python dispatches, not one per tensor.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from ...copy import segment_copy
from ...reshard import Owner
from ...reshard.plan import BYTES, DST_OWNER, DST_TENSOR, SRC_OWNER, VIEW, Plan
from .. import report as R
from ..errors import SwapError
from ..sources import prepare_view
from . import addressed, torch_copies
from . import batched as batching

# One jitted call (a group) holds at most: this many destination buffers (compile time: the
# donation routes run a custom call per transfer, the address route one per 512 buffers) ...
GROUP_BUFFERS = 1024
ADDRESS_GROUP_BUFFERS = 4096
# ... this many destination bytes (the progress bar's step; each call costs a dispatch, about
# 0.1-0.2 ms on the H200 machine, so a few large calls, not many) ...
GROUP_BYTES = 8 << 30
# ... and this many bytes of transformed (transposed or cast) source views, the temporaries
# XLA holds during the call.
GROUP_TEMPORARY_BYTES = 1 << 30


@dataclass(frozen=True)
class Step:
    """One segment_copy into a buffer: from source slot `source` of the call, view `view`."""
    source: int
    view: int
    segments: np.ndarray


@dataclass
class Group:
    device: object
    buffers: list = field(default_factory=list)        # [(dst name, owner)]
    steps: list = field(default_factory=list)          # per buffer, [Step]
    sources: list = field(default_factory=list)        # [(src name, owner)] read by this call
    source_refs: list = field(default_factory=list)    # [(src name, shard index or None, device)]
    nbytes: int = 0
    temporary_bytes: int = 0                           # transformed source views held by the call
    transformed: set = field(default_factory=set)      # their (src name, owner, view)
    fn: object = None                                  # None: nothing left for XLA (torch_copies.py)
    slots: dict = field(default_factory=dict)
    torch_copies: dict = field(default_factory=dict)   # {buffer position: source slot} PyTorch copies

    def source_slot(self, key, index, device) -> int:
        if key not in self.slots:
            self.slots[key] = len(self.sources)
            self.sources.append(key)
            self.source_refs.append((key[0], index, device))
        return self.slots[key]


@dataclass
class Program:
    plan: Plan
    groups: list[Group]
    nbytes: int
    segments: int
    launches: int
    transports: dict[str, int]
    staging_bytes: int
    last_seconds: float | None = None
    dst_indices: list | None = None   # per buffer in `order`: the destination's shard index (None: whole)
    route: str = "per-transfer"       # "addresses", "per-transfer" or "batched" (module docstring)

    @property
    def batched(self) -> bool:
        return self.route == "batched"

    @property
    def buffers(self) -> int:
        return len(self.order)

    @property
    def order(self) -> list:
        """Every buffer, in the order the groups write them."""
        return [b for g in self.groups for b in g.buffers]


ROUTES = ("addresses", "per-transfer", "batched")


def compile_program(plan: Plan, buffers: dict, locate_source, process: int, route: str = "per-transfer",
                    targets: dict | None = None, torch_tensors: bool = False) -> Program:
    """`buffers`: {(dst name, owner): JAX device} this process writes. `locate_source(name,
    owner)`: (shard index, or None for a single-device array; its JAX device). SwapError for
    a transfer that would cross processes (the IPC and NCCL transports take those: docs/swap.md).
    `route`: see the module docstring; `launches` counts the copy custom calls. `targets`:
    {(dst name, owner): (address, bytes)} for the "addresses" route. `torch_tensors`: the
    destinations are this process's PyTorch tensors, so large whole copies may go to PyTorch
    (torch_copies.py)."""
    if route not in ROUTES:
        raise ValueError(f"route {route!r} is not one of {ROUTES}")
    names = plan.dst_names
    per_buffer = defaultdict(list)
    transports: dict[str, int] = defaultdict(int)
    for i, row in enumerate(plan.transfers.tolist()):
        src, dst = plan.owner_of(row[SRC_OWNER]), plan.owner_of(row[DST_OWNER])
        if src.process != process and dst.process != process:
            continue  # another process's part of a global plan
        name = names[row[DST_TENSOR]]
        if src.process != dst.process:
            raise SwapError(f"destination {name!r}: the plan sends it from process {src.process} to process "
                            f"{dst.process}, which swap() does not do in process: give the other process's tensors "
                            "as open_remote(descriptor) (CUDA IPC, same host) or send the plan with "
                            "jax_amem.swapping.cross_host (another host); docs/swap.md. Nothing was written.")
        if (name, dst) not in buffers:
            raise SwapError(f"the plan writes destination {name!r} on owner {tuple(dst)}, which no given "
                            "destination holds (nothing was written)")
        per_buffer[(name, dst)].append((row[VIEW], src, plan.segments(i), row[BYTES]))

    groups: dict[object, list[Group]] = defaultdict(list)
    segments = launches = staging = 0
    order = {name: k for k, name in enumerate(names)}
    most_buffers = ADDRESS_GROUP_BUFFERS if route == "addresses" else GROUP_BUFFERS
    for buffer in sorted(per_buffer, key=lambda b: (order[b[0]], b[1])):
        device = buffers[buffer]
        rows = per_buffer[buffer]
        nbytes = sum(r[3] for r in rows)
        chain = groups[device]
        views = {(plan.views[r[0]][0], r[1], r[0]) for r in rows if _transforms(plan, r[0])}
        if not chain or _full(chain[-1], most_buffers, nbytes, _temporaries(plan, views - chain[-1].transformed)):
            chain.append(Group(device))
        group = chain[-1]
        group.temporary_bytes += _temporaries(plan, views - group.transformed)
        group.transformed |= views
        steps = []
        for view, src_owner, table, nbytes_row in rows:
            src_name = plan.views[view][0]
            index, src_device = locate_source(src_name, src_owner)
            known = (src_name, src_owner) in group.slots
            slot = group.source_slot((src_name, src_owner), index, src_device)
            if src_device != device:
                transports[R.CROSS_DEVICE] += nbytes_row
                if not known:
                    staging += _shard_bytes(plan, src_name, src_owner)
            else:
                transports[R.DEVICE_LOCAL] += nbytes_row
            steps.append(Step(slot, view, table))
            segments += len(table)
            launches += 1
        group.buffers.append(buffer)
        group.steps.append(steps)
        group.nbytes += nbytes
    flat = [g for chain in groups.values() for g in chain]
    if route == "addresses":
        launches = 0
        for group in flat:
            group_targets = [targets[b] for b in group.buffers]
            if torch_tensors:
                group.torch_copies = torch_copies.whole_copies(plan, group, group_targets)
            steps = [[] if k in group.torch_copies else s for k, s in enumerate(group.steps)]
            if any(steps):
                group.fn, calls = addressed.jitted(steps, plan.views, prepare_view, group_targets)
                launches += calls
            launches += len(group.torch_copies)
    elif route == "batched":
        launches = 0
        for group in flat:
            chunks = batching.chunk_steps(group.steps)
            group.fn = batching.jitted(chunks, plan.views, prepare_view)
            launches += len(chunks)
    else:
        for group in flat:
            group.fn = _jitted(group.steps, plan.views)
    return Program(plan, flat, sum(g.nbytes for g in flat), segments, launches, dict(transports), staging,
                   route=route)


def _transforms(plan: Plan, view: int) -> bool:
    """Whether the view is a new array (transposed or cast), not the source shard itself."""
    name, perm, dtype = plan.views[view]
    return tuple(perm) != tuple(range(len(perm))) or np.dtype(dtype) != plan.src_layouts[name].dtype


def _temporaries(plan: Plan, views) -> int:
    return sum(_shard_bytes(plan, name, owner) for name, owner, _ in views)


def _full(group: Group, most_buffers: int, nbytes: int, temporary_bytes: int) -> bool:
    """Whether a buffer of `nbytes` needing `temporary_bytes` of new views starts a new group."""
    if not group.buffers:
        return False
    return (len(group.buffers) >= most_buffers or group.nbytes + nbytes > GROUP_BYTES
            or group.temporary_bytes + temporary_bytes > GROUP_TEMPORARY_BYTES)


def _shard_bytes(plan: Plan, name: str, owner: Owner) -> int:
    layout = plan.src_layouts[name]
    _, size = layout.shard_box(owner)
    return int(np.prod(size, dtype=np.int64)) * layout.dtype.itemsize


def _jitted(steps_per_buffer, views):
    """One jitted call: sources in, destination buffers donated and returned written."""

    def run(sources, destinations):
        prepared = {}
        out = []
        for buffer, steps in zip(destinations, steps_per_buffer):
            for step in steps:
                key = (step.source, step.view)
                if key not in prepared:
                    prepared[key] = prepare_view(sources[step.source], *views[step.view][1:])
                buffer = segment_copy(prepared[key], buffer, step.segments)
            out.append(buffer)
        return tuple(out)

    return jax.jit(run, donate_argnums=1)
