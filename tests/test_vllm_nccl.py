"""The vLLM backend's NCCL transport (workers on other hosts), without vLLM and on CPU where it
can be: the placement choice and the forcing option (bad values refused by name, nothing
started), what each rank receives (its record and per-group schedules in the rendezvous store,
the rows checked against slices cut by hand from the trainer's arrays through a numpy run of
the buckets), the worker's half (no JAX) answering the trainer's handshake over a real
TCPStore, the worker's receive path and the trainer's whole update loop with NCCL alone stood
in for by a memory copy (`Wire`; vLLM's workers by `Workers`), and (GPU) the trainer sending
into two rank processes holding vLLM-shaped TP=2 tensors over NCCL, bit for bit.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the staging buffers are PyTorch tensors")
torch_dist = pytest.importorskip("torch.distributed")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_amem  # noqa: E402,F401
from jax_amem.reshard import Owner  # noqa: E402
from jax_amem.reshard.numpy_exec import prepare_view  # noqa: E402
from jax_amem.swapping.cross_host import handshake, pairs  # noqa: E402
from jax_amem.swapping.cross_host.link import Link  # noqa: E402
from jax_amem.swapping.errors import SwapError  # noqa: E402
from jax_amem.swapping.store import TorchStore  # noqa: E402
from jax_amem.vllm import VllmBackendError, VllmPlanError, connect  # noqa: E402
from jax_amem.vllm import nccl  # noqa: E402
from jax_amem.vllm.trainer import VllmEngine  # noqa: E402
from jax_amem.vllm.transports import Nccl, checked_transport, placement, views  # noqa: E402
from jax_amem_vllm import nccl as worker_side  # noqa: E402
from jax_amem_core import wire  # noqa: E402
import vllm_models as vm  # noqa: E402
from test_vllm_ranks import expected, notes  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ELSEWHERE = "another-host.example"


@pytest.fixture
def server():
    return TorchStore(torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False))


def remote(note: dict, host: str = ELSEWHERE, device: str = "cuda:0") -> dict:
    """A rank's note as a worker on another host publishes it."""
    return {**note, "host": host, "pid": 4242, "device": device, "staging": {"kind": "cuda_ipc", "device": 0}}


class Engine:
    """What connect reads of a vllm.LLM, and a record of what it asks the workers. At init with
    a store, each worker "on another host" publishes its note there, as jax_amem_vllm's engine does."""

    def __init__(self, rank_notes, backend="jax_amem"):
        parallel = types.SimpleNamespace(pipeline_parallel_size=1, data_parallel_size=1,
                                         tensor_parallel_size=len(rank_notes))
        config = types.SimpleNamespace(weight_transfer_config=types.SimpleNamespace(backend=backend),
                                       parallel_config=parallel)
        self.llm_engine = types.SimpleNamespace(vllm_config=config)
        self.notes, self.calls = rank_notes, []

    def collective_rpc(self, method, timeout=None, kwargs=None):
        from jax_amem_vllm import staging

        self.calls.append((method, kwargs))
        info = (kwargs or {}).get("init_info", {})
        if method == "init_weight_transfer_engine" and info.get("store"):
            host, _, port = info["store"].rpartition(":")
            store = wire.TorchStore.connect(host, int(port))
            for note in self.notes:
                store.set(worker_side.note_key(info["session"], note["tp_rank"]), json.dumps(note).encode())
        elif method == "init_weight_transfer_engine":   # a worker of this host leaves its note in a file
            for note in self.notes:
                if note["host"] == socket.gethostname():
                    with open(staging.note_path(info["directory"], info["session"], note["tp_rank"]), "w") as f:
                        json.dump(note, f)
        return [None] * len(self.notes)

    def reset_prefix_cache(self):
        return True


def llama(seed=3):
    tree = vm.flax_tree("llama", seed)
    return tree, jax.tree.map(jnp.asarray, tree)


# ----------------------------------------------------------------------------- the choice

def test_placement_picks_nccl_for_another_host_or_when_forced():
    here = socket.gethostname()
    shm = {"host": here, "staging": {"kind": "shared_memory"}}
    ipc = {"host": here, "staging": {"kind": "cuda_ipc"}}
    far = {"host": ELSEWHERE, "staging": {"kind": "cuda_ipc"}}
    assert [placement(n, "auto") for n in (shm, ipc, far)] == ["shared_memory", "cuda_ipc", "nccl"]
    assert [placement(n, "nccl") for n in (shm, ipc, far)] == ["nccl"] * 3


@pytest.mark.parametrize("bad", ["NCCL", "ipc", "", None, 1, ("nccl",)])
def test_a_bad_transport_is_refused_by_name_before_the_engine_is_touched(bad):
    with pytest.raises(VllmBackendError, match=r"transport=.*give 'auto'.*or 'nccl'.*nothing was started"):
        checked_transport(bad)
    engine = Engine([remote(n) for n in notes("llama", "flax", llama()[1])])
    with pytest.raises(VllmBackendError, match=r"transport="):
        connect(engine, llama()[1], family="llama", transport=bad)
    assert engine.calls == []


@pytest.mark.parametrize("bad", ["no-port", "host:", ":5000", "host:70000", "host:12a", "host:\u00b2", 5000])
def test_a_bad_rendezvous_is_refused_by_name_before_the_engine_is_touched(bad):
    engine = Engine([remote(n) for n in notes("llama", "flax", llama()[1])])
    with pytest.raises(VllmBackendError, match=r"rendezvous=.*'host:port'.*nothing was started"):
        connect(engine, llama()[1], family="llama", transport="nccl", rendezvous=bad)
    assert engine.calls == []


def test_a_cpu_worker_cannot_be_reached_over_nccl():
    note = remote(notes("llama", "flax", llama()[1])[1], device="cpu")
    with pytest.raises(VllmBackendError, match=r"rank 1's worker runs on 'cpu' \(host 'another-host.example'\).*"
                                               r"needs an engine on CUDA"):
        Nccl(note, Owner(1, 0))


def test_the_trainer_sends_from_one_gpu():
    params = llama()[1]
    with pytest.raises(VllmBackendError, match=r"sends from a GPU; the trainer's arrays are on .*cpu"):
        nccl.trainer_owner(params)
    spread = {"a": jax.device_put(jnp.zeros(4), jax.devices()[0]), "b": jax.device_put(jnp.zeros(4), jax.devices()[1])}
    with pytest.raises(VllmPlanError, match=r"arrays live on 2 devices"):
        nccl.trainer_owner(spread)


def test_auto_reaches_workers_on_another_host_through_the_store(monkeypatch):
    """No rank leaves a note on this host: connect serves its store, inits again with its
    address, reads the notes from it and picks NCCL for every rank; the trainer's arrays on CPU
    are then refused (VllmBackendError) before any update, and no rank got a record."""
    params = llama()[1]
    engine = Engine([remote(n) for n in notes("llama", "flax", params)])
    with pytest.raises(VllmBackendError, match="sends from a GPU"):
        connect(engine, params, family="llama", rendezvous="127.0.0.1:0")
    inits = [kw["init_info"] for method, kw in engine.calls if method == "init_weight_transfer_engine"]
    assert len(inits) == 2 and "store" not in inits[0] and inits[1]["store"].startswith("127.0.0.1:")
    assert inits[1]["session"] == inits[0]["session"] and inits[1]["timeout"] == 300.0
    assert [m for m, _ in engine.calls] == ["init_weight_transfer_engine"] * 2


def over_nccl(monkeypatch, server, family, source, params, session, *, bucket_bytes=None, llm=None, timeout=60.0,
              staging_bytes=None):
    """The trainer's half connected to two ranks "on another host" over NCCL, as connect builds
    it: each rank an `Nccl` transport, the engine's plans, each rank's record and schedules
    published in `server`. The trainer's arrays on CPU stand in for its GPU (trainer_owner).
    `llm(rank_notes)`: the engine's workers (default: `Engine`, which only records the calls).
    `staging_bytes`: the workers' staging budget, their groups packed into batches
    (test_vllm_batches.batched); None: one group at a time.
    Returns (engine, ranks, the TrainerLink, the ranks' notes)."""
    from test_vllm_batches import batched

    cpu = jax.devices()[0]
    monkeypatch.setattr(nccl, "trainer_owner", lambda p: (Owner(cpu.process_index, cpu.id), 0))
    rank_notes = [remote(n if staging_bytes is None else batched(n, staging_bytes))
                  for n in notes(family, source, params)]
    ranks = [Nccl(note, nccl.rank_owner(j, 1)) for j, note in enumerate(rank_notes)]
    link = nccl.TrainerLink(server, session, "127.0.0.1:1", timeout, bucket_bytes)
    engine = VllmEngine(llm(rank_notes) if llm else Engine(rank_notes), ranks, params, family=family, source=source,
                        rules=None, cast=None, timeout=timeout, link=link)
    return engine, ranks, link, rank_notes


def test_auto_mixes_transports_by_each_ranks_host(server, monkeypatch, tmp_path):
    """Rank 0 on this host (its staging a shared file), rank 1 elsewhere: connect writes rank 0
    by shared memory and rank 1 over NCCL, the link holding rank 1 alone; each rank's record says
    which, and the engine reports both."""
    from jax_amem_vllm import staging

    params = llama()[1]
    cpu = jax.devices()[0]
    monkeypatch.setattr(nccl, "trainer_owner", lambda p: (Owner(cpu.process_index, cpu.id), 0))
    rank_notes = [remote(n) for n in notes("llama", "flax", params)]
    _, place = staging.allocate(rank_notes[0]["staging_bytes"], torch.device("cpu"), str(tmp_path), "mixed", 0)
    rank_notes[0] = {**rank_notes[0], "host": socket.gethostname(), "device": "cpu", "staging": place}
    engine = connect(Engine(rank_notes), params, family="llama", rendezvous="127.0.0.1:0", session="mixed")
    assert engine.transport == "nccl+shared_memory"
    assert [r.kind for r in engine.ranks] == ["shared_memory", "nccl"]
    assert engine.link.ranks == [engine.ranks[1]] and engine.ranks[1].owner(0) == Owner(1, 0)
    records = [json.loads(engine.link.store.get(worker_side.record_key("mixed", r), 1.0)) for r in (0, 1)]
    assert records[0] == {"kind": "shared_memory"}
    assert records[1]["kind"] == "nccl" and records[1]["rank"] == 0 and records[1]["rollouts"] == 1
    assert not os.path.exists(place["path"])   # mapped by both sides, then removed
    engine.close()


# ----------------------------------------------------------------------------- what each rank receives

def gathered(plan, bucket, picked) -> np.ndarray:
    """One bucket's bytes as the trainer's send program gathers them: cross_host's send rows
    from the prepared views (transposed and cast as the plan says) of the picked arrays."""
    slot = np.zeros(bucket.nbytes, np.uint8)
    for v_slot, _, src_offset, offset, n, _ in bucket.send_rows.tolist():
        name, perm, dtype = plan.views[bucket.views[v_slot]]
        view = prepare_view(np.asarray(picked[name]), perm, dtype).reshape(-1).view(np.uint8)
        slot[offset:offset + n] = view[src_offset:src_offset + n]
    return slot


def run_buckets(plan, schedule, picked, source, destination, staged):
    """The buckets of `schedule` in numpy, as the link moves them: the trainer gathers each
    bucket from its prepared views (cross_host's send rows of the same packing), the worker
    unpacks it with the rows it received and validated (`rows`) into its staged tensors."""
    packing = pairs.packing(plan, plan.owner_id(source), plan.owner_id(destination), schedule.bucket_bytes)
    rows = worker_side.checked_rows(schedule, staged, 0)
    assert packing.digest == schedule.digest and len(packing.buckets) == len(schedule.buckets)
    for bucket, ours, table in zip(packing.buckets, schedule.buckets, rows):
        assert ours.nbytes == bucket.nbytes and ours.tensors == tuple(plan.dst_names[t] for t in bucket.dst_tensors)
        slot = gathered(plan, bucket, picked)
        for _, d_slot, offset, dst_offset, n, _ in table.tolist():
            target = staged[ours.tensors[d_slot]].reshape(-1).view(torch.uint8).numpy()
            target[dst_offset:dst_offset + n] = slot[offset:offset + n]


@pytest.mark.parametrize("family, source, bucket_bytes", [("qwen3_moe", "flax", None), ("llama", "flax", 4096),
                                                          ("qwen3", "maxtext", 8192)])
def test_each_rank_receives_its_slice_through_its_schedule(server, monkeypatch, family, source, bucket_bytes):
    """Each rank's record and every group's schedule as the trainer publishes them; the rows,
    run in numpy, land exactly the rank's slice (cut by hand from the trainer's arrays) in its
    staging buffer, and every tensor of the rank is written."""
    tree = vm.flax_tree(family, 7)
    params = jax.tree.map(jnp.asarray, tree if source == "flax" else vm.maxtext_tree(tree))
    engine, ranks, link, rank_notes = over_nccl(monkeypatch, server, family, source, params, "s1",
                                                bucket_bytes=bucket_bytes)
    want_bucket = bucket_bytes or nccl.bucket_bytes_for(rank_notes)
    for j, rank in enumerate(ranks):
        tp_rank = rank.note["tp_rank"]
        record = json.loads(server.get(worker_side.record_key("s1", tp_rank), 1.0))
        assert record == {"kind": "nccl", "link": "vllm-s1", "generation": 0, "rank": j, "rollouts": 2,
                          "owner": [1 + j, 0], "bucket_bytes": want_bucket, "timeout": 60.0,
                          "groups": len(engine.plans)}
        buffer = torch.zeros(rank.note["staging_bytes"], dtype=torch.uint8)
        for group, plans in enumerate(engine.plans):
            schedule = worker_side.decode_schedule(server.get(worker_side.schedule_key("s1", tp_rank, group), 1.0))
            plan = plans[j]
            assert schedule.expected() == {**handshake.header(0, plan.key, pairs.packing(
                plan, plan.owner_id(link.source), plan.owner_id(rank.owner(group)), want_bucket)), "version": None}
            buffer.zero_()
            staged = views(buffer, rank.note["groups"][group])
            run_buckets(plan, schedule, engine.picks[group](params), link.source, rank.owner(group), staged)
            for name, tensor in staged.items():
                assert np.array_equal(tensor.numpy(), expected(tree, name, tp_rank)), (tp_rank, group, name)


def test_a_schedule_that_does_not_fit_the_workers_staging_is_refused(server, monkeypatch):
    """The worker checks the trainer's rows against its own staged tensors before anything
    arrives: a rank smaller than planned, or a tensor it does not hold, is refused by name."""
    params = llama()[1]
    rank_notes = over_nccl(monkeypatch, server, "llama", "flax", params, "s2")[3]
    name = "model.layers.0.self_attn.qkv_proj.weight"
    index = next(i for i, g in enumerate(rank_notes[0]["groups"]) if name in {t["name"] for t in g})
    data = server.get(worker_side.schedule_key("s2", 0, index), 1.0)
    schedule = worker_side.decode_schedule(data)
    staged = views(torch.zeros(rank_notes[0]["staging_bytes"], dtype=torch.uint8), rank_notes[0]["groups"][index])
    assert len(worker_side.checked_rows(schedule, staged, index)) == len(schedule.buckets)
    small = {**staged, name: staged[name][:-1]}
    with pytest.raises(wire.LinkError, match=rf"group {index} bucket 0: the trainer's rows do not fit"):
        worker_side.checked_rows(schedule, small, index)
    with pytest.raises(wire.LinkError, match=r"writes \['model.layers.0.self_attn.qkv_proj.weight'\], which this "
                                            r"worker does not stage"):
        worker_side.checked_rows(schedule, {k: v for k, v in staged.items() if k != name}, index)
    damaged = data[:-48]
    with pytest.raises(wire.LinkError, match="damaged"):
        worker_side.decode_schedule(damaged)


class Wire:
    """NCCL stood in for by a memory copy, for the trainer's and the
    workers' side: communicator rank r's handle is 100 + r; the trainer's buckets, gathered in
    numpy, queue up per receiving communicator; `recv_bucket` takes the next, checks the call
    (slot k % 2, size, peer, the worker's validated rows) and unpacks it by address with those
    rows into the destinations the worker passed. Everything else is real: the core's row
    checks, the store, the handshake."""

    def __init__(self, real):
        import collections
        import queue

        self.real, self.queues, self.calls, self.tables = real, collections.defaultdict(queue.Queue), [], []
        self.transport = self

    @property
    def copy(self):
        return self.real.copy

    def unique_id(self):
        return b"\x01" * 128

    def front_is_interposer(self):
        return False

    def init_communicator(self, unique_id, nranks, rank, device):
        self.calls.append(("init", bytes(unique_id), nranks, rank, device))
        return 100 + rank

    def create_pipe(self, device, bucket_bytes):
        self.calls.append(("pipe", device, bucket_bytes))
        return 5

    def recv_bucket(self, pipe, stream, slot, nbytes, peer, comm, destinations, rows, count):
        import ctypes

        data, k = self.queues[comm].get(timeout=20)
        assert (pipe, slot, nbytes, peer) == (5, k % 2, len(data), 0)
        table = next(t for t in self.tables() if t.data_ptr() == rows)
        assert len(table) == count
        for _, d_slot, offset, dst_offset, n, _ in table.tolist():
            ctypes.memmove(destinations[d_slot] + dst_offset, data.ctypes.data + offset, n)
        self.calls.append(("recv", comm, slot, nbytes))

    def send(self, picked, plan, link, version):
        """cross_host.send with its GPU program replaced by the numpy gather: the real checks of
        the plan against the link, the real handshake, then the buckets queued for the peer."""
        packings = pairs.peer_packings(plan, link, pairs.owner_id(plan, link), "sender")
        for peer, pair in packings.items():
            handshake.offer(link, peer, link.next_sequence(peer), handshake.header(version, plan.key, pair))
        for peer in packings:
            handshake.await_ack(link, peer, link.sequence[peer] - 1)
        for peer, pair in packings.items():
            for k, bucket in enumerate(pair.buckets):
                self.queues[100 + peer].put((gathered(plan, bucket, picked), k))

    def drain(self, pipe, stream):
        self.calls.append(("drain", pipe))

    def check_communicator(self, comm):
        pass

    def destroy_pipe(self, pipe):
        pass

    def destroy_communicator(self, comm):
        pass


def wire_in(monkeypatch, receivers) -> Wire:
    """The Wire put in place of NCCL on both sides (the worker half's core, cross_host's core)."""
    from jax_amem.swapping.cross_host import link as cross_link
    from jax_amem_core import native

    fake = Wire(native.core())
    fake.tables = lambda: [t for r in receivers for _, tables in r.groups.values() for t in tables]
    monkeypatch.setattr(native, "core", lambda: fake)
    monkeypatch.setattr(cross_link, "core", fake)
    monkeypatch.setattr(worker_side.Receiver, "_stream", lambda self: 0)
    monkeypatch.setattr(worker_side.Receiver, "_synchronize", lambda self: None)
    return fake


def test_the_worker_receives_every_group_into_its_staging_through_the_link(server, monkeypatch):
    """The worker's receive path end to end on CPU, NCCL alone stood in for (`Wire`): rank 1
    reads its record, joins the link (meeting the trainer and rank 0 in the store), and per group
    answers the trainer's offer, takes each bucket into the pipe slot k % 2 with its validated
    rows and says done. Its staging then holds exactly its hand-cut slices, for two versions."""
    trees = [vm.flax_tree("llama", seed) for seed in (8, 9)]
    params = [jax.tree.map(jnp.asarray, t) for t in trees]
    engine, ranks, link, rank_notes = over_nccl(monkeypatch, server, "llama", "flax", params[0], "s4",
                                                bucket_bytes=4096, timeout=30.0)
    note = rank_notes[1]
    receiver = worker_side.Receiver(server, "s4", 1, torch.device("cpu"))
    fake = wire_in(monkeypatch, [receiver])
    # The trainer's and rank 0's side of the meeting, as cross_host.connect publishes it.
    server.set(wire.key("nccl", "vllm-s4", 0, "id"), b"\x01" * 128)
    for comm_rank, role, rank, owner in ((0, "trainer", 0, link.source), (1, "rollout", 0, ranks[0].owner(0))):
        server.set(wire.key("nccl", "vllm-s4", 0, "member", comm_rank), json.dumps(
            {"role": role, "rank": rank, "owner": list(owner), "bucket_bytes": 4096}).encode())
    assert receiver.transport(5.0)["rank"] == 1 and receiver.active
    trainer = Link("vllm-s4", 0, "trainer", 0, 1, 2, 0, (link.source, ranks[0].owner(0), ranks[1].owner(0)), 0, 0,
                   server, 4096, 30.0, False)
    buffer = torch.zeros(note["staging_bytes"], dtype=torch.uint8)
    for version, tree in enumerate(trees, start=1):
        for group, plans in enumerate(engine.plans):
            plan, picked = plans[1], engine.picks[group](params[version - 1])
            packing = pairs.packing(plan, plan.owner_id(link.source), plan.owner_id(ranks[1].owner(0)), 4096)
            handshake.offer(trainer, 2, trainer.next_sequence(2), handshake.header(version, plan.key, packing))
            for k, bucket in enumerate(packing.buckets):
                fake.queues[102].put((gathered(plan, bucket, picked), k))
            buffer.fill_(0xEE)
            staged = views(buffer, note["groups"][group])
            assert receiver.receive(group, staged) == version
            assert fake.queues[102].empty()
            handshake.await_ack(trainer, 2, trainer.sequence[2] - 1)
            assert server.get(trainer.key("0-2", trainer.sequence[2] - 1, "done"), 1.0) == str(version).encode()
            for name, tensor in staged.items():
                assert np.array_equal(tensor.numpy(), expected(tree, name, 1)), (version, group, name)
    inits = [c for c in fake.calls if c[0] == "init"]
    assert inits == [("init", b"\x01" * 128, 3, 2, 0)] and [c for c in fake.calls if c[0] == "pipe"] == [("pipe", 0, 4096)]
    received = [c for c in fake.calls if c[0] == "recv"]
    assert len(received) > 2 * len(engine.plans)   # 4 KiB buckets: several per group
    receiver.close()


class Workers:
    """vLLM's workers as the trainer's half drives them: `collective_rpc` runs on every rank at
    once (a thread each, as vLLM's worker processes do) and raises the first rank's error. Each
    rank is the worker half's own receiving (jax_amem_vllm.nccl.Receiver, its own store client)
    and a staging buffer, as JaxAmemWeightTransferEngine holds them: start_weight_update joins
    the link, update_weights receives the group, then commits it (copies it into `held`)."""

    def __init__(self, port: int, session: str, rank_notes):
        self.notes = rank_notes
        self.receivers = [worker_side.Receiver(wire.TorchStore.connect("127.0.0.1", port), session, n["tp_rank"],
                                               torch.device("cpu")) for n in rank_notes]
        self.buffers = [torch.zeros(n["staging_bytes"], dtype=torch.uint8) for n in rank_notes]
        self.held = [{} for _ in rank_notes]
        self.errors: list = []

    def _one(self, rank, method, kwargs):
        receiver, note = self.receivers[rank], self.notes[rank]
        if method == "start_weight_update" and receiver.transport(10.0) is not None:
            receiver.join()
        elif method == "update_weights":   # as the worker engine: every group received, then committed
            info = kwargs["update_info"]
            groups = info["groups"] if "groups" in info else [info["group"]]
            staged = {group: views(self.buffers[rank], note["groups"][group]) for group in groups}
            for group in groups:
                receiver.receive(group, staged[group])
            for group in groups:
                self.held[rank].update({n: t.clone() for n, t in staged[group].items()})

    def collective_rpc(self, method, timeout=None, kwargs=None):
        import threading

        errors = []

        def run(rank):
            try:
                self._one(rank, method, kwargs)
            except BaseException as error:  # noqa: BLE001 - raised below, as vLLM raises a worker's error
                errors.append(error)
        threads = [threading.Thread(target=run, args=(r,)) for r in range(len(self.notes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.errors += errors
        if errors:
            raise RuntimeError(f"a worker failed: {errors[0]}")
        return [None] * len(self.notes)

    def reset_prefix_cache(self):
        return True


def stopping_at(call: int, fake):
    """`fake.send`, but its `call`-th call raises before anything is offered (the trainer stopped)."""
    calls = []

    def send(picked, plan, link, version):
        calls.append(plan.key)
        if len(calls) == call:
            raise KeyboardInterrupt("the trainer stopped")
        return fake.send(picked, plan, link, version)
    return send


@pytest.mark.parametrize("stop", ["send", "pick"])
def test_a_batch_whose_send_stops_midway_fails_fast_on_every_rank(server, monkeypatch, stop):
    """The workers stage the whole model as one batch (one update_weights receives every group,
    then commits). The trainer stops at group 2: its send to rank 1 fails before the offer, after
    rank 0 took group 2 and waits for group 3 ("send"), or the group's layer pick fails before
    any send ("pick", the direct launch off so every group picks). Every rank is told the swap
    stopped and refuses at once (not after the timeout), nothing is committed, and the next
    update is complete."""
    import time

    from jax_amem.swapping import cross_host
    from jax_amem.vllm import VllmUpdateError
    from jax_amem.vllm import trainer

    trees = [vm.flax_tree("qwen3", seed) for seed in (12, 13)]
    params = [jax.tree.map(jnp.asarray, t) for t in trees]
    engine, ranks, _, _ = over_nccl(monkeypatch, server, "qwen3", "flax", params[0], f"s9{stop}", bucket_bytes=8192,
                                    timeout=20.0, staging_bytes=1 << 40,
                                    llm=lambda rank_notes: Workers(server.store.port, f"s9{stop}", rank_notes))
    workers = engine.llm
    assert engine.batches == [list(range(len(ranks[0].note["groups"])))]
    fake = wire_in(monkeypatch, workers.receivers)
    monkeypatch.setattr(cross_host, "send", fake.send)
    engine.update(params[0])
    if stop == "send":
        monkeypatch.setattr(cross_host, "send", stopping_at(6, fake))   # group 2's send to rank 1: before its offer
    else:
        real_call = trainer.Pick.__call__
        picks = []

        def pick_fails(self, tree):
            picks.append(1)
            if len(picks) == 3:
                raise KeyboardInterrupt("the trainer stopped")
            return real_call(self, tree)
        monkeypatch.setattr(trainer.Pick, "__call__", pick_fails)
    held = [dict(h) for h in workers.held]
    start = time.perf_counter()
    with pytest.raises(VllmUpdateError, match=r"after committing 0 of .*KeyboardInterrupt: the trainer stopped"):
        engine.update(params[1])
    assert time.perf_counter() - start < 10, "a worker waited out its timeout"
    assert len(workers.errors) == 2 and all("the trainer stopped the swap before sending" in str(e)
                                              for e in workers.errors)
    assert all(h.keys() == before.keys() and all(h[n] is t for n, t in before.items())
               for h, before in zip(workers.held, held))   # nothing committed
    monkeypatch.setattr(cross_host, "send", fake.send)
    if stop == "pick":
        monkeypatch.setattr(trainer.Pick, "__call__", real_call)
    engine.update(params[1])
    for rank, held in zip(ranks, workers.held):
        for name, tensor in held.items():
            assert np.array_equal(tensor.numpy(), expected(trees[1], name, rank.note["tp_rank"])), name
    for receiver in workers.receivers:
        receiver.close()


def test_updates_over_the_link_end_to_end_and_a_stopped_send_fails_fast(server, monkeypatch):
    """The trainer's update loop and both TP workers over the link, on CPU with NCCL alone stood
    in for (`Wire`): the first start_weight_update joins the link on all three ranks (the
    trainer alongside the workers' call); each update_weights receives while the trainer sends
    rank 0 then rank 1. Both ranks hold their hand-cut slices after an update. A send that fails
    before its offer tells every rank not yet offered that the swap stopped: their update_weights
    refuse at once (not after the timeout), and the next update is complete (the handshake's
    counts stayed in step)."""
    import time

    from jax_amem.swapping import cross_host
    from jax_amem.vllm import VllmUpdateError

    trees = [vm.flax_tree("qwen3", seed) for seed in (12, 13)]
    params = [jax.tree.map(jnp.asarray, t) for t in trees]
    engine, ranks, _, _ = over_nccl(monkeypatch, server, "qwen3", "flax", params[0], "s5", bucket_bytes=8192,
                                    timeout=20.0, llm=lambda rank_notes: Workers(server.store.port, "s5", rank_notes))
    workers = engine.llm
    fake = wire_in(monkeypatch, workers.receivers)
    monkeypatch.setattr(cross_host, "send", fake.send)
    assert engine.transport == "nccl"

    def holds(tree):
        for rank, held in zip(ranks, workers.held):
            assert held.keys() == {t["name"] for g in rank.note["groups"] for t in g}
            for name, tensor in held.items():
                assert np.array_equal(tensor.numpy(), expected(tree, name, rank.note["tp_rank"])), name

    report = engine.update(params[0])
    holds(trees[0])
    assert report.version == 1 and report.groups == len(engine.plans) and report.swap_seconds > 0
    assert sorted(c[3] for c in fake.calls if c[0] == "init") == [0, 1, 2]   # trainer and both ranks, once

    monkeypatch.setattr(cross_host, "send", stopping_at(5, fake))   # group 2's send to rank 0: before its offer
    start = time.perf_counter()
    with pytest.raises(VllmUpdateError, match=r"after committing 2 of .*KeyboardInterrupt: the trainer stopped") as caught:
        engine.update(params[1])
    assert time.perf_counter() - start < 10, "the workers waited out their timeout"
    assert caught.value.served == "refusing"
    assert len(workers.errors) == 2 and all("the trainer stopped the swap before sending" in str(e)
                                              for e in workers.errors)

    monkeypatch.setattr(cross_host, "send", fake.send)
    engine.update(params[1])
    holds(trees[1])
    for receiver in workers.receivers:
        receiver.close()


# ----------------------------------------------------------------------------- the worker's half

WORKER = r"""
import json, sys
import torch
from jax_amem_core import wire
from jax_amem_core.native import core
from jax_amem_vllm import nccl
core()                                   # the compiled core, imported without the jax_amem package
host, port, session, rank = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
store = wire.TorchStore.connect(host, port)
note = json.loads(store.get(nccl.note_key(session, rank), timeout=30))
receiver = nccl.Receiver(store, session, rank, torch.device("cpu"))
record = receiver.transport(30)
link = nccl.WorkerLink(store, record, 0)
link.comm = 0                            # no NCCL on CPU: the handshake alone
out = {"record": record}
staging = torch.zeros(note["staging_bytes"], dtype=torch.uint8)
for group in range(record["groups"]):
    tensors = note["groups"][group]
    staged = {t["name"]: staging[t["offset"]:t["offset"] + 4 * int(torch.Size(t["shape"]).numel())].view(
        torch.float32).view(t["shape"]) for t in tensors}
    schedule = nccl.decode_schedule(store.get(nccl.schedule_key(session, rank, group), timeout=30))
    nccl.checked_rows(schedule, staged, group)
out["accepted"] = wire.answer_offers(link, {0: schedule.expected()})[0]["version"]
try:
    wire.answer_offers(link, {0: schedule.expected()})
except wire.LinkError as error:
    out["refused"] = str(error)
out["jax"] = sorted(m for m in sys.modules if m in ("jax", "jax_amem") or m.startswith(("jax.", "jax_amem.")))
print(json.dumps(out))
"""


def test_the_worker_half_answers_the_trainers_handshake_without_jax(server, monkeypatch):
    """A process that imports the worker's NCCL half (and loads the core) but never JAX: it reads
    its record and schedules from the trainer's store, validates every group's rows, accepts the
    trainer's offer (cross_host's own handshake, version 5) and refuses one of another plan; the
    trainer's side sees both answers. Its process holds no jax or jax_amem module."""
    params = llama()[1]
    engine, ranks, link, rank_notes = over_nccl(monkeypatch, server, "llama", "flax", params, "s3")
    server.set(worker_side.note_key("s3", 1), json.dumps(rank_notes[1]).encode())
    trainer = Link("vllm-s3", 0, "trainer", 0, 1, 2, 0, (link.source, ranks[0].owner(0), ranks[1].owner(0)), 0, 0,
                   server, link.bucket_bytes, 30.0, False)
    last = engine.plans[-1][1]
    packing = pairs.packing(last, last.owner_id(link.source), last.owner_id(ranks[1].owner(0)), link.bucket_bytes)
    handshake.offer(trainer, 2, trainer.next_sequence(2), handshake.header(5, last.key, packing))
    handshake.offer(trainer, 2, trainer.next_sequence(2), handshake.header(6, "0" * 64, packing))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-P", "-c", WORKER, "127.0.0.1", str(server.store.port), "s3", "1"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["jax"] == []
    assert out["record"]["rank"] == 1 and out["record"]["owner"] == [2, 0]
    assert out["accepted"] == 5
    assert "plan mismatch" in out["refused"] and "nothing was received" in out["refused"]
    handshake.await_ack(trainer, 2, 0)
    with pytest.raises(SwapError, match="refused the swap, nothing was sent: plan mismatch"):
        handshake.await_ack(trainer, 2, 1)


# ----------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
def test_gpu_trainer_sends_into_two_tp_ranks_over_nccl_bit_exact():
    """benchmarks/vllm_ipc.py with --transport nccl: two rank processes holding a Qwen3-shaped
    model's vLLM tensors at TP=2 (each its NCCL_HOSTID, so NCCL sees three hosts on one GPU),
    staged and received by the worker's own code (jax_amem_vllm.nccl), committed; the trainer
    runs the backend's update loop over the link. Every tensor of both ranks is checked bit for
    bit against slices cut by hand (the benchmark exits non-zero on a mismatch)."""
    from jax_amem.platform import require_gpu

    require_gpu("the vLLM backend over NCCL")
    done = subprocess.run([sys.executable, "-P", str(REPO / "benchmarks" / "vllm_ipc.py"), "--transport", "nccl",
                           "--layers", "2", "--repeats", "2", "--dtype", "float32"],
                          capture_output=True, text=True, timeout=540, cwd=REPO)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert result["transport"] == "nccl" and result["bit_exact_bytes"] > 0
