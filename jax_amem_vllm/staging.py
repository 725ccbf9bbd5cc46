"""The worker's staging buffer (where the trainer writes a group's new values) and the note that
tells the trainer where it is, chosen by where the worker's model lives:

* CPU: a file in /dev/shm, mapped shared by the worker (torch.from_file) and by the trainer,
  which writes it by address like any tensor of its own process. The trainer removes the file
  once it has mapped it; both mappings stay.
* CUDA: a device buffer, exported as a CUDA IPC handle (jax-amem's core, loaded without JAX:
  native.py), which the trainer maps with `jax_amem.swapping.open_remote`.

A trainer in the worker's own process uses the buffer directly (registry.py) whatever the device.

The note is `<directory>/jax_amem-<session>-rank<r>.json`: the worker's process, its model's
description (layout.py) and the buffer's place. The trainer reads it after
`init_weight_transfer_engine` returns on every rank, then removes it.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile

import torch


def default_directory() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def note_path(directory: str, session: str, rank: int) -> str:
    return os.path.join(directory, f"jax_amem-{session}-rank{rank}.json")


def allocate(nbytes: int, device: torch.device, directory: str, session: str, rank: int) -> tuple[torch.Tensor, dict]:
    """A zeroed uint8 buffer of `nbytes` and where another process finds it."""
    if device.type == "cpu":
        path = os.path.join(directory, f"jax_amem-{session}-rank{rank}.staging")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            # Reserved now (a new file reads as zeros): a full /dev/shm must fail here, not as a
            # SIGBUS when a page is first written.
            os.posix_fallocate(fd, 0, max(nbytes, 1))
        except OSError as error:
            os.close(fd)
            remove(path)
            # A trainer in this process still writes the buffer directly; one in another process
            # is told why it cannot.
            return torch.zeros(nbytes, dtype=torch.uint8), {
                "kind": "shared_memory", "error": f"{directory} has no room for the {nbytes}-byte staging buffer "
                f"({error}): give the engine's host or container more shared memory (docker: --shm-size or "
                "--ipc=host)"}
        os.close(fd)
        return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8), {"kind": "shared_memory", "path": path}
    staging = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    return staging, cuda_ipc_place(staging)


def cuda_ipc_place(staging: torch.Tensor) -> dict:
    """The CUDA IPC handle of the buffer's allocation (PyTorch's caching allocator sub-allocates:
    handle plus offset), or the reason there is none (the trainer reports it if it needs it)."""
    ordinal = staging.device.index if staging.device.index is not None else 0
    place = {"kind": "cuda_ipc", "device": ordinal}
    try:
        from .native import core as native_core

        core = native_core()
        handle, offset, allocation = core.ipc.export_pointer(staging.data_ptr(), ordinal)
        place.update(handle=handle.hex(), offset=int(offset), allocation_bytes=int(allocation),
                     pci_bus_id=core.memory.pci_bus_id(ordinal))
    except (ImportError, RuntimeError) as error:
        place["error"] = f"{type(error).__name__}: {error}"
    return place


def stamped(note: dict) -> dict:
    """The note with where the worker runs: its host and process."""
    return {**note, "host": socket.gethostname(), "pid": os.getpid()}


def write_note(path: str, note: dict) -> None:
    """Written whole or not at all (a reader never sees half a note)."""
    note = stamped(note)
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as f:
        json.dump(note, f)
    os.replace(partial, path)


def remove(*paths: str) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except (FileNotFoundError, TypeError):
            pass
