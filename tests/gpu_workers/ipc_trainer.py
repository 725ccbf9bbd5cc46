"""The trainer of the two-process IPC test: JAX on the GPU swaps two versions of its
parameters into the rollout's tensors (ipc_rollout.py) through CUDA IPC.

usage: python -P ipc_trainer.py CASE PORT    (CASE: llama | many)
Prints RESULT lines: the first swap's report, and the oracle per version (the JAX model's
logits at full matmul precision, or the sources' per-tensor sha256).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # -P leaves the script's folder out

import jax_amem
import jax
import numpy as np

import ipc_cases
from jax_amem import reshard
from jax_amem.swapping.same_host.ready_done import TrainerIpc
from jax_amem.swapping.store import TorchStore

case, port = sys.argv[1], int(sys.argv[2])
gpu = jax.devices("gpu")[0]
store = TorchStore.connect("127.0.0.1", port, timeout=240)
if case == "llama":
    import test_swap_llama as llama

    trees = [llama.flax_params(5), llama.flax_params(6)]
    rules = reshard.rules.hf_llama(llama.L)
else:
    trees = [ipc_cases.many_values(1), ipc_cases.many_values(2)]
    rules = None

end = TrainerIpc(store, rank=0, timeout=240)
for version, tree in enumerate(trees, start=1):
    params = jax.device_put(tree, gpu)
    report = end.swap(params, version, rules=rules, verify=version == 1)
    if version == 1:
        ipc_cases.emit(phase="swap", route=report.route, verified=report.verified, bytes=report.bytes,
                       seconds=report.seconds, transports=report.transports)
    name = "oracle" if version == 1 else "oracle2"
    if case == "llama":
        with jax.default_matmul_precision("highest"):
            logits = np.asarray(jax.jit(llama.jax_llama_logits)(params, llama.TOKENS))
        ipc_cases.emit(phase=name, logits=logits.tolist())
    else:
        ipc_cases.emit(phase=name, digests={n: ipc_cases.digest(np.ascontiguousarray(v).tobytes())
                                            for n, v in tree.items()})
# A forged descriptor (a tensor said to lie past its allocation, allocation_bytes inflated to
# match) is refused against the size the driver mapped, and leaves nothing mapped.
import json

from jax_amem._native import core
from jax_amem.swapping import SwapError
from jax_amem.swapping.same_host.ipc import open_remote
from jax_amem.swapping.store import key

descriptor = json.loads(store.get(key("rollout", "handles", 0), 60))
entry = next(e for e in descriptor["tensors"].values() if e["nbytes"])
mapped = {}
for e in descriptor["tensors"].values():
    if e["nbytes"]:
        mapped[e["handle"]] = core.ipc.mapped_bytes(bytes.fromhex(e["handle"]), gpu.local_hardware_id)
sizes_match = all(mapped[e["handle"]] >= e["allocation_bytes"] for e in descriptor["tensors"].values() if e["nbytes"])
entry["offset"] = entry["allocation_bytes"]
entry["allocation_bytes"] = 2 * entry["allocation_bytes"] + entry["nbytes"]
open_before = core.ipc.open_count()
try:
    open_remote(descriptor).close()
    forged = "not refused"
except SwapError as error:
    forged = str(error)
ipc_cases.emit(phase="forged", refused="as mapped here" in forged, message=forged[:300],
               sizes_match=sizes_match, open_count_unchanged=core.ipc.open_count() == open_before)
end.close()
