"""PyTorch <-> JAX: which JAX device a tensor lives on, what a tensor must be for the swap to
write it by address, and zero-copy read-only views of JAX arrays through DLPack (`to_torch`).

PyTorch is optional: nothing here imports it unless a tensor is handed in.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..reshard import LayoutError, Owner, tree_names
from .errors import SwapError


def tensor_type():
    """torch.Tensor when PyTorch is loaded, else None (nothing here imports it)."""
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def is_tensor(value) -> bool:
    tensor = tensor_type()
    return tensor is not None and isinstance(value, tensor)


def is_tensor_mapping(value) -> bool:
    """A non-empty mapping whose values are all torch tensors (a model's state_dict): one
    isinstance per value, in C, for thousands of tensors per swap."""
    tensor = tensor_type()
    return (tensor is not None and isinstance(value, Mapping) and bool(value)
            and all(map(isinstance, value.values(), itertools.repeat(tensor))))


def numpy_dtype(tensor) -> np.dtype:
    """torch.bfloat16 -> ml_dtypes' bfloat16, torch.float32 -> float32, ..."""
    name = str(tensor.dtype).removeprefix("torch.")
    try:
        return jnp.dtype(name)
    except TypeError as error:
        raise SwapError(f"tensor of dtype {tensor.dtype} has no JAX dtype ({error})") from None


_device_of_hardware: dict[tuple[str, int], Any] = {}


def jax_device(tensor):
    """The JAX device holding `tensor`'s memory (torch cuda:i -> the JAX GPU with local
    hardware id i, torch cpu -> the JAX CPU device 0), or None when JAX has none."""
    kind = tensor.device.type
    platform, index = {"cuda": ("gpu", tensor.device.index or 0), "cpu": ("cpu", 0)}.get(kind, (None, 0))
    if platform is None:
        return None
    key = (platform, index)
    if key not in _device_of_hardware:
        try:
            devices = jax.local_devices(backend=platform)
        except RuntimeError:
            devices = []
        # XLA's CPU devices all report hardware id 0; DLPack puts CPU tensors on the first.
        match = [d for d in devices if platform == "cpu" or d.local_hardware_id == index][:1]
        _device_of_hardware[key] = match[0] if match else None
    return _device_of_hardware[key]


def owner_of(tensor) -> Owner | None:
    device = jax_device(tensor)
    return None if device is None else Owner(device.process_index, device.id)


def check_writable(name: str, tensor) -> None:
    """What a write by address needs; raises SwapError naming the tensor."""
    if jax_device(tensor) is None:
        raise SwapError(f"destination {name!r} is on {tensor.device}, which JAX in this process does not "
                        "have: move the model to a GPU JAX sees (same CUDA_VISIBLE_DEVICES) or to the CPU")
    if not tensor.is_contiguous():
        raise SwapError(f"destination {name!r} is not contiguous (strides {tuple(tensor.stride())}): the swap "
                        "writes the tensor's memory in row-major order; make the model's tensor contiguous")
    storage = tensor.untyped_storage()
    if (tensor.storage_offset() + tensor.numel()) * tensor.element_size() > storage.nbytes():
        raise SwapError(f"destination {name!r}: its storage holds {storage.nbytes()} bytes, fewer than the tensor "
                        "needs (freed, e.g. resized to 0 by FSDP or an offload): restore it before the swap")
    dtype = numpy_dtype(tensor)
    if jax.dtypes.canonicalize_dtype(dtype) != dtype:
        raise SwapError(f"destination {name!r} is {tensor.dtype}, which JAX holds as "
                        f"{jax.dtypes.canonicalize_dtype(dtype)} unless 64-bit types are on: enable jax_enable_x64")


class TensorFacts(NamedTuple):
    """What the swap needs of one destination tensor besides its bytes."""
    owner: Owner
    device: Any          # the JAX device holding it
    dtype: np.dtype
    address: int
    nbytes: int


def facts(tensors: Mapping, check: bool = True) -> dict[str, TensorFacts]:
    """{name: TensorFacts} of every tensor, each checked writable (check_writable) first
    when `check`: one pass for the whole model."""
    out = {}
    for name, tensor in tensors.items():
        if check:
            check_writable(name, tensor)
        device = jax_device(tensor)
        owner = None if device is None else Owner(device.process_index, device.id)
        out[name] = TensorFacts(owner, device, numpy_dtype(tensor), tensor.data_ptr(),
                                tensor.numel() * tensor.element_size())
    return out


def current_raw_streams(ordinals) -> dict[int, int]:
    """{ordinal: the cudaStream_t of PyTorch's current stream there}, read without making a
    torch.cuda.Stream object each time where PyTorch has the raw getter (inductor's)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        return {o: torch.cuda.current_stream(o).cuda_stream for o in ordinals}
    return {o: raw(o) for o in ordinals}


def wait_for_torch(devices) -> None:
    """Host wait for PyTorch's current stream on each CUDA device: work queued there (a
    rollout still reading the old weights) finishes before the swap writes."""
    import torch

    for index in sorted(devices):
        torch.cuda.current_stream(index).synchronize()


class TorchShard(NamedTuple):
    tensor: Any                   # torch.Tensor (a ReadOnlyView), zero-copy: writes are refused
    index: tuple[slice, ...]      # where this shard sits in the global array
    device: Any                   # the JAX device


def to_torch(params) -> dict[str, list[TorchShard]]:
    """Zero-copy PyTorch views of every addressable shard of every array of `params`.

    The views alias JAX's memory, and a jax.Array is immutable: read them. An in-place write
    through PyTorch (add_, v[...] = x, out=v, .numpy() then a write) raises ReadOnlyViewError
    with nothing written; `.clone()` gives a tensor of your own. Do not keep the views past the
    arrays' lifetime (a donated or deleted array frees the memory under the view). Raises
    SwapError, naming the leaf, for a leaf that is not a live jax.Array or a tree whose leaves
    cannot be named.
    """
    import torch

    from .read_only_view import mark

    try:
        named = tree_names(params)
    except LayoutError as error:
        raise SwapError(f"to_torch: {error}") from None
    out = {}
    for name, array in named.items():
        if not isinstance(array, jax.Array):
            raise SwapError(f"to_torch: {name!r} is a {type(array).__name__}, not a jax.Array")
        if array.is_deleted():
            raise SwapError(f"to_torch: {name!r} was deleted (donated or freed)")
        out[name] = [TorchShard(mark(torch.from_dlpack(s.data), name), s.index, s.device)
                     for s in array.addressable_shards]
    return out
