"""Which parameters a trainer in the worker's process writes by address, skipping the staging.

A parameter vLLM serves as it loaded it (on a GPU: unquantized linear layers, embeddings,
norms) is what its kernels read, so the trainer's swap can write it directly: one device copy
per byte instead of two (the swap into staging, then the commit's copy). That needs the
parameter to hold exactly the loaded form (shape, dtype, contiguous); a processed one (quantized,
repacked, derived) keeps going through staging and vLLM's processing (reprocess.py).

What changes for versions: the served weights change during the trainer's swap, before the
first commit. The engine refuses to serve from start_weight_update until every group is in, so
an update stopped partway leaves it refusing rather than serving a mix (docs/vllm.md).
"""

from __future__ import annotations

import torch


def writable_in_place(t, param: torch.Tensor) -> torch.Tensor | None:
    """`param` when it holds tensor `t` of the layout (layout.Tensor) exactly as loaded, else None."""
    if t.processed or param.device.type != "cuda" or not param.is_contiguous():
        return None
    if tuple(param.shape) != tuple(t.shape) or str(param.dtype).removeprefix("torch.") != t.dtype:
        return None
    return param
