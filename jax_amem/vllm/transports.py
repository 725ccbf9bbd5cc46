"""Where the trainer writes each rank's staging buffer, chosen by where the worker is:

* `InProcess`: the worker is in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, one rank):
  its staging tensor itself.
* `SharedMemory`: a CPU worker in another process of this host: the worker's staging file in
  /dev/shm, mapped here (a PyTorch tensor over the shared pages), written by address.
* `CudaIpc`: a GPU worker in another process of this host: the worker's staging allocation,
  mapped with `jax_amem.swapping.open_remote` (CUDA IPC), written by address.
* `Nccl`: a GPU worker on another host (or any GPU worker, forced with transport="nccl"):
  the trainer sends each group's rows over the NCCL link of jax_amem.swapping.cross_host and
  the worker receives them into its staging buffer (jax_amem_vllm/nccl.py); nccl.py here.

Each gives, per layer group, the destination the swap writes (the group's tensors, as the rank
loads them, less a padded vocabulary's padding rows) and the owner its layouts name.
"""

from __future__ import annotations

import os
import socket

from ..swapping.same_host import ipc
from ..swapping.torch_bridge import owner_of
from .errors import VllmBackendError


def _visible_bytes(t: dict) -> int:
    import numpy as np

    return int(np.prod(t["shape"], dtype=np.int64)) * np.dtype(t["dtype"]).itemsize


def views(buffer, group: list[dict]) -> dict:
    """A group's tensors in a uint8 staging tensor, as the rank's note places them."""
    import torch

    out = {}
    for t in group:
        dtype = getattr(torch, t["dtype"])
        out[t["name"]] = buffer[t["offset"]:t["offset"] + _visible_bytes(t)].view(dtype).view(t["shape"])
    return out


class _TorchStaging:
    """A staging buffer this process holds as PyTorch tensors."""

    worker = None   # the worker engine itself, when it is in this process

    def owner(self, group: int):
        return owner_of(next(iter(self.destination(group).values())))


class InProcess(_TorchStaging):
    kind = "in_process"

    def __init__(self, worker, note: dict):
        self.worker, self.note = worker, note

    def destination(self, group: int):
        return self.worker.staged(group)

    def close(self) -> None:
        pass


class SharedMemory(_TorchStaging):
    kind = "shared_memory"

    def __init__(self, note: dict):
        import torch

        if "error" in note["staging"]:
            raise VllmBackendError(f"rank {note['tp_rank']}'s worker could not share its staging buffer: "
                                   f"{note['staging']['error']}")
        path = note["staging"]["path"]
        try:
            self.buffer = torch.from_file(path, shared=True, size=note["staging_bytes"], dtype=torch.uint8)
        except (RuntimeError, OSError) as error:
            raise VllmBackendError(f"cannot map rank {note['tp_rank']}'s staging file {path} ({error}): the trainer "
                                   "and the engine's workers must share this host's /dev/shm") from error
        self.note = note
        self.groups = [views(self.buffer, group) for group in note["groups"]]

    def destination(self, group: int):
        return self.groups[group]

    def close(self) -> None:
        self.groups, self.buffer = [], None


class CudaIpc:
    kind = "cuda_ipc"
    worker = None

    def __init__(self, note: dict):
        place = note["staging"]
        if "error" in place:
            raise VllmBackendError(f"rank {note['tp_rank']}'s worker could not export its staging buffer through "
                                   f"CUDA IPC ({place['error']}): install jax-amem in the engine's environment and "
                                   "start vLLM without PyTorch's expandable segments")
        self.note, self.remotes = note, []
        try:
            for group in note["groups"]:
                tensors = {t["name"]: {"handle": place["handle"], "offset": place["offset"] + t["offset"],
                                       "allocation_bytes": place["allocation_bytes"], "nbytes": _visible_bytes(t),
                                       "shape": t["shape"], "dtype": t["dtype"], "device": place["device"],
                                       "pci_bus_id": place["pci_bus_id"]} for t in group}
                self.remotes.append(ipc.open_remote({"format": ipc.FORMAT, "host": note["host"], "pid": note["pid"],
                                                     "tensors": tensors}))
        except Exception:
            self.close()
            raise

    def destination(self, group: int):
        return self.remotes[group]

    def owner(self, group: int):
        return next(iter(self.remotes[group].owners.values()))

    def close(self) -> None:
        for remote in self.remotes:
            remote.close()
        self.remotes = []


class Nccl:
    """A rank the trainer sends to over NCCL: its plans' destination owner is its place on the
    link (`owner`); the link itself is the engine's (nccl.py), made at the first update."""

    kind = "nccl"
    worker = None

    def __init__(self, note: dict, owner):
        if not str(note.get("device", "")).startswith("cuda"):
            raise VllmBackendError(f"rank {note['tp_rank']}'s worker runs on {note.get('device')!r} (host "
                                   f"{note['host']!r}): the NCCL transport receives into a GPU, so it needs an "
                                   "engine on CUDA; a CPU engine must share this host (and its /dev/shm)")
        self.note, self._owner = note, owner

    def owner(self, group: int):
        return self._owner

    def destination(self, group: int):
        raise VllmBackendError("a rank written over NCCL has no destination here: the engine sends to it")

    def close(self) -> None:
        pass


TRANSPORTS = ("auto", "nccl")


def checked_transport(transport) -> str:
    """connect's `transport=`: "auto" (chosen by placement) or "nccl" (forced for every rank)."""
    if not isinstance(transport, str) or transport not in TRANSPORTS:
        raise VllmBackendError(f"transport={transport!r:.60}: give 'auto' (in process, shared memory or CUDA "
                               "IPC on this host, NCCL for a worker on another host) or 'nccl' (NCCL for every "
                               "rank, also on this host); nothing was started")
    return transport


def placement(note: dict, transport: str) -> str:
    """How the trainer reaches a rank in another process: "nccl" when forced or when the worker
    runs on another host, else the kind of staging the worker made on this host."""
    if transport == "nccl" or note["host"] != socket.gethostname():
        return "nccl"
    return note["staging"]["kind"]


def open_rank(note: dict):
    """The transport to one rank in another process, by where its staging buffer is."""
    if note["host"] != socket.gethostname():
        raise VllmBackendError(f"rank {note['tp_rank']}'s worker runs on host {note['host']!r}, this trainer on "
                               f"{socket.gethostname()!r}: shared memory and CUDA IPC reach workers on the trainer's "
                               "host only; connect reaches one elsewhere over NCCL (docs/vllm.md)")
    kind = note["staging"]["kind"]
    return SharedMemory(note) if kind == "shared_memory" else CudaIpc(note)


def alive(note: dict) -> bool:
    """Whether the rank's worker process still runs (same host: its pid; a killed child of this
    process stays a zombie until reaped, which counts as dead). A worker on another host cannot
    be watched from here: it counts as alive, and the timeout bounds a wait on it."""
    if note.get("host", socket.gethostname()) != socket.gethostname():
        return True
    try:
        os.kill(note["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{note['pid']}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
