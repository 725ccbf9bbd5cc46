"""The trainer's end of the NCCL transport into vLLM workers (on other hosts, or forced with
connect(transport="nccl")): the rendezvous store, each rank's record and per-group schedule,
and the link, joined at the first update.

Nothing here is a second NCCL swap: the link is `jax_amem.swapping.cross_host`'s (trainer
rank 0, the NCCL ranks of the engine its rollout ranks), each group's per-rank plan is sent by
`cross_host.send` (buckets, handshake, the send program), and the worker receives with the
same protocol code (`jax_amem_core.wire`, through `jax_amem_vllm.nccl`). What the worker cannot
compute without JAX, the buckets of each plan, the trainer publishes once at connect
(`jax_amem_core.nccl_schedule.encode_schedule`); the handshake of every send then checks both sides
hold the same plan and packing.

Rendezvous: the trainer serves a torch.distributed TCPStore, and vLLM's init info carries its
address to every worker ({"store": "host:port"}).
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket

import numpy as np

from jax_amem_core import nccl_schedule, wire

from ..reshard import Owner
from ..swapping.cross_host import link as cross_link
from ..swapping.cross_host import pairs
from ..swapping.cross_host.packing import DEFAULT_BUCKET_BYTES, MAX_ALIGN, MIN_BUCKET_BYTES, peers_of
from ..swapping.store import TorchStore
from .errors import VllmBackendError, VllmPlanError


def checked_rendezvous(rendezvous) -> tuple[str, int]:
    """connect's `rendezvous=`: "host:port" the engine's workers reach this trainer at (port 0:
    any free port; an IPv6 address in brackets, "[::1]:port"), or None for this host's name and
    a free port. The host comes back without brackets (the workers split the address at its
    last ':')."""
    if rendezvous is None:
        return socket.gethostname(), 0
    host, _, port = rendezvous.rpartition(":") if isinstance(rendezvous, str) else ("", "", "")
    if host.startswith("[") and host.endswith("]"):
        host = _ipv6(host[1:-1])
    elif ":" in host or not _HOST.fullmatch(host):
        host = ""    # a bare IPv6 address ('::1' reads as host ':' and port 1), spaces, control characters
    if not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) < 65536:
        raise VllmBackendError(f"rendezvous={rendezvous!r:.60}: give 'host:port' (a name or address of this "
                               "host that the engine's workers reach, an IPv6 address in brackets as "
                               "'[::1]:29500', and a port, 0 for any free one); nothing was started")
    return host, int(port)


# A host name or an IPv4 address, in ASCII: labels of letters, digits, '-' and '_', not starting
# with '-', joined by single dots (a final dot allowed).
_HOST = re.compile(r"(?=.{1,253}$)(?!-)[A-Za-z0-9_-]{1,63}(?:\.(?!-)[A-Za-z0-9_-]{1,63})*\.?")


def _ipv6(text: str) -> str:
    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        return ""


def serve_store(rendezvous) -> tuple[TorchStore, str]:
    """The trainer's TCPStore server and the address the workers are given."""
    host, port = checked_rendezvous(rendezvous)
    try:
        store = TorchStore.connect("0.0.0.0", port, is_master=True)
    except Exception as error:  # noqa: BLE001 - torch raises RuntimeError / DistNetworkError
        raise VllmBackendError(f"cannot serve the NCCL rendezvous store on port {port} ({error}): give "
                               "rendezvous='host:port' with a free port") from error
    return store, f"{host}:{store.store.port}"


def trainer_owner(params) -> tuple[Owner, int]:
    """The plan owner the trainer sends as, and its local CUDA ordinal: the one GPU every array
    of the tree lives on. VllmBackendError / VllmPlanError saying why not."""
    import jax

    devices = {d for leaf in jax.tree.leaves(params) for d in leaf.sharding.addressable_devices}
    if len(devices) != 1:
        raise VllmPlanError(f"the NCCL transport sends from one GPU (one trainer rank of the link); the trainer's "
                            f"arrays live on {len(devices)} devices ({sorted(map(str, devices))[:4]}): put the "
                            "tree on one device for the update")
    device = next(iter(devices))
    if device.platform != "gpu":
        raise VllmBackendError(f"the NCCL transport sends from a GPU; the trainer's arrays are on {device}")
    return Owner(device.process_index, device.id), device.local_hardware_id


def rank_owner(link_rank: int, process_count: int) -> Owner:
    """The plan owner standing for the engine's `link_rank`-th NCCL rank: a process number no
    trainer process has."""
    return Owner(process_count + link_rank, 0)


def bucket_bytes_for(notes: list[dict]) -> int:
    """One bucket size for the link: the largest staging buffer, rounded up, at most the
    cross-host default. Each side holds two buckets per peer on its GPU."""
    largest = max(int(n["staging_bytes"]) for n in notes)
    return max(MIN_BUCKET_BYTES, min(DEFAULT_BUCKET_BYTES, -(-largest // MAX_ALIGN) * MAX_ALIGN))


def schedule(plan, source: Owner, destination: Owner, bucket_bytes: int) -> nccl_schedule.Schedule:
    """What the worker needs of one group's plan for its rank: the packing cross_host.send
    will send and each bucket's validated unpack rows (pairs.bucket_table, as the PyTorch
    receiver uses them). VllmPlanError when the plan reads from another trainer owner."""
    src, dst = plan.owner_id(source), plan.owner_id(destination)
    senders = sorted({tuple(plan.owner_of(o)) for o in peers_of(plan, dst, "receiver")})
    if senders != [tuple(source)]:
        raise VllmPlanError(f"the plan for rank owner {tuple(destination)} reads from trainer owners {senders}; "
                            f"the NCCL transport sends from {tuple(source)} alone")
    packing = pairs.packing(plan, src, dst, bucket_bytes)
    buckets = tuple(nccl_schedule.Bucket(b.nbytes, tuple(plan.dst_names[t] for t in b.dst_tensors),
                                       np.asarray(pairs.bucket_table(packing, b, plan, destination)))
                    for b in packing.buckets)
    return nccl_schedule.Schedule(plan.key, packing.digest, packing.bucket_bytes, packing.nbytes, buckets)


class TrainerLink:
    """The engine's NCCL side: which ranks it sends to, their records and schedules in the
    store, and the cross_host link (made by `join`, collective with the workers)."""

    def __init__(self, store, session: str, address: str, timeout: float, bucket_bytes: int | None = None):
        self.store, self.session, self.address, self.timeout = store, session, address, timeout
        self.name = f"vllm-{session}"
        self.link = None
        self.source: Owner | None = None
        self.device = 0
        self.bucket_bytes = bucket_bytes   # None: bucket_bytes_for the ranks' staging
        self.ranks: list = []   # the engine's NCCL ranks, in link order

    def publish(self, ranks, plans, params) -> None:
        """Each rank's record (every rank: the worker reads its own at start_weight_update)
        and, for an NCCL rank, each group's schedule."""
        self.ranks = [r for r in ranks if r.kind == "nccl"]
        if self.ranks:
            self.source, self.device = trainer_owner(params)
            self.bucket_bytes = self.bucket_bytes or bucket_bytes_for([r.note for r in self.ranks])
        generation = cross_link.next_generation(self.name)
        for index, rank in enumerate(ranks):
            tp_rank = rank.note["tp_rank"]
            if rank.kind != "nccl":
                record = {"kind": rank.kind}
            else:
                j = self.ranks.index(rank)
                record = {"kind": "nccl", "link": self.name, "generation": generation, "rank": j,
                          "rollouts": len(self.ranks), "owner": list(rank.owner((0,))),
                          "bucket_bytes": self.bucket_bytes, "timeout": self.timeout, "groups": len(plans)}
                for group, per_rank in enumerate(plans):
                    self.store.set(nccl_schedule.schedule_key(self.session, tp_rank, group), nccl_schedule.encode_schedule(
                        schedule(per_rank[index], self.source, rank.owner((group,)), self.bucket_bytes)))
            self.store.set(nccl_schedule.record_key(self.session, tp_rank), json.dumps(record).encode())

    @property
    def joined(self) -> bool:
        return self.link is not None or not self.ranks

    def join(self) -> None:
        """Trainer rank 0 of the link; the workers join in the same start_weight_update."""
        self.link = cross_link.connect(self.store, "trainer", 0, trainers=1, rollouts=len(self.ranks),
                                       owner=self.source, device=self.device, name=self.name,
                                       bucket_bytes=self.bucket_bytes, timeout=self.timeout)

    def send_group(self, picked, sends: list, version: int, more: bool = False) -> None:
        """One group's sends, `sends` [(rank, plan)] in rank order, while the workers are in
        update_weights. When one fails, every rank not offered its swap yet is told the swap
        stopped (wire.abort): it refuses at once instead of waiting out the timeout. `more`:
        later groups of the same batch follow, which the ranks already sent this group now wait
        for: they are told too."""
        from ..swapping.cross_host import send

        for i, (rank, plan) in enumerate(sends):
            peer = 1 + self.ranks.index(rank)
            offered = self.link.sequence.get(peer, 0)
            try:
                send(picked, plan, self.link, version)
            except BaseException as error:
                later = [other for other, _ in sends[i:]
                         if other is not rank or self.link.sequence.get(peer, 0) == offered]
                self.abort([r for r, _ in sends[:i]] + later if more else later, version, error)
                raise

    def abort(self, ranks: list, version: int, error: BaseException) -> None:
        """Tells each of `ranks` (waiting for its next offer) that the swap stopped."""
        reason = f"{type(error).__name__}: {error}"
        for rank in ranks:
            other = 1 + self.ranks.index(rank)
            wire.abort(self.link, other, self.link.next_sequence(other), version, reason)

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None


def read_notes(store, session: str, tp: int, timeout: float) -> list[dict]:
    """Each rank's note, as its worker published it in the store at init."""
    from jax_amem.swapping.store import StoreTimeout

    notes = []
    for rank in range(tp):
        try:
            notes.append(json.loads(store.get(nccl_schedule.note_key(session, rank), timeout=timeout)))
        except StoreTimeout as error:
            raise VllmBackendError(f"rank {rank}'s worker published no note in the rendezvous store: {error}") from None
    return notes
