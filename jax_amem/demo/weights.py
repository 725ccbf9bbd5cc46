"""Trainer -> rollout weights: `jax_amem.swap` into the rollout model's own tensors, and the two
naive ways it is compared with (the weight_swap notebook).

The mapping is `jax_amem.reshard.rules.hf_llama(stacked=True)` (family "qwen3":
`rules.qwen3(params, source="flax", layout="hf")`): the Flax tree's stacked, (in, out)
kernels become Hugging Face's per-layer (out, in) weights.
"""

from __future__ import annotations

import jax
import numpy as np

import jax_amem

from .. import reshard
from .config import PolicyConfig


def swap_rules(config: PolicyConfig, params=None, cast: str | None = None):
    """The rules from the trainer's tree into the rollout model; `cast` converts on the way
    (e.g. "bfloat16"). The Qwen3 preset reads the shapes of `params` (arrays or
    ShapeDtypeStructs)."""
    if config.family == "qwen3":
        if params is None:
            raise ValueError("swap_rules: the qwen3 preset needs the trainer's params (their shapes)")
        return reshard.rules.qwen3(params, source="flax", layout="hf", cast=cast,
                                   tie_embeddings=config.tie_embeddings)
    return reshard.rules.hf_llama(config.num_layers, stacked=True, cast=cast,
                                  tie_embeddings=config.tie_embeddings)


def swap_weights(params, tensors, rules, **options):
    """Writes `params` (jax.Arrays, any sharding) into `tensors` (name -> torch.Tensor) in place;
    returns the `jax_amem.swapping.SwapReport` (bytes, seconds, gb_per_s, transports). No bar of its own
    (the demo's shows the iterations; on loaded cores a 0.3 MiB swap outlasts the swap's
    auto-progress threshold and its bar would interleave with the demo's)."""
    options.setdefault("progress", False)
    return jax_amem.swap(params, tensors, rules=rules, **options)


def _apply_part(value, part):
    """What a rule part does to its source, on a numpy or a JAX array alike:
    `value[index].transpose(t).reshape(shape).astype(cast)`."""
    value = value[tuple(part.index)] if part.index else value
    if part.transpose is not None:
        value = value.transpose(part.transpose)
    if part.shape is not None:
        value = value.reshape(part.shape)
    return value.astype(part.cast) if part.cast else value


def _single_part(rule):
    if len(rule.parts) != 1:
        raise ValueError(f"the per-tensor baselines copy one source per destination; {rule.dst!r} "
                         f"concatenates {len(rule.parts)} (fused tensors are the planner's job)")
    return rule.parts[0]


def per_tensor_copy(params, tensors, rules) -> None:
    """Baseline: every destination gathered to the host whole (np.asarray of the sharded
    array), transposed there, and copied into its tensor with `Tensor.copy_`."""
    import torch

    names = reshard.tree_names(params)
    with torch.no_grad():
        for rule in rules:
            part = _single_part(rule)
            # np.array gathers every shard: a copy, as a gather to the host is anyway on a GPU
            value = _apply_part(np.array(names[part.src]), part)
            tensors[rule.dst].copy_(torch.from_numpy(np.ascontiguousarray(value)))


def device_put_copy(params, tensors, rules) -> None:
    """Baseline: XLA reshards each source to the rollout's device (`jax.device_put`), the
    rule's slice/transpose runs there, and the result is copied in through DLPack."""
    import torch

    names = reshard.tree_names(params)
    with torch.no_grad():
        for rule in rules:
            part = _single_part(rule)
            tensor = tensors[rule.dst]
            device = _jax_device_of(tensor)
            value = _apply_part(jax.device_put(names[part.src], device), part)
            tensor.copy_(torch.from_dlpack(value))


def _jax_device_of(tensor):
    """The JAX device holding the same memory as a PyTorch tensor: GPU i for cuda:i, else CPU 0."""
    if tensor.device.type == "cuda":
        return jax.devices("gpu")[tensor.device.index]
    return jax.devices("cpu")[0]
