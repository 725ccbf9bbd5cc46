"""The rollout of the two-process IPC test: a PyTorch process (JAX starts no backend here)
whose tensors the trainer process (ipc_trainer.py) writes through CUDA IPC.

usage: python -P ipc_rollout.py CASE PORT    (CASE: llama | many; PORT: the trainer's TCPStore)
Prints RESULT lines: per version the logits (llama) or per-tensor sha256 of the bytes (many),
then whether every tensor kept its address.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # -P leaves the script's folder out

import jax_amem  # noqa: F401  (first, as in every process of the project)
import torch

import ipc_cases
from jax_amem.swapping.same_host.ready_done import RolloutIpc
from jax_amem.swapping.store import TorchStore

case, port = sys.argv[1], int(sys.argv[2])
store = TorchStore.connect("127.0.0.1", port, timeout=240)
if case == "llama":
    import test_swap_llama as llama

    model = llama.nan_model("cuda")
    tensors = dict(model.named_parameters())
else:
    tensors = {name: torch.zeros(shape, dtype=getattr(torch, dtype), device="cuda")
               for name, (shape, dtype) in ipc_cases.many_specs().items()}
pointers = {name: t.data_ptr() for name, t in tensors.items()}

end = RolloutIpc(store, tensors, rank=0, timeout=240)
for version in (1, 2):
    end.ready(version)        # nothing of ours runs on the GPU now: the trainer may write
    summary = end.wait(version)
    if case == "llama":
        ipc_cases.emit(phase=f"v{version}", logits=llama.torch_logits(model, llama.TOKENS).tolist(), summary=summary)
    else:
        ipc_cases.emit(phase=f"v{version}", summary=summary, digests={
            name: ipc_cases.digest(t.detach().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
            for name, t in tensors.items()})
end.wait_closed()             # the trainer unmapped our memory: we may exit
ipc_cases.emit(phase="done", pointers_unchanged={n: t.data_ptr() for n, t in tensors.items()} == pointers)
