"""Multi-GPU NCCL swap worker: the trainer (process 0, JAX) and the rollout (process 1, PyTorch)
each on its own GPU of one host, so NCCL links them over NVLink / PCIe, not its socket transport.

usage: python -P swap_multigpu_nccl.py RANK PORT visible SPEC
       python -P swap_multigpu_nccl.py RANK PORT devices TRAINER_GPU ROLLOUT_GPU

visible SPEC: each process gets its own CUDA_VISIBLE_DEVICES ("0|1": one GPU each; "0,1|1,0":
both see both GPUs, in opposite orders), then runs nccl_swap_worker.py unchanged (three
versions, a pause and resume of the link between the second and third), on its cuda:0.
devices: both processes see every GPU; the trainer's parameters and link are on cuda:TRAINER_GPU,
the rollout's model and link on cuda:ROLLOUT_GPU (so a non-zero ordinal on either side); two
versions, every byte checked against numpy.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -P` does not add the script's folder

VERSIONS = [(1, 11), (2, 12)]  # (version, seed of the trainer's parameters)


def parse(argv: list[str]) -> dict:
    """This process's settings from its command line (rank, port, mode, mode's arguments)."""
    if len(argv) < 4 or argv[2] not in ("visible", "devices"):
        raise SystemExit(__doc__)
    rank, port, mode = int(argv[0]), argv[1], argv[2]
    if rank not in (0, 1):
        raise SystemExit(f"rank must be 0 (trainer) or 1 (rollout), got {rank}")
    if mode == "visible":
        sides = argv[3].split("|")
        if len(sides) != 2 or not all(sides):
            raise SystemExit(f"visible SPEC must be 'TRAINER_GPUS|ROLLOUT_GPUS', got {argv[3]!r}")
        return {"rank": rank, "port": port, "mode": mode, "visible": sides[rank]}
    if len(argv) != 5:
        raise SystemExit(__doc__)
    trainer_gpu, rollout_gpu = int(argv[3]), int(argv[4])
    return {"rank": rank, "port": port, "mode": mode, "trainer_gpu": trainer_gpu, "rollout_gpu": rollout_gpu,
            "gpu": trainer_gpu if rank == 0 else rollout_gpu}


def run_unchanged(settings: dict) -> None:
    """nccl_swap_worker.py as on one GPU, this process seeing only the GPUs of its SPEC side."""
    os.environ["CUDA_VISIBLE_DEVICES"] = settings["visible"]  # before anything loads CUDA
    os.environ["WORKER_LOCAL_DEVICE"] = "0"
    import nccl_swap_worker

    sys.argv = [sys.argv[0], str(settings["rank"]), settings["port"], "llama"]
    nccl_swap_worker.main()


def trainer(settings: dict) -> None:
    import jax

    import nccl_swap_common as common
    import nccl_swap_worker as worker
    from jax_amem.swapping import cross_host as nt

    gpu = [d for d in jax.devices("gpu") if d.local_hardware_id == settings["gpu"]][0]
    assert (gpu.process_index, gpu.id) == common.TRAINER_OWNER, (gpu, common.TRAINER_OWNER)
    dst = worker._dst_layouts_from_store(settings["port"])
    link = common.link("trainer", settings["port"], bucket_bytes=worker.BUCKET_BYTES)
    common.emit(role="trainer", phase="linked", device=link.device, interposer_id=link.interposer_id)
    for version, seed in VERSIONS:
        plan, tree, _ = worker.plan_and_sources(seed, dst)
        report = nt.send(jax.device_put(tree, gpu), plan, link, version)
        common.emit(role="trainer", phase="sent", version=version, bytes=report.bytes, buckets=report.buckets)
    common.barrier(link, "end")
    link.close()


def rollout(settings: dict) -> None:
    import json

    import torch

    import nccl_swap_common as common
    import nccl_swap_worker as worker
    import test_swap_llama as llama
    from jax_amem import reshard

    device = torch.device("cuda", settings["gpu"])
    torch.cuda.set_device(device)
    model = llama.nan_model(device)
    tensors = dict(model.named_parameters())
    pointers = {n: t.data_ptr() for n, t in tensors.items()}
    dst = worker.dst_layouts_of(model)
    common.store("rollout", settings["port"]).set(
        "jax_amem/swap/test/dst_layouts", json.dumps([[n, list(l.shape), l.dtype.name] for n, l in dst.items()]).encode())
    link = common.link("rollout", settings["port"], bucket_bytes=worker.BUCKET_BYTES)
    common.emit(role="rollout", phase="linked", device=link.device, interposer_id=link.interposer_id)
    owner = reshard.Owner(*common.ROLLOUT_OWNER)
    for version, seed in VERSIONS:
        plan, _, sources = worker.plan_and_sources(seed, dst)
        report, mismatched = worker.receive_checked(tensors, plan, link, version, sources, owner)
        common.emit(role="rollout", phase="checked", version=version, bytes=report.bytes, mismatched=mismatched,
                    devices=sorted({str(t.device) for t in tensors.values()}),
                    pointers_unchanged=all(t.data_ptr() == pointers[n] for n, t in tensors.items()))
    common.barrier(link, "end")
    link.close()


def main(argv: list[str]) -> None:
    settings = parse(argv)
    if settings["mode"] == "visible":
        run_unchanged(settings)
        return
    os.environ["WORKER_LOCAL_DEVICE"] = str(settings["gpu"])  # the link's CUDA ordinal (common.link)
    import nccl_swap_common as common

    # The plan names the trainer's shard by its JAX owner (process 0, device id); with every GPU
    # visible a single-process JAX numbers its GPUs by ordinal, so both sides can name it.
    common.TRAINER_OWNER = (0, settings["trainer_gpu"])
    role = common.start(settings["rank"])
    (trainer if role == "trainer" else rollout)(settings)
    common.emit(role=role, phase="done")


if __name__ == "__main__":
    main(sys.argv[1:])
