"""Runs a compiled Program in this process: every destination buffer imported (or kept) and
every source shard located before the first byte moves, then one jitted call per group,
then a check that each PyTorch tensor was written in its own memory.

Ordering with PyTorch (CUDA): before, a DLPack import hands JAX's stream to PyTorch, which
makes it wait for PyTorch's current stream; buffers kept from the previous swap skip the
import, so the swap waits on the host for PyTorch's current stream of their device. After,
the swap blocks until XLA's work is done: PyTorch work issued after `swap` returns sees the
new values on any stream.
"""

from __future__ import annotations

import jax
import numpy as np

from . import report as R
from . import torch_bridge
from .errors import SwapError
from .program import Program


class Kept:
    """The JAX arrays that alias PyTorch tensors after the last in-place swap, by (device,
    address, shape, dtype): the next swap donates them again instead of re-importing
    (a DLPack import costs more than the copy of a small tensor). They hold the tensors'
    storage: `forget()` releases them (call it before freeing the rollout model)."""

    def __init__(self):
        self.arrays: dict = {}

    def get(self, key):
        return self.arrays.get(key)

    def replace(self, arrays: dict) -> None:
        self.arrays = arrays


kept = Kept()


def run(program: Program, sources, destination, show_progress: bool):
    """Returns ({buffer: written array}, extra transports) after all work has finished."""
    inputs = [destination.inputs(group.buffers, kept) for group in program.groups]  # may raise: nothing moved yet
    if destination.kind == "torch":
        _wait_for_torch_on_kept(program, destination, inputs)
    else:  # JAX: XLA writes in place unless the buffer is shared (e.g. a CPU array made from numpy)
        pointers = [a.unsafe_buffer_pointer() if a.size else 0 for arrays in inputs for a in arrays]
    written = {}
    bar = _progress(program, show_progress)
    for group, donated in zip(program.groups, inputs):
        shards = []
        for (name, owner), device in zip(group.sources, group.source_devices):
            shard = sources.shard(name, owner)
            shards.append(shard if device == group.device else jax.device_put(shard, group.device))
        results = group.fn(tuple(shards), tuple(donated))
        written.update(zip(group.buffers, results))
        if bar is not None:
            jax.block_until_ready(results)
            bar.update(group.nbytes)
    jax.block_until_ready(list(written.values()))
    if bar is not None:
        bar.close()
    if destination.kind == "torch":
        return written, _land_in_tensors(destination, written)
    moved = sum(int(np.prod(a.shape, dtype=np.int64)) * a.dtype.itemsize
                for a, p in zip(written.values(), pointers) if a.size and a.unsafe_buffer_pointer() != p)
    return written, ({R.NOT_IN_PLACE: moved} if moved else {})


def _wait_for_torch_on_kept(program, destination, inputs) -> None:
    cuda = set()
    for group, arrays in zip(program.groups, inputs):
        for (name, _), array in zip(group.buffers, arrays):
            tensor = destination.tensors[name]
            if tensor.device.type == "cuda" and kept.get(_key(tensor)) is array:
                cuda.add(tensor.device.index)
    if cuda:
        torch_bridge.wait_for_torch(cuda)


def _key(tensor):
    return (tensor.device, tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)


def _land_in_tensors(destination, written) -> dict:
    """Proves each result sits in its tensor's memory. XLA:CPU does not alias a DLPack
    import to a donated output, so on the CPU the result is copied into the tensor (counted
    as host-copy-back); on a GPU a result elsewhere is copied too, then SwapError says so."""
    new_kept, copied, stray = {}, 0, []
    for (name, _), array in written.items():
        tensor = destination.tensors[name]
        if tensor.numel() == 0:
            continue
        if array.unsafe_buffer_pointer() == tensor.data_ptr():
            new_kept[_key(tensor)] = array
            continue
        torch_bridge.copy_into(tensor, array)
        copied += tensor.numel() * tensor.element_size()
        if tensor.device.type != "cpu":
            stray.append(name)
    kept.replace(new_kept)
    if stray:
        raise SwapError(f"XLA wrote {len(stray)} destination(s) outside their tensors' memory (first: {stray[0]!r}) "
                        "although they were donated; they were copied in afterwards, so every destination holds "
                        "the new values, but not in place. Please report this with your jax and torch versions.")
    return {R.HOST_COPY_BACK: copied} if copied else {}


def _progress(program: Program, show: bool):
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=program.nbytes, unit="B", unit_scale=True, desc="swap", leave=False)
