"""Not a module: `jax_amem.swap` is the verb (jax_amem.swapping.swap). The package of that name in
earlier versions is now jax_amem.swapping; importing it, or one of its old modules, ends here in a
ModuleNotFoundError naming where each of its modules went (docs/api.md). `from jax_amem import swap`
and `jax_amem.swap(...)` never load this file: the package's attribute is the verb, and a failed
import leaves it so."""

raise ModuleNotFoundError(
    f"No module named {__name__!r}: "
    "jax_amem.swap was the package of earlier versions: it is now jax_amem.swapping (swap, verify, forget, "
    "to_torch, export_tensors, open_remote, ...); its modules went to jax_amem.swapping.same_host (ipc, "
    "remote -> ready_done), jax_amem.swapping.cross_host (nccl_transport, nccl_link -> link, nccl_control -> "
    "handshake, nccl_packing -> packing, nccl_sender -> send, nccl_receiver -> receive_torch, nccl_jax_receiver "
    "-> receive_jax), jax_amem.swapping.in_process (api -> run, executor, program -> programs, verify, "
    "addressed, batched) and jax_amem.errors (errors); destinations, sources, store, report and torch_bridge "
    "kept their names under jax_amem.swapping. jax_amem.swap is now the verb (a function); docs/api.md lists "
    "where every name went",
    name=__name__)
