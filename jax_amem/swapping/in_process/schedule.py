"""A plan scheduled for this process, as plain data: per destination device, groups of
destination buffers, each group one jitted call (routes.py turns a group into it). A group
lists the source shards it reads (operands, in order), the buffers it writes (with their
shard index in the destination, and their address on the address route), and per buffer
the steps that write it: (source operand, plan view, segment rows). The routes that batch
many copies per custom call read the same steps packed into chunks (`chunk_steps`). On the
address route into this process's PyTorch tensors, a buffer that is one large whole plain copy
is PyTorch's to copy (`torch_copies`), left out of the chunks.

Several transfers into one buffer (a fused QKV, a destination assembled from many source
shards) chain inside the call; many small buffers share a call, so a model of many tensors
costs a few Python dispatches, not one per tensor.

Everything a row needs is checked here, where the rows are made: every transfer this
process takes part in stays in the process, writes a buffer the destination holds and reads
a shard this process holds (SwapError naming it otherwise).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ...copy import MAX_BUFFERS_PER_SIDE
from ...reshard import Owner
from ...reshard.plan_data import BYTES, DST_OWNER, DST_TENSOR, SRC_OWNER, VIEW, Plan
from .. import report as R
from ..errors import SwapError
from .torch_copies import whole_copies

ROUTES = ("addresses", "batched")  # routes.py says what each one runs

# One jitted call (a group) holds at most: this many destination buffers (compile time: the
# batched route donates every buffer of the group, the address route writes them by address) ...
GROUP_BUFFERS = 1024
ADDRESS_GROUP_BUFFERS = 4096
# ... this many destination bytes (the progress bar's step; each call costs a dispatch, about
# 0.1-0.2 ms on the H200 machine, so a few large calls, not many) ...
GROUP_BYTES = 8 << 30
# ... and this many bytes of transformed (transposed or cast) source views, the temporaries
# XLA holds during the call.
GROUP_TEMPORARY_BYTES = 1 << 30
# Source views and destination buffers per batched custom call (the copy kernels' pointer
# table); a module attribute so tests can shrink it.
CHUNK_LIMIT = MAX_BUFFERS_PER_SIDE


@dataclass(frozen=True)
class Step:
    """One segment_copy into a buffer: from source operand `source` of the call, view `view`;
    `segments` the plan's (src_offset, dst_offset, bytes) rows."""
    source: int
    view: int
    segments: np.ndarray


@dataclass(frozen=True)
class Chunk:
    """One batched custom call: its source operands (source operand, view) in order, its
    destination operands (buffer positions in the group) in order, and its rows
    (src operand, dst operand, src_offset, dst_offset, bytes, 0): the copy's own row layout
    (copy::BufferSegment), so jax_amem.copy validates and splits them as they are."""
    views: tuple
    buffers: tuple
    rows: np.ndarray


@dataclass
class Group:
    """What one jitted call reads and writes."""
    device: object
    buffers: list = field(default_factory=list)        # [(dst name, owner)]
    dst_indices: list = field(default_factory=list)    # per buffer: its shard index in the destination (None: whole)
    steps: list = field(default_factory=list)          # per buffer, [Step]
    sources: list = field(default_factory=list)        # [(src name, owner)]: the call's source operands
    source_refs: list = field(default_factory=list)    # per operand: (src name, shard index or None, device)
    targets: list = field(default_factory=list)        # address route, per buffer: (address, bytes)
    chunks: list = field(default_factory=list)         # batched routes: the steps packed (chunk_steps)
    torch_copies: dict = field(default_factory=dict)   # {buffer position: source operand}: PyTorch's copies
    nbytes: int = 0
    temporary_bytes: int = 0                           # transformed source views held by the call
    transformed: set = field(default_factory=set)      # their (src name, owner, view)
    slots: dict = field(default_factory=dict)          # (src name, owner) -> its operand

    def source_slot(self, key, index, device) -> int:
        if key not in self.slots:
            self.slots[key] = len(self.sources)
            self.sources.append(key)
            self.source_refs.append((key[0], index, device))
        return self.slots[key]


@dataclass
class Schedule:
    plan: Plan
    route: str                 # one of ROUTES
    groups: list[Group]
    nbytes: int
    segments: int
    launches: int              # copy custom calls
    transports: dict[str, int]
    staging_bytes: int

    @property
    def order(self) -> list:
        """Every buffer, in the order the groups write them."""
        return [b for g in self.groups for b in g.buffers]

    @property
    def dst_indices(self) -> list:
        """Per buffer in `order`: its shard index in the destination (None: a whole array)."""
        return [i for g in self.groups for i in g.dst_indices]


def make(plan: Plan, sources, buffers: dict, process: int, route: str, *, shard_index=None, targets=None,
         torch_copies: bool = False) -> Schedule:
    """The schedule of `plan` for this process. `sources`: the swap's Sources (which shard of
    which array each transfer reads); `buffers`: {(name, owner): JAX device} of every buffer
    this process writes, checked against the plan (by_address.check, or the donated
    destination's check); `shard_index(name, owner)`: a donated buffer's shard index in its
    array (None: written by address); `targets`: {name: by_address.Target} on the address
    route; `torch_copies`: whether PyTorch may make large whole copies (this process's tensors).
    SwapError for a transfer that would cross processes (the IPC and NCCL transports take
    those: docs/swap.md)."""
    if route not in ROUTES:
        raise ValueError(f"route {route!r} is not one of {ROUTES}")
    names = plan.dst_names
    per_buffer = defaultdict(list)
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

    located = sources.locate_all({(plan.views[r[0]][0], r[1]) for rows in per_buffer.values() for r in rows})
    groups: dict[object, list[Group]] = defaultdict(list)
    transports: dict[str, int] = defaultdict(int)
    segments = staging = 0
    order = {name: k for k, name in enumerate(names)}
    most_buffers = ADDRESS_GROUP_BUFFERS if route == "addresses" else GROUP_BUFFERS
    for buffer in sorted(per_buffer, key=lambda b: (_first_view_made(plan, per_buffer[b]), order[b[0]], b[1])):
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
            index, src_device = located[(src_name, src_owner)]
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
        group.buffers.append(buffer)
        group.dst_indices.append(None if shard_index is None else shard_index(*buffer))
        group.steps.append(steps)
        group.nbytes += nbytes
    flat = [g for chain in groups.values() for g in chain]
    if route == "addresses":
        for group in flat:
            group.targets = [(targets[name].address, targets[name].nbytes) for name, _ in group.buffers]
            if torch_copies:  # large whole copies: PyTorch's, beside the call
                group.torch_copies = whole_copies(plan, group)
    for group in flat:  # one custom call per chunk (and one per PyTorch copy), not per transfer
        group.chunks = chunk_steps([[] if k in group.torch_copies else steps for k, steps in enumerate(group.steps)])
    launches = sum(len(g.chunks) + len(g.torch_copies) for g in flat)
    return Schedule(plan, route, flat, sum(g.nbytes for g in flat), segments, launches, dict(transports), staging)


def chunk_steps(steps_per_buffer, limit: int | None = None) -> list[Chunk]:
    """Packs the steps greedily, buffer by buffer, into chunks of at most `limit` views and
    `limit` buffers. A buffer whose steps need more views than fit continues in the next
    chunk: the chunk's result is the next chunk's destination operand (their rows never
    write the same byte: the plan writes each byte once)."""
    limit = CHUNK_LIMIT if limit is None else limit
    chunks, views, buffers, tables = [], {}, {}, []  # tables: (src operand, dst operand, (n, 3) rows)

    def close():
        if tables:
            rows = np.zeros((sum(len(t) for _, _, t in tables), 6), np.int64)  # column 5 stays 0
            at = 0
            for src, dst, table in tables:
                rows[at:at + len(table), 0], rows[at:at + len(table), 1] = src, dst
                rows[at:at + len(table), 2:5] = table
                at += len(table)
            chunks.append(Chunk(tuple(views), tuple(buffers), rows))
        views.clear()
        buffers.clear()
        tables.clear()

    for position, steps in enumerate(steps_per_buffer):
        for step in steps:
            key = (step.source, step.view)
            if len(views) + (key not in views) > limit or len(buffers) + (position not in buffers) > limit:
                close()
            src = views.setdefault(key, len(views))
            dst = buffers.setdefault(position, len(buffers))
            tables.append((src, dst, np.asarray(step.segments, dtype=np.int64).reshape(-1, 3)))
    close()
    return chunks


def _first_view_made(plan: Plan, rows) -> str:
    """The buffers' order: those that read the same transformed view sit next to each other.
    A call (group) makes each view it reads once, whole: a stacked source's view holds every
    layer. In the destination's own order (layer by layer) every group remade every stacked
    view (the Qwen3-1.7B preset made 30 GB of temporaries to write 3.4 GB: 26x the swap's
    device bound on the H200); ordered by view, each is made about once."""
    return min((plan.views[r[0]][0] for r in rows if _transforms(plan, r[0])), default="")


def _transforms(plan: Plan, view: int) -> bool:
    """Whether the view is a new array (transposed or cast), not the source shard itself. A view
    with constant steps is cast by the copy kernel: a new array only when transposed."""
    name, perm, dtype = plan.views[view]
    cast = np.dtype(dtype) != plan.src_layouts[name].dtype and plan.affine(view) is None
    return tuple(perm) != tuple(range(len(perm))) or cast


def _temporaries(plan: Plan, views) -> int:
    return sum(_shard_bytes(plan, name, owner) for name, owner, _ in views)


def _full(group: Group, most_buffers: int, nbytes: int, temporary_bytes: int) -> bool:
    """Whether a buffer of `nbytes` needing `temporary_bytes` of new views starts a new group."""
    if not group.buffers:
        return False
    # Only new views count against the room for them: a group holding one view larger than
    # the room still takes every other buffer that reads it (it refused them, and each next
    # group remade the view: a model whose stacked kernels outgrow 1 GiB remade them per layer).
    return (len(group.buffers) >= most_buffers or group.nbytes + nbytes > GROUP_BYTES
            or (temporary_bytes > 0 and group.temporary_bytes + temporary_bytes > GROUP_TEMPORARY_BYTES))


def _shard_bytes(plan: Plan, name: str, owner: Owner) -> int:
    layout = plan.src_layouts[name]
    _, size = layout.shard_box(owner)
    return int(np.prod(size, dtype=np.int64)) * layout.dtype.itemsize
