"""The resharded weight swap: a trainer's sharded jax.Arrays written into a rollout's own
buffers, in place: PyTorch tensors by address, jax.Arrays by donation, another process's
tensors through CUDA IPC, another host's over NCCL send/recv.

    report = jax_amem.swap(params, dict(model.named_parameters()), rules=reshard.rules.hf_llama(L))
    print(report)                       # version, bytes per transport, time, GB/s
    views = jax_amem.to_torch(params)   # zero-copy read-only PyTorch views per shard

    remote = open_remote(descriptor)    # a rollout process's export_tensors(...), same host
    jax_amem.swap(params, remote, rules=...)
    # TrainerIpc / RolloutIpc: the same with the ready/done protocol over a store
    # cross_host.connect / send / receive: another host

`jax_amem.swap` is the function; this package (`jax_amem.swapping`) holds it and `verify`,
`forget`, the destinations and the transports, by where the rollout lives:

    swapping/               the ground floor: front_door (swap, verify, forget), destinations,
                            sources, torch_bridge, store, report, errors, cache
    swapping/in_process/    the rollout's buffers are this process's: plan -> schedule -> routes
    swapping/same_host/     another process on this host: CUDA IPC handles, the ready/done protocol
    swapping/cross_host/    another host: the NCCL link, handshake, packing, send, receive

See docs/swap.md and docs/architecture.md.
"""

from . import cross_host
from .errors import PartialSwapError, SwapError
from .front_door import forget, swap, verify
from .in_process.verify import Mismatch
from .report import NcclSwapReport, SwapReport
from .same_host.ipc import RemoteTensors, export_tensors, open_remote
from .same_host.ready_done import RolloutIpc, TrainerIpc
from .store import JaxStore, StoreTimeout, TorchStore
from .torch_bridge import TorchShard, to_torch

__all__ = ["JaxStore", "Mismatch", "NcclSwapReport", "PartialSwapError", "RemoteTensors", "RolloutIpc", "StoreTimeout", "SwapError",
           "SwapReport", "TorchShard", "TorchStore", "TrainerIpc", "cross_host", "export_tensors", "forget",
           "open_remote", "swap", "to_torch", "verify"]
