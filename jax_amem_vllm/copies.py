"""A commit's copies of staged tensors into the engine's parameters, batched.

Why: a commit copies every parameter vLLM serves as loaded from the staging buffer, and one
`copy_` a parameter is a dispatch and a kernel launch each: about 300 a rank for a Qwen3-0.6B,
8.3 ms of an 11 ms update on an H100 (docs/benchmarks.md), against 0.4 ms for the bytes.
PyTorch's `_foreach_copy_` copies a list of tensors in a few multi-tensor launches where their
dtypes and devices agree, and falls back to the same per-tensor copy where they do not, so the
written bytes are `copy_`'s either way.
"""

from __future__ import annotations

import torch

# torch >= 2.1; without it (or for one tensor) the per-tensor loop.
_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)


def copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """targets[k].copy_(sources[k]) for every k, in as few launches as PyTorch can. ValueError
    (before anything is written) where the lists differ in length or a pair in shape: a
    commit copies each staged tensor into a parameter of its own shape, never broadcasts."""
    if len(targets) != len(sources):
        raise ValueError(f"jax_amem: {len(targets)} parameters for {len(sources)} staged tensors")
    for k, (target, source) in enumerate(zip(targets, sources)):
        if target.shape != source.shape:
            raise ValueError(f"jax_amem: parameter {k} has shape {tuple(target.shape)} but its staged tensor "
                             f"{tuple(source.shape)}; nothing was copied")
    if len(targets) > 1 and _FOREACH_COPY is not None:
        _FOREACH_COPY(targets, sources)
    else:
        for target, source in zip(targets, sources):
            target.copy_(source)
