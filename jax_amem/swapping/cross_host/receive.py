"""The swap's cross-host transport: a JAX trainer sends its parameters, resharded as a plan
says, over NCCL send/recv into a rollout process's PyTorch tensors or jax.Arrays, in place.

    from jax_amem.swap import nccl_transport as nt
    from jax_amem.swap.store import TorchStore

    # both sides: the same global plan (plans are deterministic: identical rows and order)
    plan = reshard.plan(trainer_layouts, rollout_layouts, rules=...)
    # trainer process (rollout rank 0 hosts the TCPStore)
    link = nt.connect(TorchStore.connect(host, port), "trainer", 0, trainers=1, rollouts=1,
                      owner=(0, 0), device=0)
    nt.send(params, plan, link, version=3)
    # rollout process
    link = nt.connect(TorchStore.connect(host, port, is_master=True), "rollout", 0, trainers=1,
                      rollouts=1, owner=(1, 0), device=0)
    nt.receive(dict(model.named_parameters()), plan, link, version=3)
    # or a JAX rollout (plan with rollout_layouts = nt.destination_layouts(params, 1)):
    params = nt.receive(params, plan, link, version=3).dst   # its shards donated, written in place

Between swaps both sides may call `jax_amem.nccl.pause(ids=[link.interposer_id])` (a collective) to
free the link's communicator and `jax_amem.nccl.resume()` before the next swap.

Each side derives, from the global plan and its own owner, the pairs it takes part in and
packs each pair's transfers into bounded buckets (nccl_packing.py); before any NCCL call a
handshake compares version, plan key and packing digest (nccl_control.py). Buckets move
through two staging slots per peer (src/transport/bucket_pipe.h). See docs/swap.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..reshard import Owner
from . import nccl_control as control
from . import torch_bridge
from .errors import SwapError
from .nccl_link import Link, connect
from .nccl_packing import PairPacking, pack_pair, peers_of
from .store import StoreTimeout

_packings: dict[tuple, PairPacking] = {}
_senders: dict[tuple, tuple] = {}
_tables: dict[tuple, object] = {}
_receivers: dict[tuple, object] = {}
_CACHE_ENTRIES = 64


@dataclass
class NcclSwapReport:
    role: str
    version: int
    bytes: int          # payload: destination bytes written (each once)
    wire_bytes: int     # bytes over the network, alignment padding included
    buckets: int
    peers: list[int]    # communicator ranks
    staging_bytes: int  # device memory of this side's staging slots
    seconds: float
    dst: object = None  # rollout: the destinations as they are now (JAX: the new pytree)

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")

    def __str__(self):
        return (f"nccl swap v{self.version} ({self.role}): {self.bytes / 2**20:.1f} MiB in {self.buckets} "
                f"bucket(s) with peers {self.peers} in {self.seconds * 1e3:.1f} ms ({self.gb_per_s:.2f} GB/s); "
                f"{self.wire_bytes / 2**20:.1f} MiB on the wire; staging {self.staging_bytes / 2**20:.1f} MiB")


def owner_id(plan, link: Link) -> int:
    try:
        return plan.owner_id(link.owner)
    except KeyError as error:
        raise SwapError(f"link rank {link.comm_rank} stands for owner {tuple(link.owner)}, which the plan does not "
                        f"know ({error.args[0]})") from None


def packing(plan, src: int, dst: int, bucket_bytes: int) -> PairPacking:
    key = (plan.key, plan.owner, src, dst, bucket_bytes)
    if key not in _packings:
        if len(_packings) > _CACHE_ENTRIES:
            _packings.clear()
        _packings[key] = pack_pair(plan, src, dst, bucket_bytes)
    return _packings[key]


def _check_version(version) -> int:
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
        raise SwapError(f"version must be an int (both sides pass the same), got {version!r}")
    return int(version)


def _peer_packings(plan, link: Link, me: int, role: str) -> dict[int, PairPacking]:
    """{peer communicator rank: packing} of every pair this owner takes part in."""
    out = {}
    for other in peers_of(plan, me, role):
        rank = link.comm_rank_of(plan.owner_of(other), f"{role} {tuple(link.owner)}")
        peer_role = "rollout" if role == "sender" else "trainer"
        if (rank >= link.trainers) != (peer_role == "rollout"):
            raise SwapError(f"the plan has owner {tuple(plan.owner_of(other))} {'receive' if role == 'sender' else 'send'}, "
                            f"but on link {link.name!r} it is a {'trainer' if rank < link.trainers else 'rollout'} rank")
        pair = (me, other) if role == "sender" else (other, me)
        out[rank] = packing(plan, *pair, link.bucket_bytes)
    return out


def send(params, plan, link: Link, version: int) -> NcclSwapReport:
    """Trainer: sends this rank's part of `plan` to every rollout rank it names. Returns after
    the last byte left (the program drained its pipes)."""
    from . import nccl_sender as sender
    from .sources import layout_of, named_arrays

    start = time.perf_counter()
    version = _check_version(version)
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
    packings = _peer_packings(plan, link, me, "sender")
    names = sorted({plan.views[v][0] for p in packings.values() for b in p.buckets for v in b.views})
    shards = sender.source_shards(arrays, names, link.owner, link.device)
    if (reason := link.not_ready()) is not None:
        raise SwapError(reason + "; nothing was sent")  # before the offer: a send now could not finish
    key = (plan.key, link.name, link.generation, link.comm, me, link.bucket_bytes)
    if key not in _senders:
        if len(_senders) > _CACHE_ENTRIES:
            _senders.clear()
        calls = sender.bucket_calls(plan, link.owner, packings, link)
        _senders[key] = sender.jitted(plan, calls, link.comm, names)
    fn = _senders[key]
    for peer, pair in packings.items():
        control.offer(link, peer, link.next_sequence(peer), control.header(version, plan.key, pair))
    for peer in packings:
        control.await_ack(link, peer, link.sequence[peer] - 1)
    import jax

    jax.block_until_ready(fn(shards))
    _core().check_communicator(link.comm)
    return _report("trainer", version, packings, link, start)


def receive(dst, plan, link: Link, version: int) -> NcclSwapReport:
    """Rollout: receives this rank's part of `plan` into `dst`, in place, and returns when the
    values are in. `dst`: {name: torch.Tensor} (this owner's shards, on the link's device,
    written by address), or a pytree of jax.Arrays (named as the plan's destinations, laid
    out as `destination_layouts(tree, link.owner.process)`; this owner's shards are donated
    and `report.dst` is the new pytree, in the same memory)."""
    start = time.perf_counter()
    version = _check_version(version)
    if link.role != "rollout":
        raise SwapError(f"receive() on a {link.role} link: the rollout receives, the trainer calls send()")
    link._require_open()
    if torch_bridge.is_tensor_mapping(dst):
        return _receive_torch(dst, plan, link, version, start)
    return _receive_jax(dst, plan, link, version, start)


def _answer_offers(link: Link, packings: dict, version: int, plan_key: str) -> None:
    """Acks (or refuses, raising SwapError) every peer's offer of this swap; both receivers."""
    refuse = link.not_ready()  # refused through the ack, so the trainer never sends into it
    for peer, pair in packings.items():
        n = link.sequence.get(peer, 0)
        try:
            control.answer(link, peer, n, control.header(version, plan_key, pair), refuse)
        except StoreTimeout:
            raise  # the trainer never offered swap n: the next call waits for it again
        except SwapError:
            link.sequence[peer] = n + 1  # refused: both sides move past swap n
            raise
        link.sequence[peer] = n + 1


def _finish_receive(link: Link, packings: dict, version: int) -> None:
    _core().check_communicator(link.comm)
    for peer in packings:
        control.mark_done(link, peer, link.sequence[peer] - 1, version)


def _receive_torch(tensors: dict, plan, link: Link, version: int, start: float) -> NcclSwapReport:
    import torch

    from . import nccl_receiver as receiver

    me = owner_id(plan, link)
    by_id = receiver.check_tensors(tensors, plan, me, link.device)
    packings = _peer_packings(plan, link, me, "receiver")
    _answer_offers(link, packings, version, plan.key)
    for peer, pair in packings.items():
        key = (plan.key, pair.src_owner, pair.dst_owner, pair.bucket_bytes, link.device)
        if key not in _tables:
            if len(_tables) > _CACHE_ENTRIES:
                _tables.clear()
            _tables[key] = receiver.upload_tables(pair, plan, link.owner, link.device)
        receiver.receive_pair(link, peer, pair, _tables[key], by_id)
    torch.cuda.current_stream(link.device).synchronize()
    _finish_receive(link, packings, version)
    return _report("rollout", version, packings, link, start, dst=tensors)


def _receive_jax(tree, plan, link: Link, version: int, start: float) -> NcclSwapReport:
    import jax

    from . import nccl_jax_receiver as jax_receiver

    me = owner_id(plan, link)
    destinations = jax_receiver.check_destinations(tree, plan, me, link.owner, link.device)
    packings = _peer_packings(plan, link, me, "receiver")
    _answer_offers(link, packings, version, plan.key)
    key = ("jax", plan.key, link.name, link.generation, link.comm, me, link.bucket_bytes)
    if key not in _receivers:
        if len(_receivers) > _CACHE_ENTRIES:
            _receivers.clear()
        calls = jax_receiver.bucket_calls(plan, link.owner, packings, link.pipe, destinations.ids)
        _receivers[key] = jax_receiver.jitted(calls, link.comm)
    written = jax.block_until_ready(_receivers[key](destinations.shards))
    _finish_receive(link, packings, version)
    return _report("rollout", version, packings, link, start, dst=destinations.assemble(written))


def _report(role, version, packings, link, start, dst=None) -> NcclSwapReport:
    return NcclSwapReport(role, version, sum(p.nbytes for p in packings.values()),
                          sum(p.wire_bytes for p in packings.values()),
                          sum(len(p.buckets) for p in packings.values()), sorted(packings),
                          link.staging_bytes, time.perf_counter() - start, dst)


def _core():
    from .._native import core

    return core.transport


def forget() -> None:
    """Drops cached packings, sender and receiver programs and device tables."""
    _packings.clear()
    _senders.clear()
    _tables.clear()
    _receivers.clear()


def destination_layouts(tree, process: int) -> dict:
    """A JAX rollout's {name: Layout} as the plan must name them, this process being plan
    process `process` (its link's owner's): see nccl_jax_receiver.py."""
    from .nccl_jax_receiver import destination_layouts as layouts

    return layouts(tree, process)


__all__ = ["Link", "NcclSwapReport", "Owner", "connect", "destination_layouts", "forget", "receive", "send"]
