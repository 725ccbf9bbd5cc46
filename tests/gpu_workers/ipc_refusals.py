"""CUDA IPC refusals with the real driver, in a process of its own (it changes PyTorch's
allocator settings). Run by tests/test_swap_ipc.py; prints "RESULT ok" when all hold,
else the check that failed."""

import jax_amem  # noqa: F401
import torch

from jax_amem._native import core
from jax_amem.swapping import SwapError
from jax_amem.swapping.same_host.ipc import export_tensors, open_remote


def refused(call, error_type, words: str) -> None:
    try:
        call()
    except error_type as error:
        assert words in str(error), f"{words!r} not in: {error}"
        return
    raise AssertionError(f"no {error_type.__name__} ({words!r})")


tensor = torch.zeros(1024, device="cuda")
descriptor = export_tensors({"w": tensor})
entry = descriptor["tensors"]["w"]
assert len(bytes.fromhex(entry["handle"])) == 64 and entry["nbytes"] == 4096, entry
# Our own descriptor: refused before the driver is asked.
refused(lambda: open_remote(descriptor), SwapError, "exported by this very process")
# The driver itself refuses a process's own handle; the message says why.
refused(lambda: core.ipc.open_handle(bytes.fromhex(entry["handle"]), 0), RuntimeError, "cuIpcOpenMemHandle")
assert core.ipc.open_count() == 0
refused(lambda: core.ipc.close_handle(b"\0" * 64, 0), RuntimeError, "is not open")
# Expandable segments turned on at run time: VMM memory, which CUDA IPC cannot export.
torch.cuda.memory._set_allocator_settings("expandable_segments:True")
vmm = torch.zeros(64 << 20, device="cuda")
refused(lambda: export_tensors({"vmm": vmm}), SwapError, "cannot be exported with cuIpcGetMemHandle")
print("RESULT ok", flush=True)
