"""Both ends of an NCCL link, jax_amem's `Link` (a JAX trainer or rollout) and the vLLM worker's
`WorkerLink` (no JAX), take their staging pipes, their close and the meeting's bucket-size check
from one place, jax_amem_core.wire: each end runs here against the same expectations. NCCL is
stood in for by a transport that records its calls (`Transport`); the store is a real TCPStore."""

import json

import pytest

torch_dist = pytest.importorskip("torch.distributed")

from jax_amem.reshard import Owner  # noqa: E402
from jax_amem.swapping.cross_host import link as cross_link  # noqa: E402
from jax_amem.swapping.errors import SwapError  # noqa: E402
from jax_amem.swapping.store import TorchStore  # noqa: E402
from jax_amem_core import native, wire  # noqa: E402
from jax_amem_vllm.nccl import WorkerLink  # noqa: E402

ENDS = [("jax_amem", SwapError), ("worker", wire.LinkError)]
DEVICE, COMM, BUCKET = 3, 77, 8192


class Transport:
    """core().transport's calls the links make, recorded; pipes are numbered from 10."""

    def __init__(self):
        self.calls, self.transport = [], self

    def create_pipe(self, device, bucket_bytes):
        self.calls.append(("create_pipe", device, bucket_bytes))
        return 10 + sum(call[0] == "create_pipe" for call in self.calls)

    def destroy_pipe(self, pipe):
        self.calls.append(("destroy_pipe", pipe))

    def destroy_communicator(self, comm):
        self.calls.append(("destroy_communicator", comm))

    def init_communicator(self, unique_id, nranks, rank, device):
        self.calls.append(("init_communicator", nranks, rank, device))
        return COMM


@pytest.fixture
def fake(monkeypatch):
    transport = Transport()
    monkeypatch.setattr(native, "core", lambda: transport)
    monkeypatch.setattr(cross_link, "core", transport)
    return transport


@pytest.fixture
def store():
    return TorchStore(torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False))


def record(generation=0, bucket_bytes=BUCKET) -> dict:
    """The trainer's record for rollout rank 0 (jax_amem_vllm/nccl.py's `record_key`)."""
    return {"link": "test", "generation": generation, "rank": 0, "rollouts": 1, "owner": [1, 0],
            "bucket_bytes": bucket_bytes, "timeout": 5.0, "groups": 1}


def joined(end: str, store):
    """Rollout rank 0 of a link of one trainer and one rollout, its communicator `COMM`."""
    if end == "jax_amem":
        return cross_link.Link("test", 0, "rollout", 0, 1, 1, 1, (Owner(0, 0), Owner(1, 0)), DEVICE, COMM, store,
                               BUCKET, 5.0, False)
    link = WorkerLink(store, record(), DEVICE)
    link.comm = COMM   # what join() leaves
    return link


@pytest.mark.parametrize("end,error", ENDS)
def test_a_link_makes_one_pipe_per_peer_and_frees_everything_once(fake, store, end, error):
    link = joined(end, store)
    assert link.Error is error
    first, other = link.pipe(0), link.pipe(2)
    assert link.pipe(0) == first and other != first
    assert fake.calls == [("create_pipe", DEVICE, BUCKET)] * 2
    link.close()
    link.close()
    assert fake.calls[2:] == [("destroy_pipe", first), ("destroy_pipe", other), ("destroy_communicator", COMM)]
    assert link.pipes == {} and link.closed
    with pytest.raises(error, match=r"^link 'test' is closed: connect\(\) again$"):
        link.pipe(0)
    assert len(fake.calls) == 5


def test_a_worker_link_that_never_joined_closes_without_a_communicator(fake, store):
    link = WorkerLink(store, record(), DEVICE)
    pipe = link.pipe(0)
    link.close()
    assert fake.calls == [("create_pipe", DEVICE, BUCKET), ("destroy_pipe", pipe)]


@pytest.mark.parametrize("end,error", ENDS)
def test_a_rank_that_asked_for_another_bucket_size_is_refused_before_the_communicator(fake, store, end, error):
    """Trainer rank 0 published its member record asking for 4096-byte buckets; the rollout
    asks for 8192: refused by name, no communicator made."""
    generation = cross_link.next_generation("test") if end == "jax_amem" else 0
    prefix = ("nccl", "test", generation)
    store.set(wire.key(*prefix, "id"), b"\x01" * 128)
    store.set(wire.key(*prefix, "member", 0), json.dumps(wire.member("trainer", 0, (0, 0), 4096)).encode())
    refusal = r"^link 'test': ranks asked for different bucket sizes \[4096, 8192\]: give every rank the same"
    with pytest.raises(error, match=refusal):
        if end == "jax_amem":
            cross_link.connect(store, "rollout", 0, trainers=1, rollouts=1, owner=(1, 0), device=DEVICE, name="test",
                               bucket_bytes=BUCKET, timeout=5.0)
        else:
            WorkerLink(store, record(generation), DEVICE).join()
    assert fake.calls == []
    member = json.loads(store.get(wire.key(*prefix, "member", 1), timeout=1.0))
    assert member == {"role": "rollout", "rank": 0, "owner": [1, 0], "bucket_bytes": BUCKET}
