"""The NCCL transport's link: one communicator over every trainer rank and every rollout
rank (trainer rank i is communicator rank i, rollout rank j is `trainers + j`), created
through jax_amem's NCCL interposer, so `jax_amem.nccl.pause(ids=[link.interposer_id])` (a
collective: both sides call it; or `pause()` for every communicator of the process) frees it
between swaps and `resume()` brings it back behind the same handle. Rank 0 makes the unique id and publishes it through the store; every rank
publishes the plan owner `(process, device)` it stands for, so both sides map plan owners
to communicator ranks identically.

Control keys (values bytes, `store.key` namespacing): `nccl/<name>/<generation>/id`,
`.../member/<comm rank>`, and per swap and sender->receiver pair `.../<s>-<r>/<n>/header`,
`.../ack`, `.../done` (handshake.py). `generation` counts this process's connects under
`name`, so reconnecting after `close()` uses fresh keys on both sides.
"""

from __future__ import annotations

import json
import operator
from collections import defaultdict
from dataclasses import dataclass, field

from jax_amem_core import wire

from ... import nccl as amem_nccl
from ..._native import core
from ...errors import GpuUnavailableError
from ...reshard import Owner
from .. import store as S
from ..errors import SwapError
from ..report import NcclSwapReport, number_version
from .packing import DEFAULT_BUCKET_BYTES, check_bucket_bytes
from .send import send

ROLES = ("trainer", "rollout")
_generations: dict[str, int] = defaultdict(int)


@dataclass
class Link(wire.Pipes):
    name: str
    generation: int
    role: str
    rank: int                   # within its role
    trainers: int
    rollouts: int
    comm_rank: int
    owners: tuple[Owner, ...]   # plan owner of each communicator rank
    device: int                 # local CUDA ordinal of this rank
    comm: int                   # communicator handle (the interposer's proxy)
    store: object
    bucket_bytes: int
    timeout: float
    pausable: bool              # created through the interposer
    interposer_id: int | None = None  # its id in jax_amem.nccl.communicators(), for pause(ids=[...])
    pipes: dict = field(default_factory=dict)      # peer comm rank -> staging pipe id
    sequence: dict = field(default_factory=dict)   # peer comm rank -> swaps done with it
    closed: bool = False        # wire.Pipes.close() sets it
    Error = SwapError           # what the handshake (jax_amem_core.wire) raises on a refusal

    @property
    def owner(self) -> Owner:
        return self.owners[self.comm_rank]

    @property
    def nranks(self) -> int:
        return self.trainers + self.rollouts

    def comm_rank_of(self, owner, what: str) -> int:
        owner = Owner(*owner)
        if owner not in self.owners:
            raise SwapError(f"{what}: the plan names owner {tuple(owner)}, which is no rank of link "
                            f"{self.name!r} (its ranks stand for {[tuple(o) for o in self.owners]}); give "
                            "each rank the owner its layouts use in connect(owner=...)")
        return self.owners.index(owner)

    def key(self, *parts) -> str:
        return S.key("nccl", self.name, self.generation, *parts)

    @property
    def staging_bytes(self) -> int:
        return sum(core.transport.pipe_staging_bytes(p) for p in self.pipes.values())

    def next_sequence(self, peer: int) -> int:
        n = self.sequence.get(peer, 0)
        self.sequence[peer] = n + 1
        return n

    def not_ready(self) -> str | None:
        """Why this rank cannot move bytes now (its communicator paused or broken), or None."""
        if self.interposer_id is None:
            return None
        state = next((c.state for c in amem_nccl.communicators() if c.id == self.interposer_id), "gone")
        if state == "active":
            return None
        return (f"link {self.name!r} rank {self.comm_rank}: its NCCL communicator is {state} "
                "(jax_amem.nccl.pause): call jax_amem.nccl.resume() on both sides before swapping")

    # The swap's Destination protocol (destinations.Destination): a trainer's link is where
    # `jax_amem.swap(params, link, plan=, version=)` sends.
    def swap_from(self, src_params, *, rules=None, plan=None, verify=False, version=None,
                  progress=None) -> NcclSwapReport:
        """`send` behind the front door: refuses first what a swap over a link cannot do."""
        if plan is None or rules is not None:
            raise SwapError("a swap over an NCCL link needs plan= (the global plan both sides built from the same "
                            "layouts and rules), not rules=: nothing was sent")
        if version is None:
            raise SwapError("a swap over an NCCL link needs version= (the rollout's receive() passes the same "
                            "one): nothing was sent")
        if verify:
            raise SwapError("verify=True is not available over an NCCL link (the bytes land in another process); "
                            "verify on the rollout's side with jax_amem.swapping.verify: nothing was sent")
        return send(src_params, plan, self, number_version(version))

    def verify_from(self, src_params, *, rules=None, plan=None) -> int:
        raise SwapError("a link cannot be verified from the trainer (the bytes land in another process): verify "
                        "on the rollout's side with jax_amem.swapping.verify(params, its destinations, plan=...)")

    def __repr__(self):
        return (f"Link({self.name!r}, {self.role} {self.rank}, comm rank {self.comm_rank}/{self.nranks}, "
                f"owner {tuple(self.owner)}, cuda:{self.device}, buckets {self.bucket_bytes >> 20} MiB, "
                f"{'pausable' if self.pausable else 'not pausable (no interposer)'})")


def connect(store, role: str, rank: int, *, trainers: int, rollouts: int, owner, device: int,
            name: str = "default", bucket_bytes: int = DEFAULT_BUCKET_BYTES,
            timeout: float = S.DEFAULT_TIMEOUT) -> Link:
    """Joins the link `name` as `role` ("trainer" / "rollout") rank `rank`. Collective: every
    trainer and rollout rank calls it. `owner`: the plan owner (process, device) this rank
    stands for; `device`: its local CUDA ordinal. `store`: see jax_amem.swapping.store."""
    if role not in ROLES:
        raise SwapError(f"role must be one of {ROLES}, got {role!r}")
    for what, count in (("trainers", trainers), ("rollouts", rollouts)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise SwapError(f"{what} must be a positive int, got {count!r}")
    size = trainers if role == "trainer" else rollouts
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise SwapError(f"{role} rank {rank!r} is out of range: the link has {size} {role} rank(s)")
    bucket_bytes = check_bucket_bytes(bucket_bytes)
    owner = _checked_link_arguments(name, owner, device, timeout)
    store = S.as_store(store)
    comm_rank = rank if role == "trainer" else trainers + rank
    nranks = trainers + rollouts
    generation = _generations[name]
    prefix = ("nccl", name, generation)
    member = wire.member(role, rank, owner, bucket_bytes)
    made = None
    if comm_rank == 0:
        try:
            made = core.transport.unique_id()
        except RuntimeError as error:  # no libnccl.so.2 in this process
            raise GpuUnavailableError(f"cross_host.connect: {error}") from None
    unique_id, members = wire.meet(store, prefix, comm_rank, nranks, member, timeout, made)
    owners = tuple(Owner(*m["owner"]) for m in members)
    if len(set(owners)) != len(owners):
        raise SwapError(f"link {name!r}: two ranks stand for the same plan owner ({[tuple(o) for o in owners]}); "
                        "give each rank its own (process, device)")
    wire.check_bucket_bytes(name, members, SwapError)
    before = {c.id for c in amem_nccl.communicators()}
    comm = core.transport.init_communicator(unique_id, nranks, comm_rank, int(device))
    # The interposer tags owners by the calling library's path, which can read "torch" when
    # the package sits under a folder named so: find ours as the one this init added.
    new = [c.id for c in amem_nccl.communicators() if c.id not in before]
    _generations[name] += 1
    return Link(name, generation, role, rank, trainers, rollouts, comm_rank, owners, int(device), comm,
                store, bucket_bytes, float(timeout), bool(core.transport.front_is_interposer()),
                new[0] if len(new) == 1 else None)


def next_generation(name: str) -> int:
    """The generation the next connect under `name` in this process uses (its keys' namespace):
    a peer that does not run connect itself (a vLLM worker) must be told it."""
    return _generations[name]


def _checked_link_arguments(name, owner, device, timeout) -> Owner:
    """connect's arguments the checks above leave: SwapError naming the one at fault; the owner."""
    if not isinstance(name, str):
        raise SwapError(f"name={name!r:.60}: the link's name is a str (default 'default')")
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise SwapError(f"device={device!r:.60}: give this rank's local CUDA ordinal, an int >= 0")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 1e6:
        raise SwapError(f"timeout={timeout!r:.60}: give a number of seconds above 0 and at most 1e6")
    try:
        process, ordinal = owner
        if isinstance(process, bool) or isinstance(ordinal, bool):
            raise TypeError
        return Owner(operator.index(process), operator.index(ordinal))
    except (TypeError, ValueError):
        raise SwapError(f"owner={owner!r:.60}: give the plan owner this rank stands for, a (process, device) "
                        "pair of ints") from None

