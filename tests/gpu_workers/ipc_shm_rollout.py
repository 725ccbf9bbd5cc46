"""A rollout process for the CPU two-process test of the IPC protocol: its "tensors" live in
POSIX shared memory (the CPU stand-in for CUDA IPC: the trainer maps them by name, see
ShmMapper in tests/test_swap_ipc.py); everything else is the real protocol over a TCPStore.

usage: python -P ipc_shm_rollout.py PORT
Prints RESULT lines: per version the bytes of each tensor (hex), as this process reads them.
"""

import os
import socket
import sys
from multiprocessing import shared_memory
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # -P leaves the script's folder out

import numpy as np
import torch

import ipc_cases
from jax_amem.swapping.same_host.ready_done import RolloutIpc
from jax_amem.swapping.store import TorchStore

SPECS = {"a": ((3, 5), "float32"), "b": ((64,), "bfloat16")}  # both in one block, as the caching allocator does

store = TorchStore.connect("127.0.0.1", int(sys.argv[1]), timeout=120)
block = shared_memory.SharedMemory(create=True, size=1024)
memory = np.ndarray((1024,), np.uint8, buffer=block.buf)
memory[:] = 0xFF
handle = block.name.encode().ljust(64, b"\0").hex()
entries, tensors, offset = {}, {}, 0
for name, (shape, dtype) in SPECS.items():
    nbytes = int(np.prod(shape)) * (4 if dtype == "float32" else 2)
    entries[name] = {"handle": handle, "offset": offset, "nbytes": nbytes, "allocation_bytes": 1024,
                     "shape": list(shape), "dtype": dtype, "device": 0, "pci_bus_id": "0000:00:00.0"}
    tensors[name] = torch.from_numpy(memory[offset:offset + nbytes])
    offset += 512
descriptor = {"format": 1, "host": socket.gethostname(), "pid": os.getpid(), "tensors": entries}

end = RolloutIpc(store, tensors, descriptor=descriptor, timeout=120)
for version in (1, 2):
    end.ready(version)
    summary = end.wait(version)
    ipc_cases.emit(phase=f"v{version}", summary=summary, bytes={n: t.numpy().tobytes().hex() for n, t in tensors.items()},
                   padding_untouched=bool((memory[entries["a"]["nbytes"]:512] == 0xFF).all()))
end.wait_closed()
del tensors, memory
block.close()
block.unlink()
