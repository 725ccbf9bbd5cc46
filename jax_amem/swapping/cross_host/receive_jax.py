"""The rollout's receiver into JAX: the destinations are a pytree of
jax.Arrays (any sharding over this process's devices). The link's owner's shard of every
array it receives is donated to one jitted program that runs, per peer and bucket, the
`jax_amem_nccl_recv_bucket` custom call on XLA's stream (src/ffi/nccl_recv_bucket.cc):
ncclRecv into a staging slot on the pipe's stream, then one LaunchBufferSegmentCopy that
unpacks the bucket into the destination shards, each aliased to a result, so in place.

Order: each call's results are the next call's operands for the shards they share, and a u8
token runs through every call; the token is what orders two buckets that share no
destination, which must still be received in the order the trainer sent them (NCCL matches
a peer's receives to its sends in issue order).

Owners: a rollout is its own JAX process (process index 0 unless it runs jax.distributed),
while the plan names it by the process the link says (`link.owner`). `destination_layouts`
gives the tree's layouts with processes shifted by that difference; the rollout plans (or
publishes its layouts to the trainer) with them, and `check_destinations` compares the
arrays against the plan the same way.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import numpy as np

from ... import transport
from ...reshard import Layout, Owner
from .. import cache
from .. import names as destination_names
from ..by_donation import JaxDestination
from ..errors import SwapError
from ..report import NcclSwapReport
from ..sources import check_live_arrays, flat_named, layout_of, shard_data, shard_positions
from . import handshake
from .packing import PairPacking
from .pairs import bucket_table, owner_id, peer_packings, received_tensors, report

_programs = cache.Lru("cross-host receiver programs (JAX)")


def receive(tree, plan, link, version: int, start: float) -> NcclSwapReport:
    """receive.receive for a pytree of jax.Arrays: checked, offers answered, this owner's
    shards donated to one program that receives every bucket in place, `done` said."""
    me = owner_id(plan, link)
    destinations = check_destinations(tree, plan, me, link.owner, link.device)
    packings = peer_packings(plan, link, me, "receiver")
    handshake.answer_offers(link, packings, version, plan.key)
    key = ("jax", plan.key, link.name, link.generation, link.comm, me, link.bucket_bytes)
    fn = _programs.get(key)
    if fn is None:
        fn = _programs.put(key, jitted(bucket_calls(plan, link.owner, packings, link.pipe, destinations.ids), link.comm))
    written = jax.block_until_ready(fn(destinations.shards))
    try:  # the shards are donated and written: whatever fails now, hand them back
        handshake.finish(link, packings, version)
        dst = destinations.assemble(written)
    except Exception as error:
        raise destinations.recover(written, error) from error
    return report("rollout", version, packings, link, start, dst=dst)


def process_offset(plan_process: int) -> int:
    """Plan process minus JAX process index: how far this process's owners are shifted."""
    return int(plan_process) - jax.process_index()


@functools.lru_cache(maxsize=4096)
def shifted(layout: Layout, offset: int) -> Layout:
    """`layout` with every owner's process moved by `offset` (same boxes, same devices)."""
    if offset == 0:
        return layout
    owners = [Owner(o.process + offset, o.device) for o in layout.owners]
    return Layout(layout.shape, layout.dtype, owners, layout.starts, layout.sizes, layout.box_of_owner)


def destination_layouts(tree, process: int) -> dict[str, Layout]:
    """{name: Layout} of a pytree of jax.Arrays as the plan must name them when this process
    is plan process `process` (the process of the owner it connects with)."""
    names, leaves, _ = flat_named(tree)
    check_live_arrays(names, leaves, "destination")
    offset = process_offset(process)
    return {name: shifted(layout_of(a.sharding, a.shape, a.dtype), offset) for name, a in zip(names, leaves)}


def on_link_device(device, link_device: int) -> bool:
    """Whether a shard on JAX `device` is on the link's CUDA ordinal."""
    return getattr(device, "platform", "") == "gpu" and device.local_hardware_id == link_device


@dataclass
class Destinations:
    """What one receive writes: per plan destination tensor this owner receives (`ids`,
    sorted), its name, its shard index in the array (None: a single-device array, written
    whole) and the single-device array donated for it."""
    tree: object
    ids: tuple[int, ...]
    names: tuple[str, ...]
    indices: tuple
    shards: tuple
    owner: Owner            # the link's plan owner
    writer: JaxDestination  # made from the live tree before any donation (it rebuilds the tree)

    @property
    def order(self) -> list:
        """(name, owner) per donated shard."""
        return [(name, self.owner) for name in self.names]

    def assemble(self, outputs) -> object:
        """The new pytree: the written shards (the donated buffers' successors) in place of
        the old, the other shards as they were. The writer was made before the donation: made
        now it would find the donated single-device arrays deleted and refuse the tree."""
        return self.writer.assemble(self.order, self.indices, list(outputs))

    def recover(self, outputs, error: BaseException):
        """The PartialSwapError of a receive that failed after its shards were donated."""
        return self.writer.recover(self.order, self.indices, list(outputs), len(self.shards), error)


def check_destinations(tree, plan, owner_id: int, owner, device: int) -> Destinations:
    """The shards this owner receives into, or SwapError naming the first leaf that is no
    live jax.Array or has a deleted shard, a name missing or extra, a layout (shape, dtype, sharding) other than the plan's, an array
    given twice, two arrays sharing a buffer, or a shard off the link's GPU. Nothing is donated or sent before this passes."""
    writer = JaxDestination(tree)  # refuses a leaf that is no live jax.Array
    arrays = writer.arrays
    destination_names.check(plan.dst_layouts, arrays)
    owner = Owner(*owner)
    offset = process_offset(owner.process)
    for name, array in arrays.items():
        _check_layout(name, array, plan.dst_layouts[name], offset)
        _check_shards_live(name, array)
    ids = received_tensors(plan, owner_id)
    local = Owner(owner.process - offset, owner.device)  # the owner as this process's JAX names it
    out_names, indices, shards, devices, seen = [], [], [], [], {}
    for i in ids:
        name = plan.dst_names[i]
        array = arrays[name]
        positions = shard_positions(array)
        index, dev = positions[local]  # present: the layouts matched and the plan writes owner
        shard = array if len(positions) == 1 else shard_data(array, index)
        if id(shard) in seen:
            raise SwapError(f"destinations {seen[id(shard)]!r} and {name!r} are the same array (tied "
                            "weights?): give each buffer once and drop the other's rule (nothing was received)")
        seen[id(shard)] = name
        out_names.append(name)
        indices.append(None if len(positions) == 1 else index)
        shards.append(shard)
        devices.append(dev)
    for name, dev in zip(out_names, devices):  # devices last: every other check also runs on CPU
        if not on_link_device(dev, device):
            raise SwapError(f"destination {name!r}: the shard of owner {tuple(owner)} is on {dev}, not on the "
                            f"link's cuda:{device}; connect with device=<that shard's local GPU>")
    writer.before_donating(None)  # buffers shared by two arrays (not only one array twice), deleted shards
    return Destinations(tree, tuple(ids), tuple(out_names), tuple(indices), tuple(shards), owner, writer)


def _check_shards_live(name: str, array) -> None:
    """A sharded array one of whose shards was donated still says it is live; but that shard
    cannot be donated again (nor the array rebuilt around it): refused before the handshake."""
    for index, device in shard_positions(array).values():
        if len(array.sharding.device_set) > 1 and shard_data(array, index).is_deleted():
            raise SwapError(f"destination {name!r}: its shard on {device} was deleted (donated to a jitted "
                            "function or freed): pass the live arrays, e.g. the previous receive's "
                            "report.dst (nothing was received)")


def _check_layout(name: str, array, layout: Layout, offset: int) -> None:
    if shifted(layout_of(array.sharding, array.shape, array.dtype), offset) == layout:
        return
    if tuple(array.shape) != layout.shape or np.dtype(array.dtype) != layout.dtype:
        raise SwapError(f"destination {name!r} is {np.dtype(array.dtype).name}{list(array.shape)}; the plan "
                        f"writes {layout.dtype.name}{list(layout.shape)} (nothing was received)")
    mine = sorted((o.process + offset, o.device) for o in shard_positions(array))
    raise SwapError(f"destination {name!r} is sharded over owners {mine[:8]} ({array.sharding}); the plan "
                    f"was made for another layout over owners {[tuple(o) for o in layout.owners][:8]}: plan "
                    "with jax_amem.swapping.cross_host.destination_layouts(tree, process) (nothing was received)")


@dataclass(frozen=True)
class RecvCall:
    peer: int                   # communicator rank
    pipe: int
    slot: int
    nbytes: int
    drain: bool
    buffers: tuple[int, ...]    # positions in Destinations.shards, by the bucket's dst slot
    table: np.ndarray           # validated, split BufferSegment rows (n, 6)


def bucket_calls(plan, owner, packings: dict[int, PairPacking], pipe_of, ids) -> list[RecvCall]:
    """Every bucket call of one receive, in the order the trainers send: peers by
    communicator rank, buckets in order. `pipe_of(peer)`: the staging pipe for that peer."""
    position = {t: k for k, t in enumerate(ids)}
    calls = []
    for peer, packing in sorted(packings.items()):
        pipe = pipe_of(peer)
        last = len(packing.buckets) - 1
        for k, bucket in enumerate(packing.buckets):
            table = bucket_table(packing, bucket, plan, owner)
            calls.append(RecvCall(peer, pipe, k % 2, bucket.nbytes, k == last,
                                  tuple(position[t] for t in bucket.dst_tensors), table))
    return calls


def jitted(calls: list[RecvCall], comm: int):
    """fn(shards) -> the written shards, in place: `shards` (Destinations.shards) donated."""

    def run(shards):
        buffers = list(shards)
        token = transport.first_token()
        for call in calls:
            token, written = transport.recv_bucket(token, call.table, [buffers[b] for b in call.buffers],
                                                   pipe=call.pipe, comm=comm, peer=call.peer, slot=call.slot,
                                                   nbytes=call.nbytes, drain=call.drain)
            for b, new in zip(call.buffers, written):
                buffers[b] = new
        return tuple(buffers)

    return jax.jit(run, donate_argnums=0)
