"""The worker's staging buffer (where the trainer writes a group's new values) and the note that
tells the trainer where it is, chosen by where the worker's model lives:

* CPU: a file in /dev/shm, mapped shared by the worker (torch.from_file) and by the trainer,
  which writes it by address like any tensor of its own process. The trainer removes the file
  once it has mapped it; both mappings stay.
* CUDA: a device buffer, exported as a CUDA IPC handle (jax-amem's compiled core,
  `jax_amem_core`, which imports no JAX), which the trainer maps with `jax_amem.swapping.open_remote`.

A trainer in the worker's own process uses the buffer directly (`jax_amem_core.registry`) whatever
the device.

The note that says where the buffer is (its path, format and removal) is shared with the trainer:
`jax_amem_core.staging_note`, imported here under the names the engine uses.
"""

from __future__ import annotations

import os

import torch
from jax_amem_core.staging_note import default_directory, note_path, remove, stamped, write_note  # noqa: F401


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
        from jax_amem_core.native import core as native_core

        core = native_core()
        handle, offset, allocation = core.ipc.export_pointer(staging.data_ptr(), ordinal)
        place.update(handle=handle.hex(), offset=int(offset), allocation_bytes=int(allocation),
                     pci_bus_id=core.memory.pci_bus_id(ordinal))
    except (ImportError, RuntimeError) as error:
        place["error"] = f"{type(error).__name__}: {error}"
    return place
