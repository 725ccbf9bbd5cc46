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

Each gives, per step of an update (a layer group, or the groups of one batch, which lie side by
side in staging), the destination the swap writes (the groups' tensors, as the rank loads them,
less a padded vocabulary's padding rows) and the owner its layouts name. A step's destination is
made once and kept: its tensors are the same objects on every update, so the swap repeats.
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


def _closed() -> VllmBackendError:
    return VllmBackendError("this engine handle was closed (engine.close()): connect again to update")


class _TorchStaging:
    """A staging buffer this process holds as PyTorch tensors: a step's destination is the
    views of its groups' tensors, made at the step's first use and kept."""

    worker = None   # the worker engine itself, when it is in this process

    def __init__(self, note: dict, buffer):
        self.note, self.buffer, self._steps, self.closed = note, buffer, {}, False

    def destination(self, groups: tuple[int, ...]) -> dict:
        if self.closed:
            raise _closed()
        self._follow_worker(groups)
        if groups not in self._steps:
            self._steps[groups] = {name: t for g in groups for name, t in self._group_views(g).items()}
        return self._steps[groups]

    def _follow_worker(self, groups: tuple[int, ...]) -> None:
        """Before a step's views are given: nothing here (the buffer is this handle's own)."""

    def _group_views(self, group: int) -> dict:
        return views(self.buffer, self.note["groups"][group])

    def owner(self, groups: tuple[int, ...]):
        return owner_of(next(iter(self.destination(groups).values())))

    def release(self, groups: tuple[int, ...]) -> None:
        """A step connect planned and dropped (a batch whose groups go one by one)."""
        self._steps.pop(groups, None)

    def close(self) -> None:
        self._steps, self.buffer, self.closed = {}, None, True


class InProcess(_TorchStaging):
    """The worker's own views, of the buffer it stages in now: a connect that failed after the
    worker staged anew leaves this engine writing where the worker commits from."""

    kind = "in_process"

    def __init__(self, worker, note: dict):
        self.worker = worker
        if worker.write_in_place():   # a GPU worker's as-loaded parameters: written by address, no staging copy
            # It staged the rest anew, in fewer batches (jax_amem_vllm/layout.py, `repacked`).
            now = worker.description()
            note = {**note, "groups": now["groups"], "staging_bytes": now["staging_bytes"], "batches": now["batches"]}
        super().__init__(note, worker.staging)
        self.views_made = worker.views_made

    def _follow_worker(self, groups: tuple[int, ...]) -> None:
        if self.worker.staging is None:
            raise VllmBackendError("the engine's worker has no staging buffer (its weight-transfer engine was shut "
                                   "down): connect again")
        if self.worker.staging is not self.buffer or self.worker.views_made != self.views_made:
            # staged anew, or parameters given new storage (vLLM's reload): the views follow
            self.buffer, self._steps, self.views_made = self.worker.staging, {}, self.worker.views_made
        if len(groups) > 1 and not any(set(groups) <= set(batch) for batch in self.worker.layout.batches):
            raise VllmBackendError(f"the engine's worker was set up again by another connect, whose staging holds "
                                   f"layer groups {groups[0]}-{groups[-1]} apart: this handle's batches no longer fit; "
                                   "update through the newest connect's handle, or connect again")

    def _group_views(self, group: int) -> dict:
        return self.worker.staged(group)


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
        super().__init__(note, self.buffer)


class CudaIpc:
    kind = "cuda_ipc"
    worker = None

    def __init__(self, note: dict):
        place = note["staging"]
        if "error" in place:
            raise VllmBackendError(f"rank {note['tp_rank']}'s worker could not export its staging buffer through "
                                   f"CUDA IPC ({place['error']}): install jax-amem in the engine's environment and "
                                   "start vLLM without PyTorch's expandable segments")
        self.note, self.remotes, self.closed = note, {}, False

    def destination(self, groups: tuple[int, ...]):
        """The step's tensors mapped from the worker's staging (opened at the step's first use:
        connect opens every step's)."""
        if self.closed:
            raise _closed()
        if groups not in self.remotes:
            place = self.note["staging"]
            tensors = {t["name"]: {"handle": place["handle"], "offset": place["offset"] + t["offset"],
                                   "allocation_bytes": place["allocation_bytes"], "nbytes": _visible_bytes(t),
                                   "shape": t["shape"], "dtype": t["dtype"], "device": place["device"],
                                   "pci_bus_id": place["pci_bus_id"]} for g in groups for t in self.note["groups"][g]}
            self.remotes[groups] = ipc.open_remote({"format": ipc.FORMAT, "host": self.note["host"],
                                                    "pid": self.note["pid"], "tensors": tensors})
        return self.remotes[groups]

    def owner(self, groups: tuple[int, ...]):
        return next(iter(self.destination(groups).owners.values()))

    def release(self, groups: tuple[int, ...]) -> None:
        """A step connect planned and dropped (a batch whose groups go one by one): unmapped."""
        remote = self.remotes.pop(groups, None)
        if remote is not None:
            remote.close()

    def close(self) -> None:
        """Unmaps every step's tensors (each, even where one fails; the first failure raised)."""
        remotes, self.remotes, self.closed = list(self.remotes.values()), {}, True
        failed = None
        for remote in remotes:
            try:
                remote.close()
            except Exception as error:  # noqa: BLE001 - raised once every remote was tried
                failed = failed or error
        if failed is not None:
            raise failed


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

    def owner(self, groups):
        return self._owner

    def release(self, groups) -> None:
        pass

    def destination(self, groups):
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
