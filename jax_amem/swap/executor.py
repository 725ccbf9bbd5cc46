"""Runs a compiled Program in this process: every destination buffer imported (or kept) and
every source shard located before the first byte moves, then one jitted call per group,
then a check that each PyTorch tensor was written in its own memory.

Ordering with PyTorch (CUDA): before, a DLPack import hands JAX's stream to PyTorch, which
makes it wait for PyTorch's current stream; buffers kept from the previous swap skip the
import, so the swap then waits on the host for PyTorch's current stream of their devices.
After, the swap blocks until XLA's work is done: PyTorch work issued after `swap` returns
sees the new values on any stream.
"""

from __future__ import annotations

import jax

from . import report as R
from . import torch_bridge
from .errors import SwapError
from .program import Program


class Kept:
    """The JAX arrays that alias the PyTorch tensors after the last in-place swap. The next
    swap of the same program into tensors at the same addresses donates them again instead
    of importing each tensor (a DLPack import costs more than copying a small tensor). One
    slot: they hold the tensors' storage, so only the latest destination is kept, and
    `jax_amem.swap.forget()` releases it (call it before freeing the rollout model)."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.program, self.pointers, self.arrays = None, None, None

    def take(self, program, pointers):
        """The kept arrays if they alias exactly these addresses, else None. Taken arrays are
        donated, so the slot empties either way."""
        hit = self.program is program and self.pointers == pointers and not any(a.is_deleted() for a in self.arrays)
        arrays = self.arrays if hit else None
        self.clear()
        return arrays


kept = Kept()


def run(program: Program, sources, destination, show_progress: bool):
    """Returns (the written arrays in `program.order`, extra transports) once all work is done."""
    order = program.order
    if destination.kind == "torch":
        tensors = [destination.tensors[name] for name, _ in order]
        pointers = [t.data_ptr() for t in tensors]
        donated = kept.take(program, pointers)
        if donated is None:  # may raise: nothing has moved yet
            donated = [torch_bridge.import_tensor(name, t) for (name, _), t in zip(order, tensors)]
        else:
            torch_bridge.wait_for_torch({g.device.local_hardware_id for g in program.groups
                                         if g.device.platform == "gpu"})
    else:
        donated = destination.inputs(order, program.dst_indices)
        pointers = [a.unsafe_buffer_pointer() for a in donated]
    outputs = []
    bar = _progress(program, show_progress)
    start = 0
    for group in program.groups:
        shards = []
        for name, index, device in group.source_refs:
            shard = sources.shard_at(name, index)
            shards.append(shard if device == group.device else jax.device_put(shard, group.device))
        results = group.fn(tuple(shards), tuple(donated[start:start + len(group.buffers)]))
        start += len(group.buffers)
        outputs.extend(results)
        if bar is not None:
            jax.block_until_ready(results)
            bar.update(group.nbytes)
    jax.block_until_ready(outputs)
    if bar is not None:
        bar.close()
    landed = [o.unsafe_buffer_pointer() for o in outputs]
    if destination.kind == "torch":
        return outputs, _land_in_tensors(program, tensors, pointers, outputs, landed, order)
    moved = sum(o.nbytes for o, was, now in zip(outputs, pointers, landed) if was != now)
    return outputs, ({R.NOT_IN_PLACE: moved} if moved else {})


def _land_in_tensors(program, tensors, pointers, outputs, landed, order) -> dict:
    """Proves each result sits in its tensor's memory. XLA:CPU does not alias a DLPack
    import to a donated output, so on the CPU each result is copied into its tensor (counted
    as host-copy-back); on a GPU a result elsewhere is copied in too, then SwapError says so."""
    if landed == pointers:
        kept.program, kept.pointers, kept.arrays = program, pointers, outputs
        return {}
    copied, stray = 0, []
    for (name, _), tensor, output, was, now in zip(order, tensors, outputs, pointers, landed):
        if was == now:
            continue
        torch_bridge.copy_into(tensor, output)
        copied += output.nbytes
        if tensor.device.type != "cpu":
            stray.append(name)
    if stray:
        raise SwapError(f"XLA wrote {len(stray)} destination(s) outside their tensors' memory (first: {stray[0]!r}) "
                        "although they were donated; they were copied in afterwards, so every destination holds "
                        "the new values, but not in place. Please report this with your jax and torch versions.")
    return {R.HOST_COPY_BACK: copied}


def _progress(program: Program, show: bool):
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=program.nbytes, unit="B", unit_scale=True, desc="swap", leave=False)
