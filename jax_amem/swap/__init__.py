"""The resharded weight swap: a trainer's sharded jax.Arrays written into a rollout's own
buffers (PyTorch tensors through DLPack, or jax.Arrays by donation), in place.

    report = jax_amem.swap(params, dict(model.named_parameters()), rules=reshard.rules.hf_llama(L))
    print(report)                       # version, bytes per transport, time, GB/s
    views = jax_amem.to_torch(params)   # zero-copy read-only PyTorch views per shard

`jax_amem.swap` is the function; this subpackage also holds `verify`, `forget` and the
executor's parts (`from jax_amem.swap import verify`). See docs/swap.md.
"""

from .api import forget, swap, verify
from .errors import SwapError
from .report import SwapReport
from .torch_bridge import TorchShard, to_torch
from .verify import Mismatch

__all__ = ["Mismatch", "SwapError", "SwapReport", "TorchShard", "forget", "swap", "to_torch", "verify"]
