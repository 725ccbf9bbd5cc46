"""The resharded weight swap: a trainer's sharded jax.Arrays written into a rollout's own
buffers, in place: PyTorch tensors by address, jax.Arrays by donation, another process's
tensors through CUDA IPC, another host's over NCCL send/recv.

    report = jax_amem.swap(params, dict(model.named_parameters()), rules=reshard.rules.hf_llama(L))
    print(report)                       # version, bytes per transport, time, GB/s
    views = jax_amem.to_torch(params)   # zero-copy read-only PyTorch views per shard

    remote = open_remote(descriptor)    # a rollout process's export_tensors(...), same host
    jax_amem.swap(params, remote, rules=...)
    # TrainerIpc / RolloutIpc: the same with the ready/done protocol over a store
    # nccl_transport.connect / send / receive: another host

`jax_amem.swap` is the function; this subpackage also holds `verify`, `forget`, the
transports and the executor's parts (`from jax_amem.swap import verify`). See docs/swap.md.
"""

from . import nccl_transport
from .api import forget, swap, verify
from .errors import SwapError
from .ipc import RemoteTensors, export_tensors, open_remote
from .remote import RolloutIpc, TrainerIpc
from .report import SwapReport
from .store import JaxStore, StoreTimeout, TorchStore
from .torch_bridge import TorchShard, to_torch
from .verify import Mismatch

__all__ = ["JaxStore", "Mismatch", "RemoteTensors", "RolloutIpc", "StoreTimeout", "SwapError", "SwapReport",
           "TorchShard", "TorchStore", "TrainerIpc", "export_tensors", "forget", "nccl_transport", "open_remote",
           "swap", "to_torch", "verify"]
