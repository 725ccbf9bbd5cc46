"""GPU test worker: a JAX trainer (process 0) sends a small Llama over NCCL into a rollout
(process 1), resharded by rules.hf_llama; the rollout checks every byte against numpy (the
plan run by reshard.execute_numpy).

mode `llama`: the rollout is a PyTorch transformers model; three versions, and between the
second and third both sides pause and resume the link's communicator.
mode `jax`: the rollout is a JAX process whose weights are a pytree of jax.Arrays on its GPU
(the Hugging Face names and shapes), received by donation; two versions with a pause and
resume between them; the arrays' buffers must stay where they were.

usage: python -P nccl_swap_worker.py RANK PORT llama|jax
"""

import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -P` does not add the script's folder
import nccl_swap_common as common  # noqa: E402

BUCKET_BYTES = 64 << 10  # the model is ~0.3 MiB: several buckets, both slots of each pipe used
# Per mode: (version, seed of the trainer's parameters) in order, and the version before which
# both sides pause and resume the link.
SCHEDULES = {"llama": ([(1, 1), (2, 2), (3, 3)], 3), "jax": ([(1, 1), (2, 2)], 2)}
JAX_LAYOUTS_KEY = "jax_amem/swap/test/jax_dst_layouts"


def plan_and_sources(seed, dst_layouts):
    """The global plan from layouts (identical on both sides) and the numpy sources."""
    import numpy as np

    import test_swap_llama as llama
    from jax_amem import reshard
    from jax_amem.reshard import Layout

    tree = llama.flax_params(seed)
    named = reshard.tree_names(tree)
    src = {name: Layout.single(a.shape, a.dtype, common.TRAINER_OWNER) for name, a in named.items()}
    rule_list = reshard.rules.hf_llama(llama.L)
    scale = os.environ.get("JAX_AMEM_TEST_QUERY_SCALE")
    if scale:  # the query projections scaled on the way (the sender's pack applies it)
        rule_list = [dataclasses.replace(r, parts=tuple(dataclasses.replace(p, scale=float(scale)) for p in r.parts))
                     if "q_proj" in r.dst else r for r in rule_list]
    plan = reshard.plan(src, dst_layouts, rule_list)
    return plan, tree, {(name, reshard.Owner(*common.TRAINER_OWNER)): np.asarray(a) for name, a in named.items()}


def dst_layouts_of(model):
    from jax_amem.reshard import Layout
    from jax_amem.swapping import torch_bridge

    return {n: Layout.single(tuple(t.shape), torch_bridge.numpy_dtype(t), common.ROLLOUT_OWNER)
            for n, t in model.named_parameters()}


def trainer(port, mode="llama"):
    import jax

    import jax_amem
    from jax_amem.swapping import cross_host as nt

    if mode == "jax":
        dst = common.layouts_from_json(common.store("trainer", port).get(JAX_LAYOUTS_KEY, timeout=120))
    else:
        dst = _dst_layouts_from_store(port)
    link = common.link("trainer", port, bucket_bytes=BUCKET_BYTES)
    common.emit(role="trainer", phase="linked", pausable=link.pausable, interposer_id=link.interposer_id)
    versions, pause_before = SCHEDULES[mode]
    for version, seed in versions:
        plan, tree, _ = plan_and_sources(seed, dst)
        params = jax.device_put(tree, jax.devices("gpu")[0])
        if version == pause_before:
            report = jax_amem.nccl.pause(ids=[link.interposer_id])
            try:  # while paused a send is refused before any byte or message moves
                nt.send(params, plan, link, version)
                refused = ""
            except jax_amem.SwapError as error:
                refused = str(error)
            common.emit(role="trainer", phase="paused", state=report.communicators[0].state,
                        freed=report.communicators[0].bytes_freed, refused=refused)
            common.barrier(link, "paused")
            jax_amem.nccl.resume()
        report = nt.send(params, plan, link, version)
        common.emit(role="trainer", phase="sent", version=version, bytes=report.bytes,
                    buckets=report.buckets, staging=report.staging_bytes, seconds=report.seconds)
    common.barrier(link, "end")
    link.close()


def _dst_layouts_from_store(port):
    """The rollout publishes its parameters' shapes and dtypes (the trainer has no model)."""
    import json

    import numpy as np

    from jax_amem.reshard import Layout

    rows = json.loads(common.store("trainer", port).get("jax_amem/swap/test/dst_layouts", timeout=120))
    return {n: Layout.single(tuple(shape), np.dtype(dtype), common.ROLLOUT_OWNER) for n, shape, dtype in rows}


def receive_checked(tensors, plan, link, version, sources, owner):
    """NaN-fills `tensors`, receives `version` into them; returns (the report, the names whose
    bytes differ from numpy's execution of the plan)."""
    import numpy as np
    import torch

    from jax_amem import reshard
    from jax_amem.swapping import cross_host as nt

    with torch.no_grad():
        for t in tensors.values():
            t.fill_(float("nan"))
    report = nt.receive(tensors, plan, link, version)
    want = reshard.execute_numpy(plan, sources)
    mismatched = [n for n, t in tensors.items()
                  if not np.array_equal(t.detach().cpu().numpy().view(np.uint8), want[(n, owner)].view(np.uint8))]
    return report, mismatched


def rollout(port):
    import json

    import numpy as np
    import torch

    from jax_amem import reshard

    import test_swap_llama as llama

    torch.cuda.set_device(0)
    model = llama.nan_model("cuda")
    tensors = dict(model.named_parameters())
    pointers = {n: t.data_ptr() for n, t in tensors.items()}
    dst = dst_layouts_of(model)
    store = common.store("rollout", port)
    store.set("jax_amem/swap/test/dst_layouts",
              json.dumps([[n, list(l.shape), l.dtype.name] for n, l in dst.items()]).encode())
    link = common.link("rollout", port, bucket_bytes=BUCKET_BYTES)
    common.emit(role="rollout", phase="linked", pausable=link.pausable, interposer_id=link.interposer_id)
    owner = reshard.Owner(*common.ROLLOUT_OWNER)
    versions, pause_before = SCHEDULES["llama"]
    for version, seed in versions:
        plan, _, sources = plan_and_sources(seed, dst)
        if version == pause_before:
            pause_and_resume_rollout(link)
        report, mismatched = receive_checked(tensors, plan, link, version, sources, owner)
        common.emit(role="rollout", phase="checked", version=version, bytes=report.bytes,
                    buckets=report.buckets, staging=report.staging_bytes, mismatched=mismatched,
                    pointers_unchanged=all(t.data_ptr() == pointers[n] for n, t in tensors.items()),
                    seconds=report.seconds, logits_finite=bool(np.isfinite(llama.torch_logits(model, llama.TOKENS)).all()))
    common.barrier(link, "end")
    link.close()


def pause_and_resume_rollout(link):
    """The rollout's half of the pause between two swaps (a collective with the trainer's)."""
    import jax_amem

    report = jax_amem.nccl.pause(ids=[link.interposer_id])
    common.emit(role="rollout", phase="paused", state=report.communicators[0].state,
                freed=report.communicators[0].bytes_freed)
    common.barrier(link, "paused")
    jax_amem.nccl.resume()


def jax_rollout(port):
    """Receives into a pytree of single-device jax.Arrays (NaN at first), in place."""
    import os

    import jax
    import numpy as np

    from jax_amem import reshard
    from jax_amem.swapping import cross_host as nt

    import test_swap_llama as llama

    device = int(os.environ.get("WORKER_LOCAL_DEVICE", "0"))
    gpu = [d for d in jax.devices("gpu") if d.local_hardware_id == device][0]
    hf = llama.numpy_hf(llama.flax_params(0))  # names, shapes and dtypes only
    tree = {n: jax.device_put(np.full(a.shape, np.nan, a.dtype), gpu) for n, a in hf.items()}
    dst = nt.destination_layouts(tree, common.ROLLOUT_OWNER[0])
    common.store("rollout", port).set(JAX_LAYOUTS_KEY, common.layouts_to_json(dst))
    link = common.link("rollout", port, bucket_bytes=BUCKET_BYTES)
    common.emit(role="rollout", phase="linked", pausable=link.pausable, interposer_id=link.interposer_id)
    owner = reshard.Owner(*common.ROLLOUT_OWNER)
    pointers = {n: a.unsafe_buffer_pointer() for n, a in tree.items()}
    versions, pause_before = SCHEDULES["jax"]
    for version, seed in versions:
        plan, _, sources = plan_and_sources(seed, dst)
        if version == pause_before:
            pause_and_resume_rollout(link)
        old = tree
        report = nt.receive(tree, plan, link, version)
        tree = report.dst
        want = reshard.execute_numpy(plan, sources)
        mismatched = [n for n, a in tree.items()
                      if not np.array_equal(np.asarray(a).view(np.uint8), want[(n, owner)].view(np.uint8))]
        common.emit(role="rollout", phase="checked", version=version, bytes=report.bytes,
                    buckets=report.buckets, staging=report.staging_bytes, mismatched=mismatched,
                    names=sorted(tree) == sorted(hf),
                    pointers_unchanged=all(a.unsafe_buffer_pointer() == pointers[n] for n, a in tree.items()),
                    old_deleted=all(a.is_deleted() for a in old.values()), seconds=report.seconds)
    common.barrier(link, "end")
    link.close()


def main():
    rank, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if mode not in SCHEDULES:
        raise SystemExit(__doc__)
    role = common.start(rank, jax_rollout=(mode == "jax"))
    if role == "trainer":
        trainer(port, mode)
    else:
        (jax_rollout if mode == "jax" else rollout)(port)
    common.emit(role=role, phase="done")


if __name__ == "__main__":
    main()
