"""The trainer's side of the NCCL transport: `send` checks its sources, then offers the swap
to every rollout rank it sends to and runs one jitted program per (plan, link, owner). The
program prepares the source views the plan names (transpose + cast, `prepare_view`) and, per
peer and bucket, runs the `jax_amem_nccl_send_bucket` custom call: gather the bucket's rows
into a staging slot on XLA's stream, ncclSend it on the pipe's stream (two slots per peer, so
gathering bucket k+1 overlaps sending bucket k). Calls are chained by tokens, so they run in
bucket order; a peer's last bucket drains its pipe, so the program's completion means every
byte left.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax
import numpy as np

from ... import transport
from ..._native import core
from ...affine_copy import prepare_rows
from ...copy import prepare_buffer_segments
from .. import cache
from ..errors import SwapError
from ..report import NcclSwapReport
from ..affine_views import prepared_dtype, split_rows
from ..sources import layout_of, named_arrays, prepare_view, shard_data, shard_positions
from . import handshake
from .packing import PairPacking
from .pairs import check_plan_and_link, check_version, owner_id, peer_packings, report

_programs = cache.Lru("cross-host sender programs")


def send(params, plan, link, version: int) -> NcclSwapReport:
    """Trainer: sends this rank's part of `plan` to every rollout rank it names. Returns after
    the last byte left (the program drained its pipes). Everything about the sources is
    checked before the first offer, so a refusal leaves the rollout waiting for nothing."""
    start = time.perf_counter()
    version = check_version(version)
    check_plan_and_link(plan, link, "send")
    if link.role != "trainer":
        raise SwapError(f"send() on a {link.role} link: the trainer sends, the rollout calls receive()")
    link._require_open()
    arrays = named_arrays(params, "source")
    for name, layout in plan.src_layouts.items():
        array = arrays.get(name)
        if array is None or layout_of(array.sharding, array.shape, array.dtype) != layout:
            raise SwapError(f"source {name!r}: the plan was made for other source layouts (or the name is "
                            "missing from params); plan again from these params")
    me = owner_id(plan, link)
    packings = peer_packings(plan, link, me, "sender")
    names = sorted({plan.views[v][0] for p in packings.values() for b in p.buckets for v in b.views})
    shards = source_shards(arrays, names, link.owner, link.device)
    if (reason := link.not_ready()) is not None:
        raise SwapError(reason + "; nothing was sent")  # before the offer: a send now could not finish
    key = (plan.key, link.name, link.generation, link.comm, me, link.bucket_bytes)
    fn = _programs.get(key)
    if fn is None:
        fn = _programs.put(key, jitted(plan, bucket_calls(plan, link.owner, packings, link), link.comm, names))
    for peer, pair in packings.items():
        handshake.offer(link, peer, link.next_sequence(peer), handshake.header(version, plan.key, pair))
    for peer in packings:
        handshake.await_ack(link, peer, link.sequence[peer] - 1)
    jax.block_until_ready(fn(shards))
    core.transport.check_communicator(link.comm)
    return report("trainer", version, packings, link, start)

@dataclass(frozen=True)
class BucketCall:
    peer: int          # communicator rank
    pipe: int
    slot: int
    nbytes: int
    drain: bool
    views: tuple[int, ...]   # plan view ids, by slot
    table: np.ndarray        # validated, split BufferSegment rows (n, 6)
    affine_rows: np.ndarray = field(default_factory=lambda: np.zeros((0, 6), np.int64))  # views with constant
    affine_table: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))    # steps: rows, programs
    programs: int = 0


def bucket_calls(plan, owner, packings: dict[int, PairPacking], link) -> list[BucketCall]:
    """Every bucket call of one send, in order: peers by communicator rank, buckets in order."""
    calls = []
    for peer, packing in sorted(packings.items()):
        pipe = link.pipe(peer)
        last = len(packing.buckets) - 1
        for k, bucket in enumerate(packing.buckets):
            sizes = [_view_bytes(plan, v, owner) for v in bucket.views]
            prepare_buffer_segments(bucket.send_rows, sizes, [packing.bucket_bytes])  # every row checked
            try:
                split = split_rows(plan, [(v, owner) for v in bucket.views], bucket.send_rows)
            except ValueError as error:
                raise SwapError(f"constant steps over NCCL: {error} (the pair's views of several dtypes leave a "
                                "piece unaligned in the bucket); nothing was sent") from None
            table = prepare_buffer_segments(split.byte_rows, sizes, [packing.bucket_bytes])
            affine = {}
            if split.table is not None:
                source_elements = [int(np.prod(plan.view_shard_shape(v, owner), dtype=np.int64)) for v in bucket.views]
                affine = dict(affine_rows=prepare_rows(split.affine_rows, split.table, source_elements,
                                                       [packing.bucket_bytes]),
                              affine_table=split.table.words, programs=split.table.programs)
            calls.append(BucketCall(peer, pipe, k % 2, bucket.nbytes, k == last, bucket.views, table, **affine))
    return calls


def _view_bytes(plan, view: int, owner) -> int:
    shape = plan.view_shard_shape(view, owner)
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(plan.views[view][2]).itemsize


def jitted(plan, calls: list[BucketCall], comm: int, sources: list[str]):
    """fn(shards) -> tokens: `shards[i]` is this owner's shard of source `sources[i]`."""
    slot_of = {name: i for i, name in enumerate(sources)}

    def run(shards):
        prepared = {}
        token = transport.first_token()
        done = []
        for call in calls:
            for v in call.views:
                if v not in prepared:
                    name, perm, _ = plan.views[v]
                    prepared[v] = prepare_view(shards[slot_of[name]], perm, prepared_dtype(plan, v))
            token = transport.send_bucket(token, call.table, call.affine_rows, call.affine_table,
                                          [prepared[v] for v in call.views], pipe=call.pipe, comm=comm,
                                          peer=call.peer, slot=call.slot, nbytes=call.nbytes, drain=call.drain,
                                          programs=call.programs)
            if call.drain:
                done.append(token)
        return tuple(done)

    return jax.jit(run)


def source_shards(params_by_name: dict, names: list[str], owner, device: int) -> list:
    """This owner's single-device shard of each source in `names`, checked to be on CUDA `device`."""
    shards = []
    for name in names:
        array = params_by_name.get(name)
        if array is None:
            raise SwapError(f"source {name!r} is in the plan but not in the params given to send()")
        positions = shard_positions(array)
        if owner not in positions:
            raise SwapError(f"source {name!r}: the plan sends owner {tuple(owner)}'s shard, which this "
                            f"process does not hold (its shards: {sorted(tuple(o) for o in positions)})")
        i, dev = positions[owner]
        if getattr(dev, "platform", "") != "gpu" or dev.local_hardware_id != device:
            raise SwapError(f"source {name!r}: the shard of owner {tuple(owner)} is on {dev}, not on the "
                            f"link's cuda:{device}; connect with device=<that shard's local GPU>")
        shards.append(shard_data(array, i))
    return shards
