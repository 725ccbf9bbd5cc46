"""The NCCL transport (jax_amem.swapping.cross_host): bucket packing against numpy, the
handshake's error paths over a real TCPStore, and (GPU) a JAX trainer process sending a
small Llama into a PyTorch rollout process over NCCL, with a pause/resume between swaps."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from jax_amem import reshard
from jax_amem.reshard import Layout, Owner
from jax_amem.reshard.numpy_exec import empty_destination, execute, prepare_view
from jax_amem.reshard.plan_data import DST_OWNER, DST_TENSOR, SRC_OWNER
from jax_amem.swapping.cross_host import handshake as control
from jax_amem.swapping.cross_host import packing as P
from jax_amem.swapping import forget
from jax_amem.swapping.cross_host import pairs, receive_jax
from jax_amem.swapping.errors import SwapError
from jax_amem.swapping.cross_host.link import Link, connect
from jax_amem.swapping.store import StoreTimeout
from jax_amem.transport import recv_aliases

TRAINERS = [Owner(0, 0), Owner(0, 1)]
ROLLOUTS = [Owner(1, 0), Owner(1, 1)]


def layouts(dtype=np.float32, transposed=False):
    """Trainer: FSDP rows over two devices; rollout: tensor-parallel columns (a reshard in
    which every trainer owner sends to every rollout owner), plus odd sizes and a vector.
    `transposed`: the rollout's "w" is the trainer's transposed, in bfloat16."""
    import ml_dtypes

    src = {
        "w": Layout.tensor_parallel((128, 96), dtype, 0, 2, TRAINERS),
        "odd": Layout.tensor_parallel((13, 7), dtype, 0, 2, TRAINERS),
        "bias": Layout.replicated((40,), dtype, TRAINERS),
    }
    dst = {
        "w": (Layout.tensor_parallel((96, 128), ml_dtypes.bfloat16, 1, 2, ROLLOUTS) if transposed
              else Layout.tensor_parallel((128, 96), dtype, 1, 2, ROLLOUTS)),
        "odd": Layout.tensor_parallel((13, 7), dtype, 1, 2, ROLLOUTS),
        "bias": Layout.replicated((40,), dtype, ROLLOUTS),
    }
    return src, dst


def transposing_rules():
    """A destination that is the source transposed and cast: views with perm and dtype."""
    return [reshard.Rule.copy("w", "w", transpose=(1, 0), cast="bfloat16"),
            reshard.Rule.copy("odd", "odd"), reshard.Rule.copy("bias", "bias")]


def sources_of(src_layouts, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for name, layout in src_layouts.items():
        full = rng.standard_normal(layout.shape).astype(layout.dtype)
        for owner in layout.owners:
            out[(name, owner)] = full[layout.shard_slices(owner)]
    return out


def run_packed(plan, sources, bucket_bytes, max_buffers=P.MAX_BUFFERS_PER_SIDE):
    """Executes the plan the way the transport does, in numpy: per pair, gather each bucket
    from the prepared views (send rows), 'send' it, unpack it (receive rows). Returns the
    destinations and, per destination byte, how often it was written."""
    out = empty_destination(plan)
    written = {k: np.zeros(v.nbytes, np.int64) for k, v in out.items()}
    names = plan.dst_names
    t = plan.transfers
    pairs = sorted({(int(a), int(b)) for a, b in t[:, [SRC_OWNER, DST_OWNER]].tolist()})
    for s, d in pairs:
        packing = P.pack_pair(plan, s, d, bucket_bytes, max_buffers)
        src_owner, dst_owner = plan.owner_of(s), plan.owner_of(d)
        for bucket in packing.buckets:
            assert 0 < bucket.nbytes <= bucket_bytes
            assert len(bucket.views) <= max_buffers and len(bucket.dst_tensors) <= max_buffers
            wire = np.full(bucket_bytes, 0xEE, np.uint8)  # the staging slot
            for (v_slot, _, so, bo, n, _), (_, d_slot, bo2, do, n2, _) in zip(
                    bucket.send_rows.tolist(), bucket.recv_rows.tolist()):
                assert (bo, n) == (bo2, n2)
                name, perm, dtype = plan.views[bucket.views[v_slot]]
                view = prepare_view(sources[(name, src_owner)], perm, dtype).reshape(-1).view(np.uint8)
                wire[bo:bo + n] = view[so:so + n]
            sent = wire[:bucket.nbytes].copy()
            for _, d_slot, bo, do, n, _ in bucket.recv_rows.tolist():
                key = (names[bucket.dst_tensors[d_slot]], dst_owner)
                out[key].reshape(-1).view(np.uint8)[do:do + n] = sent[bo:bo + n]
                written[key][do:do + n] += 1
    return out, written


@pytest.mark.parametrize("bucket_bytes", [P.MIN_BUCKET_BYTES, 8192 + 16, 1 << 20])
@pytest.mark.parametrize("rules", [None, "transposing"])
def test_buckets_deliver_every_byte_once(bucket_bytes, rules):
    src, dst = layouts(transposed=bool(rules))
    plan = reshard.plan(src, dst, transposing_rules() if rules else None, check=True)
    sources = sources_of(src)
    got, written = run_packed(plan, sources, bucket_bytes)
    want = execute(plan, sources)
    for key in want:
        assert np.array_equal(got[key].view(np.uint8), want[key].view(np.uint8)), key
        assert (written[key] == 1).all(), f"{key}: bytes written {np.unique(written[key])} times"


def test_small_buckets_split_segments_and_respect_bounds():
    src, dst = layouts()
    plan = reshard.plan(src, dst)
    packing = P.pack_pair(plan, 0, 2, P.MIN_BUCKET_BYTES)
    assert len(packing.buckets) > 1  # 128x96 floats: 12 KiB per pair
    assert packing.wire_bytes <= len(packing.buckets) * P.MIN_BUCKET_BYTES
    assert packing.nbytes == int(plan.transfers[P.pair_transfers(plan, 0, 2), 6].sum())
    for b in packing.buckets:
        rows = b.send_rows
        assert ((rows[:, 3] + rows[:, 4]) <= b.nbytes).all()
        assert (rows[:, 3] % packing.alignment == 0).all()
        ends = np.sort(rows[:, 3])
        assert len(np.unique(ends)) == len(ends)  # no two pieces start at one bucket byte


def test_buffer_limit_closes_buckets_early():
    src, dst = layouts(transposed=True)
    plan = reshard.plan(src, dst, transposing_rules())
    sources = sources_of(src)
    got, written = run_packed(plan, sources, 1 << 20, max_buffers=1)
    want = execute(plan, sources)
    for key in want:
        assert np.array_equal(got[key].view(np.uint8), want[key].view(np.uint8)), key
    packing = P.pack_pair(plan, 0, 2, 1 << 20, max_buffers=1)
    assert len(packing.buckets) == len({(int(v), int(d)) for v, d in plan.transfers[
        P.pair_transfers(plan, 0, 2)][:, [3, 2]].tolist()})


def test_both_sides_pack_identically():
    """Two independently built plans (as the trainer and the rollout each build theirs)
    give the same buckets, rows and order, hence the same digest."""
    src, dst = layouts(transposed=True)
    a = reshard.plan(src, dst, transposing_rules(), cache=False)
    src2, dst2 = layouts(transposed=True)
    b = reshard.plan(src2, dst2, transposing_rules(), cache=False)
    assert a is not b and a.key == b.key
    for s, d in [(0, 2), (0, 3), (1, 2), (1, 3)]:
        pa, pb = P.pack_pair(a, s, d, 8192), P.pack_pair(b, s, d, 8192)
        assert pa.digest == pb.digest
        for x, y in zip(pa.buckets, pb.buckets):
            assert np.array_equal(x.send_rows, y.send_rows) and np.array_equal(x.recv_rows, y.recv_rows)
    assert P.pack_pair(a, 0, 2, 8192).digest != P.pack_pair(a, 0, 2, 16384).digest


def test_alignment_follows_offsets():
    src, dst = layouts(np.float32)
    plan = reshard.plan(src, dst)
    assert P.pack_pair(plan, 0, 2, 8192).alignment == 4  # 'odd' has 7-float (28-byte) rows
    src = {"w": Layout.tensor_parallel((64, 64), np.float32, 0, 2, TRAINERS)}
    dst = {"w": Layout.tensor_parallel((64, 64), np.float32, 1, 2, ROLLOUTS)}
    assert P.pack_pair(reshard.plan(src, dst), 0, 2, 8192).alignment == 16


def test_peers_and_missing_pair():
    src, dst = layouts()
    plan = reshard.plan(src, dst)
    assert P.peers_of(plan, 0, "sender") == [2, 3]
    assert P.peers_of(plan, 3, "receiver") == [0, 1]
    with pytest.raises(SwapError, match=r"sends nothing from owner 2 \(1, 0\) to owner 0"):
        P.pack_pair(plan, 2, 0, 8192)
    with pytest.raises(SwapError, match="not in the plan's 4 owners"):
        P.pack_pair(plan, 0, 9, 8192)


@pytest.mark.parametrize("size", [0, 100, P.MIN_BUCKET_BYTES - 16, P.MIN_BUCKET_BYTES + 1, 4096.0, True])
def test_bucket_size_too_small_or_unaligned(size):
    src, dst = layouts()
    plan = reshard.plan(src, dst)
    with pytest.raises(SwapError, match="bucket_bytes"):
        P.pack_pair(plan, 0, 2, size)


# -- the handshake, over a real TCPStore (no NCCL: the link carries no communicator) --------

@pytest.fixture
def tcp_store():
    torch_dist = pytest.importorskip("torch.distributed")
    from jax_amem.swapping.store import TorchStore

    server = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return TorchStore(server)


def fake_link(store, role, comm_rank, timeout=0.5):
    """A Link's bookkeeping without a communicator (comm 0): for the control messages only."""
    owners = (Owner(0, 0), Owner(1, 0))
    return Link("test", 0, role, 0, 1, 1, comm_rank, owners, 0, 0, store, 8192, timeout, False)


def test_handshake_accepts_matching_header(tcp_store):
    src, dst = layouts()
    plan = reshard.plan(src, dst)
    packing = P.pack_pair(plan, 0, 2, 8192)
    trainer, rollout = fake_link(tcp_store, "trainer", 0), fake_link(tcp_store, "rollout", 1)
    control.offer(trainer, 1, 0, control.header(7, plan.key, packing))
    control.answer(rollout, 0, 0, control.header(7, plan.key, packing))
    control.await_ack(trainer, 1, 0)
    control.mark_done(rollout, 0, 0, 7)
    assert tcp_store.get(rollout.key("0-1", 0, "done"), 1.0) == b"7"


@pytest.mark.parametrize("change, message", [
    ({"version": 8}, "version mismatch: the trainer sends version 8, the rollout expects version 7"),
    ({"plan_key": "0" * 64}, "plan mismatch"),
    ({"bucket_bytes": 4096}, "bucket size mismatch"),
    ({"digest": "x"}, "packing mismatch"),
])
def test_handshake_refuses_mismatch_on_both_sides(tcp_store, change, message):
    src, dst = layouts()
    plan = reshard.plan(src, dst)
    expected = control.header(7, plan.key, P.pack_pair(plan, 0, 2, 8192))
    trainer, rollout = fake_link(tcp_store, "trainer", 0), fake_link(tcp_store, "rollout", 1)
    control.offer(trainer, 1, 0, {**expected, **change})
    with pytest.raises(SwapError, match="nothing was received: " + message):
        control.answer(rollout, 0, 0, expected)
    with pytest.raises(SwapError, match="refused the swap, nothing was sent: " + message):
        control.await_ack(trainer, 1, 0)


def test_receiver_with_a_paused_communicator_refuses(tcp_store):
    """A paused rollout refuses through the ack: the trainer raises instead of sending into a
    receive that would never be posted."""
    src, dst = layouts()
    plan = reshard.plan(src, dst)
    header = control.header(1, plan.key, P.pack_pair(plan, 0, 2, 8192))
    trainer, rollout = fake_link(tcp_store, "trainer", 0), fake_link(tcp_store, "rollout", 1)
    control.offer(trainer, 1, 0, header)
    with pytest.raises(SwapError, match="communicator is paused"):
        control.answer(rollout, 0, 0, header, refuse="link 'test' rank 1: its NCCL communicator is paused")
    with pytest.raises(SwapError, match="refused the swap, nothing was sent: .*communicator is paused"):
        control.await_ack(trainer, 1, 0)


def test_link_without_interposer_id_is_ready(tcp_store):
    assert fake_link(tcp_store, "trainer", 0).not_ready() is None
    link = fake_link(tcp_store, "trainer", 0)
    link.interposer_id = 12345  # no such communicator in this process
    assert "its NCCL communicator is gone" in link.not_ready()


def test_store_timeouts_name_what_was_awaited(tcp_store):
    trainer, rollout = fake_link(tcp_store, "trainer", 0), fake_link(tcp_store, "rollout", 1)
    with pytest.raises(StoreTimeout, match=r"trainer rank 0's header of swap 3 on link 'test'.*nccl/test/0/0-1/3/header"):
        control.answer(rollout, 0, 3, {})
    with pytest.raises(StoreTimeout, match=r"rollout rank 1's answer to swap 0"):
        control.await_ack(trainer, 1, 0)


def test_connect_checks_arguments_before_touching_nccl(tcp_store):
    kw = dict(trainers=1, rollouts=1, owner=(0, 0), device=0)
    with pytest.raises(SwapError, match="role must be one of"):
        connect(tcp_store, "learner", 0, **kw)
    with pytest.raises(SwapError, match="rollout rank 1 is out of range: the link has 1 rollout"):
        connect(tcp_store, "rollout", 1, **kw)
    with pytest.raises(SwapError, match="trainers must be a positive int"):
        connect(tcp_store, "trainer", 0, trainers=0, rollouts=1, owner=(0, 0), device=0)
    with pytest.raises(SwapError, match="bucket_bytes=100 is too small"):
        connect(tcp_store, "trainer", 0, bucket_bytes=100, **kw)
    with pytest.raises(StoreTimeout, match="the NCCL unique id from trainer rank 0"):
        connect(tcp_store, "rollout", 0, timeout=0.3, **kw)


def test_link_names_owners_it_does_not_have(tcp_store):
    link = fake_link(tcp_store, "trainer", 0)
    assert link.comm_rank_of((1, 0), "x") == 1
    with pytest.raises(SwapError, match=r"owner \(5, 5\), which is no rank of link 'test'"):
        link.comm_rank_of((5, 5), "sender (0, 0)")


def test_send_and_receive_refuse_the_wrong_role_and_version(tcp_store):
    from jax_amem.swapping import cross_host as nt

    src, dst = layouts()
    plan = reshard.plan(src, dst)
    with pytest.raises(SwapError, match="send\\(\\) on a rollout link"):
        nt.send({}, plan, fake_link(tcp_store, "rollout", 1), 1)
    with pytest.raises(SwapError, match="receive\\(\\) on a trainer link"):
        nt.receive({}, plan, fake_link(tcp_store, "trainer", 0), 1)
    with pytest.raises(SwapError, match="version must be an int"):
        nt.send({}, plan, fake_link(tcp_store, "trainer", 0), "3")


def cpu_trainer(tcp_store):
    """(plan, trainer link, the CPU device) for a trainer whose only source shard is on the CPU,
    on any host: on a GPU host too the shard is off the link's cuda:0, so the sender must refuse
    it (with jax.devices()[0], a GPU there, the checks would pass and the send would go on)."""
    import jax

    cpu = jax.devices("cpu")[0]
    trainer = Owner(cpu.process_index, cpu.id)
    plan = reshard.plan({"w": Layout.single((64, 32), np.float32, trainer)},
                        {"w": Layout.single((64, 32), np.float32, (1, 0))})
    link = fake_link(tcp_store, "trainer", 0)
    link.owners = (trainer, Owner(1, 0))
    return plan, link, cpu


def test_sender_checks_sources_before_anything_moves(tcp_store):
    import jax

    from jax_amem.swapping import cross_host as nt

    plan, link, cpu = cpu_trainer(tcp_store)
    on_cpu = {"w": jax.device_put(np.ones((64, 32), np.float32), cpu)}
    with pytest.raises(SwapError, match=re.escape(f"'w': the shard of owner ({cpu.process_index}, {cpu.id}) is on {cpu}, "
                                                  "not on the link's cuda:0")):
        nt.send(on_cpu, plan, link, 1)
    with pytest.raises(SwapError, match="'w': the plan was made for other source layouts"):
        nt.send({"w": jax.device_put(np.ones((64, 16), np.float32), cpu)}, plan, link, 1)
    with pytest.raises(SwapError, match="'w': the plan was made for other source layouts"):
        nt.send({}, plan, link, 1)
    assert link.sequence == {}  # nothing was offered


def test_plan_without_the_link_owner(tcp_store):
    from jax_amem.swapping import cross_host as nt

    src, dst = layouts()
    plan = reshard.plan(src, dst)
    link = fake_link(tcp_store, "trainer", 0)
    link.owners = (Owner(7, 7), Owner(1, 0))
    with pytest.raises(SwapError, match=r"stands for owner \(7, 7\), which the plan does not know"):
        pairs.owner_id(plan, link)


def test_receiver_checks_destinations_before_anything_moves():
    torch = pytest.importorskip("torch")
    from jax_amem.swapping.cross_host.receive_torch import check_tensors

    src, dst = layouts()
    plan = reshard.plan(src, dst)
    me = plan.owner_id(ROLLOUTS[0])
    good = {n: torch.zeros(tuple(dst[n].shard_box(ROLLOUTS[0])[1])) for n in dst}
    with pytest.raises(SwapError, match=r"missing \['odd'\], extra \['other'\]"):
        check_tensors({**{k: v for k, v in good.items() if k != "odd"}, "other": good["odd"]}, plan, me, 0)
    with pytest.raises(SwapError, match=r"'w' has shape \(128, 96\), the plan's shard .* is \(128, 48\)"):
        check_tensors({**good, "w": torch.zeros(128, 96)}, plan, me, 0)
    with pytest.raises(SwapError, match="'bias' is torch.float64, the plan writes float32"):
        check_tensors({**good, "bias": torch.zeros(40, dtype=torch.float64)}, plan, me, 0)
    with pytest.raises(SwapError, match="'w' is not contiguous"):
        check_tensors({**good, "w": torch.zeros(48, 128).t()}, plan, me, 0)
    with pytest.raises(SwapError, match="'bias' is a ndarray, not a torch.Tensor"):
        check_tensors({**good, "bias": np.zeros(40, np.float32)}, plan, me, 0)
    with pytest.raises(SwapError, match="'w' is on cpu, the link receives on cuda:0"):
        check_tensors(good, plan, me, 0)


# -- GPU: two processes on one GPU (different NCCL_HOSTID), JAX trainer -> PyTorch rollout ----

@pytest.mark.gpu
def test_llama_over_nccl_bit_exact_with_pause_between_swaps():
    sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu_workers"))
    from run_pair import run_pair

    results, logs = run_pair("nccl_swap_worker.py", ["llama"], timeout=180)
    text = "\n\n".join(log[-4000:] for log in logs)
    rollout = [r for r in results if r.get("role") == "rollout" and r.get("phase") == "checked"]
    trainer = [r for r in results if r.get("role") == "trainer" and r.get("phase") == "sent"]
    assert len(rollout) == 3 and len(trainer) == 3, text
    for r in rollout:
        assert r["mismatched"] == [], r
        assert r["bytes"] > 0 and r["pointers_unchanged"], r
    assert [r["version"] for r in rollout] == [1, 2, 3]
    linked = [r for r in results if r.get("phase") == "linked"]
    assert len(linked) == 2 and all(r["pausable"] and r["interposer_id"] for r in linked), text
    paused = [r for r in results if r.get("phase") == "paused"]
    assert len(paused) == 2 and all(p["state"] == "paused" for p in paused), text
    assert [p for p in paused if p["role"] == "trainer"][0]["refused"].endswith("nothing was sent"), text
    print(json.dumps(results, indent=1))


def test_jax_amem_swap_over_a_link_sends_with_plan_and_version_only(tcp_store):
    """`jax_amem.swap(params, link, plan=, version=)` is the NCCL transport's send: what it
    cannot do is refused before anything is offered to the rollout."""
    import jax

    import jax_amem

    plan, link, cpu = cpu_trainer(tcp_store)
    params = {"w": jax.device_put(np.ones((64, 32), np.float32), cpu)}
    with pytest.raises(SwapError, match="needs plan= .* not rules=: nothing was sent"):
        jax_amem.swap(params, link, version=1)
    with pytest.raises(SwapError, match="needs version= .*: nothing was sent"):
        jax_amem.swap(params, link, plan=plan)
    with pytest.raises(SwapError, match="verify=True is not available over an NCCL link"):
        jax_amem.swap(params, link, plan=plan, version=1, verify=True)
    # The same checks as cross_host.send: here, the shard is not on the link's GPU.
    with pytest.raises(SwapError, match=re.escape(f"'w': the shard of owner ({cpu.process_index}, {cpu.id}) is on {cpu}, "
                                                  "not on the link's cuda:0")):
        jax_amem.swap(params, link, plan=plan, version=1)
    n = link.sequence.get(1, 0)  # the sequence number the first offer to rollout rank 1 takes
    first_offer = control.pair_key(link, 0, 1, n, "header")
    with pytest.raises(StoreTimeout):  # nothing was offered to the rollout
        tcp_store.get(first_offer, timeout=0.2)
    control.offer(link, 1, n, {"check": "the key above is where an offer lands"})
    assert json.loads(tcp_store.get(first_offer, timeout=1)) == {"check": "the key above is where an offer lands"}


# -- the JAX receiver's bookkeeping (cross_host/receive_jax.py): CPU devices stand for the GPUs ----

def jax_rollout_tree(devices):
    """A JAX rollout's weights over two local devices: "w" column-sharded (the trainer's rows
    transposed and cast to bfloat16 by the rules), "odd" column-sharded, "bias" replicated on
    both, "scale" on the first device only. NaN, so a byte never written shows."""
    import jax
    import ml_dtypes
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as PS

    mesh = Mesh(np.array(devices[:2]), ("tp",))
    cols = NamedSharding(mesh, PS(None, "tp"))
    full = lambda shape, dtype=np.float32: np.full(shape, np.nan, dtype)
    return {"w": jax.device_put(full((96, 128), ml_dtypes.bfloat16), cols),
            "odd": jax.device_put(full((13, 7)), NamedSharding(mesh, PS(None, None))),
            "bias": jax.device_put(full((40,)), NamedSharding(mesh, PS())),
            "scale": jax.device_put(full((24,)), devices[0])}


def jax_rollout_plan(tree):
    """The trainer's FSDP rows over TRAINERS into the JAX rollout's layouts (process 1)."""
    from jax_amem.swapping import cross_host as nt

    src = {"w": Layout.tensor_parallel((128, 96), np.float32, 0, 2, TRAINERS),
           "odd": Layout.tensor_parallel((13, 7), np.float32, 0, 2, TRAINERS),
           "bias": Layout.replicated((40,), np.float32, TRAINERS),
           "scale": Layout.tensor_parallel((24,), np.float32, 0, 2, TRAINERS)}
    rules = [reshard.Rule.copy("w", "w", transpose=(1, 0), cast="bfloat16"), reshard.Rule.copy("odd", "odd"),
             reshard.Rule.copy("bias", "bias"), reshard.Rule.copy("scale", "scale")]
    return reshard.plan(src, nt.destination_layouts(tree, 1), rules, check=True), src


@pytest.fixture
def any_device(monkeypatch):
    """Lets a CPU device stand for the link's GPU in the last check (the only one that needs a
    GPU); everything before it, and the bookkeeping after, is the real code."""
    from jax_amem.swapping.cross_host import receive_jax as R

    monkeypatch.setattr(R, "on_link_device", lambda device, link_device: True)
    return R


def wire_of(plan, packing, bucket, sources):
    """The bytes the trainer sends for `bucket` (its gather rows over the prepared views)."""
    wire = np.full(bucket.nbytes, 0xEE, np.uint8)
    src_owner = plan.owner_of(packing.src_owner)
    for v_slot, _, so, bo, n, _ in bucket.send_rows.tolist():
        name, perm, dtype = plan.views[bucket.views[v_slot]]
        view = prepare_view(sources[(name, src_owner)], perm, dtype).reshape(-1).view(np.uint8)
        wire[bo:bo + n] = view[so:so + n]
    return wire


def test_destination_layouts_name_the_plan_process():
    import jax

    from jax_amem.swapping import cross_host as nt

    tree = jax_rollout_tree(jax.devices())
    layouts = nt.destination_layouts(tree, 1)
    assert layouts["w"].owners == (Owner(1, 0), Owner(1, 1))
    assert layouts["scale"].owners == (Owner(1, 0),)
    for name, array in tree.items():  # the same boxes as the array's own layout, moved to process 1
        own = Layout.of(array)
        assert [tuple(o) for o in own.owners] == [(0, o.device) for o in layouts[name].owners]
        assert np.array_equal(own.starts, layouts[name].starts) and np.array_equal(own.sizes, layouts[name].sizes)
    assert nt.destination_layouts(tree, 0)["w"] == Layout.of(tree["w"])


@pytest.mark.parametrize("bucket_bytes", [P.MIN_BUCKET_BYTES, 1 << 20])
def test_jax_receive_rows_land_in_the_owners_shards(any_device, bucket_bytes):
    """Per rollout owner: the shards check_destinations donates are that owner's shards of
    the arrays, and the bucket calls' unpack tables, run in numpy on what the trainer sends,
    fill exactly the bytes the plan gives that owner, each once."""
    import jax

    R = any_device
    tree = jax_rollout_tree(jax.devices())
    plan, src = jax_rollout_plan(tree)
    sources = sources_of(src)
    want = execute(plan, sources)
    for owner in ROLLOUTS:
        me = plan.owner_id(owner)
        dests = R.check_destinations(tree, plan, me, owner, owner.device)
        assert [plan.dst_names[i] for i in dests.ids] == list(dests.names)
        expected_names = ["bias", "odd", "scale", "w"] if owner.device == 0 else ["bias", "odd", "w"]
        assert sorted(dests.names) == expected_names
        for name, index, shard in zip(dests.names, dests.indices, dests.shards):
            assert {d.id for d in shard.devices()} == {owner.device}, name
            assert shard.shape == plan.dst_layouts[name].shard_box(owner)[1], name
            assert (index is None) == (len(tree[name].sharding.device_set) == 1), name
        peers = P.peers_of(plan, me, "receiver")
        packings = {rank: P.pack_pair(plan, s, me, bucket_bytes) for rank, s in enumerate(peers)}
        calls = R.bucket_calls(plan, owner, packings, lambda peer: 100 + peer, dests.ids)
        buffers = [np.zeros(s.nbytes, np.uint8) for s in dests.shards]
        written = [np.zeros(s.nbytes, np.int64) for s in dests.shards]
        order = [(rank, k, b) for rank, p in sorted(packings.items()) for k, b in enumerate(p.buckets)]
        assert len(calls) == len(order)
        for call, (rank, k, bucket) in zip(calls, order):
            last = k == len(packings[rank].buckets) - 1
            assert (call.peer, call.pipe, call.slot, call.nbytes, call.drain) == (rank, 100 + rank, k % 2,
                                                                                  bucket.nbytes, last)
            wire = wire_of(plan, packings[rank], bucket, sources)
            for src_index, slot, so, do, n, _ in call.table.tolist():
                assert src_index == 0
                target = call.buffers[slot]
                buffers[target][do:do + n] = wire[so:so + n]
                written[target][do:do + n] += 1
        for name, got, count in zip(dests.names, buffers, written):
            assert np.array_equal(got, want[(name, owner)].reshape(-1).view(np.uint8)), (name, owner)
            assert (count == 1).all(), f"{name} on {tuple(owner)}: bytes written {np.unique(count)} times"


def test_jax_receive_program_donates_every_shard_and_chains_the_calls(any_device):
    """The lowered receive program: every donated shard aliased to its result, every bucket
    call's destinations aliased to its results, and each call taking the token and the
    destination buffers the previous calls returned (so XLA keeps the buckets in order)."""
    import re

    import jax

    R = any_device
    tree = jax_rollout_tree(jax.devices())
    plan, _ = jax_rollout_plan(tree)
    owner = ROLLOUTS[0]
    me = plan.owner_id(owner)
    dests = R.check_destinations(tree, plan, me, owner, 0)
    packings = {rank: P.pack_pair(plan, s, me, P.MIN_BUCKET_BYTES)
                for rank, s in enumerate(P.peers_of(plan, me, "receiver"))}
    calls = R.bucket_calls(plan, owner, packings, lambda peer: 7, dests.ids)
    assert len(calls) > 4 and any(len(c.buffers) > 1 for c in calls)
    text = R.jitted(calls, comm=1234).lower(dests.shards).as_text()
    main = re.search(r"func\.func public @main\((.*?)\) ->", text).group(1)
    assert re.findall(r"tf\.aliasing_output = (\d+)", main) == [str(k) for k in range(len(dests.shards))]
    lines = [line for line in text.splitlines() if "@jax_amem_nccl_recv_bucket" in line]
    assert len(lines) == len(calls)
    current = {k: f"%arg{k}" for k in range(len(dests.shards))}
    token = None
    for line, call in zip(lines, calls):
        result = re.match(r"\s*(%\w+):\d+ = ", line).group(1)
        operands = re.search(r"@jax_amem_nccl_recv_bucket\((.*?)\)", line).group(1).split(", ")
        if token is not None:
            assert operands[0] == token
        assert operands[2:] == [current[b] for b in call.buffers]
        aliased = re.findall(r"output_tuple_indices = \[(\d+)\], operand_index = (\d+)", line)
        assert sorted((int(o), int(i)) for o, i in aliased) == sorted(
            (o, i) for i, o in recv_aliases(len(call.buffers)).items())
        attrs = dict(re.findall(r"(\w+) = (-?\d+) : i64", line))
        assert {k: int(v) for k, v in attrs.items()} == {"bytes": call.nbytes, "comm": 1234, "drain": int(call.drain),
                                                         "peer": call.peer, "pipe": 7, "slot": call.slot}
        token = f"{result}#0"
        for i, b in enumerate(call.buffers):
            current[b] = f"{result}#{i + 1}"
    returned = re.search(r"return (.*?) :", text).group(1).split(", ")
    assert returned == [current[k] for k in range(len(dests.shards))]


@pytest.mark.parametrize("which", [0, 1])
def test_jax_receive_reassembles_the_tree_around_the_written_shards(any_device, which):
    """What receive returns as report.dst: each array rebuilt with the program's outputs as
    the owner's shards and the other owner's shards as they were, in the tree's structure,
    after the donation deleted the donated shards (owner (1, 0) holds the single-device
    'scale', so its donation deletes a whole array of the tree)."""
    import jax

    R = any_device
    tree = jax_rollout_tree(jax.devices())
    plan, _ = jax_rollout_plan(tree)
    owner = ROLLOUTS[which]
    dests = R.check_destinations(tree, plan, plan.owner_id(owner), owner, owner.device)
    outputs = [jax.device_put(np.full(s.shape, k + 1, s.dtype), next(iter(s.devices())))
               for k, s in enumerate(dests.shards)]  # stand-ins for the written shards
    scale_pointer = tree["scale"].unsafe_buffer_pointer()
    for shard in dests.shards:  # as the program's donation leaves them
        shard.delete()
    assert tree["scale"].is_deleted() == (owner.device == 0)
    new = dests.assemble(outputs)
    assert sorted(new) == sorted(tree)
    if owner.device == 1:  # (1, 1) holds no "scale": the same buffer, untouched
        assert new["scale"].unsafe_buffer_pointer() == scale_pointer
    for k, name in enumerate(dests.names):
        array = new[name]
        assert array.sharding == tree[name].sharding and array.shape == tree[name].shape
        for shard in array.addressable_shards:
            values = np.asarray(shard.data).astype(np.float32)
            if shard.device.id == owner.device:
                assert (values == k + 1).all(), name
            else:
                assert np.isnan(values).all(), name  # the other owner's shard, untouched


def test_jax_receive_hands_the_written_shards_back_when_the_end_fails(any_device):
    """After the program donated and wrote the shards, a failure (the handshake's `done`, the
    rebuild) raises PartialSwapError whose `dst` is the whole tree: nothing is lost."""
    import jax

    from jax_amem import PartialSwapError

    R = any_device
    tree = jax_rollout_tree(jax.devices())
    plan, _ = jax_rollout_plan(tree)
    owner = ROLLOUTS[0]
    dests = R.check_destinations(tree, plan, plan.owner_id(owner), owner, owner.device)
    outputs = [jax.device_put(np.full(s.shape, k + 1, s.dtype), next(iter(s.devices())))
               for k, s in enumerate(dests.shards)]
    for shard in dests.shards:
        shard.delete()
    failure = dests.recover(outputs, TimeoutError("the trainer never read `done`"))
    assert isinstance(failure, PartialSwapError) and "TimeoutError: the trainer never read" in str(failure)
    assert f"after {len(outputs)} of {len(outputs)} buffers were donated" in str(failure)
    assert failure.written == ["scale"]  # the only array (1, 0) holds whole
    assert sorted(failure.dst) == sorted(tree)
    assert (np.asarray(failure.dst["scale"]) == dests.names.index("scale") + 1).all()


def test_aliases_map_destinations_past_token_and_table():
    assert recv_aliases(0) == {}
    assert recv_aliases(3) == {2: 1, 3: 2, 4: 3}


def test_jax_destinations_are_refused_before_anything_moves(any_device):
    """Each wrong destination is named; the tree is left as it was (nothing deleted)."""
    import jax
    import ml_dtypes
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as PS

    R = any_device
    devices = jax.devices()
    tree = jax_rollout_tree(devices)
    plan, _ = jax_rollout_plan(tree)
    owner = ROLLOUTS[0]
    me = plan.owner_id(owner)
    mesh = Mesh(np.array(devices[:2]), ("tp",))

    def refused(changed, match):
        with pytest.raises(SwapError, match=match):
            R.check_destinations(changed, plan, me, owner, 0)
        assert not any(a.is_deleted() for a in tree.values())

    refused({**tree, "bias": jax.device_put(np.zeros(40, np.float64 if jax.config.jax_enable_x64 else np.int32),
                                            NamedSharding(mesh, PS()))},
            r"'bias' is (float64|int32)\[40\]; the plan writes float32\[40\]")
    refused({**tree, "scale": jax.device_put(np.zeros(25, np.float32), devices[0])},
            r"'scale' is float32\[25\]; the plan writes float32\[24\]")
    rows = NamedSharding(mesh, PS("tp", None))
    refused({**tree, "w": jax.device_put(np.zeros((96, 128), ml_dtypes.bfloat16), rows)},
            r"'w' is sharded over owners \[\(1, 0\), \(1, 1\)\] .*another layout .*destination_layouts")
    refused({**tree, "scale": jax.device_put(np.zeros(24, np.float32), devices[1])},
            r"'scale' is sharded over owners \[\(1, 1\)\]")
    refused({k: v for k, v in tree.items() if k != "odd"}, r"missing 1 destination.*'odd'")
    refused({**tree, "extra": tree["scale"]}, r"1 destination\(s\) that nothing writes.*'extra'")
    refused({**tree, "odd": np.zeros((13, 7), np.float32)}, r"destination 'odd' is a ndarray, not a jax.Array")
    gone = jax.device_put(np.zeros(24, np.float32), devices[0])
    gone.delete()
    refused({**tree, "scale": gone}, r"destination 'scale' was deleted")
    # One shard of a sharded array donated (as a receive for owner (1, 1) leaves the old array):
    # jax 0.10 still calls the array live and the receive refuses the shard; jax 0.12.1 calls the
    # whole array deleted.
    from jax_amem.swapping.sources import shard_data, shard_positions
    odd = jax.device_put(np.zeros((13, 7), np.float32), NamedSharding(mesh, PS(None, None)))
    shard_data(odd, shard_positions(odd)[Owner(0, 1)][0]).delete()
    refused({**tree, "odd": odd}, r"destination 'odd' was deleted \(donated" if odd.is_deleted()
            else r"destination 'odd': its shard on cpu:1 was deleted")


def test_jax_destinations_given_twice_are_refused(any_device):
    import jax

    R = any_device
    devices = jax.devices()
    src = {"a": Layout.single((8,), np.float32, (0, 0)), "b": Layout.single((8,), np.float32, (0, 0))}
    same = jax.device_put(np.zeros(8, np.float32), devices[0])
    tree = {"a": same, "b": same}
    from jax_amem.swapping import cross_host as nt
    plan = reshard.plan(src, nt.destination_layouts(tree, 1))
    with pytest.raises(SwapError, match="'a' and 'b' are the same array"):
        R.check_destinations(tree, plan, plan.owner_id((1, 0)), (1, 0), 0)


def test_jax_destination_off_the_link_gpu_is_refused():
    """Without a GPU the shards are on CPU devices: refused, naming the shard and the link's GPU."""
    import jax

    from jax_amem.swapping.cross_host import receive_jax as R

    tree = jax_rollout_tree(jax.devices())
    plan, _ = jax_rollout_plan(tree)
    with pytest.raises(SwapError, match=r"'bias': the shard of owner \(1, 0\) is on cpu:0, not on the link's cuda:0"):
        R.check_destinations(tree, plan, plan.owner_id(ROLLOUTS[0]), ROLLOUTS[0], 0)
    assert not R.on_link_device(jax.devices()[0], 0)


def jax_link_plan(tree):
    src = {"w": Layout.single((64, 32), np.float32, (0, 0))}
    from jax_amem.swapping import cross_host as nt
    return reshard.plan(src, nt.destination_layouts(tree, 1))


def test_jax_receive_refuses_a_version_mismatch_on_both_sides(tcp_store, any_device):
    """cross_host.receive with a pytree: the destinations pass, the handshake (the same as
    the PyTorch receiver's, over a real TCPStore) refuses the trainer's other version on both
    sides, before a program is built or a shard donated."""
    import jax

    from jax_amem.swapping import cross_host as nt

    forget()
    tree = {"w": jax.device_put(np.arange(64 * 32, dtype=np.float32).reshape(64, 32), jax.devices()[0])}
    plan = jax_link_plan(tree)
    trainer, rollout = fake_link(tcp_store, "trainer", 0), fake_link(tcp_store, "rollout", 1)
    pair = pairs.packing(plan, plan.owner_id((0, 0)), plan.owner_id((1, 0)), rollout.bucket_bytes)
    control.offer(trainer, 1, trainer.next_sequence(1), control.header(2, plan.key, pair))
    with pytest.raises(SwapError, match="nothing was received: version mismatch: the trainer sends version 2, "
                                        "the rollout expects version 3"):
        nt.receive(tree, plan, rollout, 3)
    with pytest.raises(SwapError, match="refused the swap, nothing was sent: version mismatch"):
        control.await_ack(trainer, 1, 0)
    assert rollout.sequence == {0: 1}  # both sides moved past swap 0
    assert not tree["w"].is_deleted() and len(receive_jax._programs) == 0
    assert np.array_equal(np.asarray(tree["w"]), np.arange(64 * 32, dtype=np.float32).reshape(64, 32))


def test_receive_picks_the_receiver_by_the_destinations_type(tcp_store):
    """A dict of torch tensors goes to the PyTorch receiver, anything else to the JAX one;
    each refuses what it cannot take in its own words."""
    torch = pytest.importorskip("torch")
    import jax

    from jax_amem.swapping import cross_host as nt

    tree = {"w": jax.device_put(np.zeros((64, 32), np.float32), jax.devices()[0])}
    plan = jax_link_plan(tree)
    rollout = fake_link(tcp_store, "rollout", 1)
    with pytest.raises(SwapError, match=r"'w' is on cpu, the link receives on cuda:0"):  # PyTorch's checks
        nt.receive({"w": torch.zeros(64, 32)}, plan, rollout, 1)
    with pytest.raises(SwapError, match=r"'w': the shard of owner \(1, 0\) is on cpu:0"):  # JAX's checks
        nt.receive(tree, plan, rollout, 1)
    with pytest.raises(SwapError, match=r"'w' is a Tensor, not a jax.Array"):  # mixed: JAX's, naming it
        nt.receive({"w": torch.zeros(64, 32), "x": tree["w"]}, plan, rollout, 1)
    assert rollout.sequence == {}  # nothing was answered


# -- GPU: JAX trainer -> JAX rollout (two JAX processes on one GPU) --------------------------

@pytest.mark.gpu
def test_llama_over_nccl_into_a_jax_rollout_in_place():
    sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu_workers"))
    from run_pair import run_pair

    # Two JAX GPU processes share the GPU: each preallocates this fraction of it.
    results, logs = run_pair("nccl_swap_worker.py", ["jax"], timeout=180,
                             extra_env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.2"})
    text = "\n\n".join(log[-4000:] for log in logs)
    rollout = [r for r in results if r.get("role") == "rollout" and r.get("phase") == "checked"]
    trainer = [r for r in results if r.get("role") == "trainer" and r.get("phase") == "sent"]
    assert len(rollout) == 2 and len(trainer) == 2, text
    assert [r["version"] for r in rollout] == [1, 2]
    for r in rollout:
        assert r["mismatched"] == [] and r["names"], r
        assert r["bytes"] > 0 and r["buckets"] > 2 and r["pointers_unchanged"] and r["old_deleted"], r
    assert [r["bytes"] for r in rollout] == [r["bytes"] for r in trainer], text
    paused = [r for r in results if r.get("phase") == "paused"]
    assert len(paused) == 2 and all(p["state"] == "paused" for p in paused), text
    assert [p for p in paused if p["role"] == "trainer"][0]["refused"].endswith("nothing was sent"), text
    assert len([r for r in results if r.get("phase") == "done"]) == 2, text
    print(json.dumps(results, indent=1))


def test_jax_destinations_sharing_a_buffer_are_refused_before_anything_moves(any_device):
    """Two distinct jax.Arrays over the same buffers (one rebuilt from the other's shards) passed the receiver's check, which compared objects only:
    the program then donated one buffer twice, after the offers were answered."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as PS

    R = any_device
    devices = jax.devices()
    mesh = Mesh(np.array(devices[:2]), ("tp",))
    sharded = jax.device_put(np.arange(32, dtype=np.float32).reshape(8, 4), NamedSharding(mesh, PS("tp")))
    again = jax.make_array_from_single_device_arrays(
        sharded.shape, sharded.sharding, [jax.device_put(s.data, s.device) for s in sharded.addressable_shards])
    from jax_amem.swapping import cross_host as nt
    for tree in ({"a": sharded, "b": again},):
        src = {n: Layout.single((8, 4), np.float32, (0, 0)) for n in tree}
        plan = reshard.plan(src, nt.destination_layouts(tree, 1))
        # (on a GPU, device_put of a shard already there may give that very shard: the same array)
        with pytest.raises(SwapError, match=r"destinations 'a' and 'b' (share a buffer on|are the same array)"):
            R.check_destinations(tree, plan, plan.owner_id((1, 0)), (1, 0), 0)
        assert not any(a.is_deleted() for a in tree.values())
        assert np.array_equal(np.asarray(tree["a"]), np.arange(32).reshape(8, 4))
