"""Runs a compiled Program in this process: every source shard located before the first byte
moves, then one jitted call per group, then a wait until the device is idle.

PyTorch destinations (the "addresses" route) are written by address: the program was built
for exactly the addresses the tensors have now (they are part of its cache key), and the
swap holds the tensors until the copy is done. Ordering with PyTorch (CUDA): before, the swap
waits on the host for PyTorch's current stream of each destination device (so work still
reading the old weights finishes first); after, it blocks until XLA's work is done, so
PyTorch work issued after `swap` returns sees the new values on any stream.

JAX destinations are donated and come back as new arrays in the same memory.
"""

from __future__ import annotations

import jax

from .. import report as R
from .. import torch_bridge
from ..sources import shard_data
from . import torch_copies
from .programs import Program


def run(program: Program, sources, destination, show_progress: bool):
    """Returns (the written JAX arrays in `program.order`, or [] for PyTorch destinations;
    extra transports) once all work is done."""
    if destination.kind in ("torch", "remote"):  # remote: the rollout said it is idle (same_host/ready_done.py)
        if destination.kind == "torch":
            torch_bridge.wait_for_torch({g.device.local_hardware_id for g in program.groups
                                         if g.device.platform == "gpu"})
        if destination.kind == "torch" and any(g.torch_copies for g in program.groups):
            def call(group, shards, start):
                out = group.fn(shards) if group.fn is not None else ()
                torch_copies.run(group, shards, destination.tensors)
                return out
            try:
                _dispatch(program, sources, call, show_progress)
            finally:
                torch_copies.synchronize(program)
        else:
            _dispatch(program, sources, lambda group, shards, start: group.fn(shards), show_progress)
        return [], {}
    donated = destination.inputs(program.order, program.dst_indices)
    pointers = [a.unsafe_buffer_pointer() for a in donated]

    def call(group, shards, start):
        return group.fn(shards, tuple(donated[start:start + len(group.buffers)]))

    outputs = _dispatch(program, sources, call, show_progress)
    landed = [o.unsafe_buffer_pointer() for o in outputs]
    moved = sum(o.nbytes for o, was, now in zip(outputs, pointers, landed) if was != now)
    return outputs, ({R.NOT_IN_PLACE: moved} if moved else {})


def _dispatch(program: Program, sources, call, show_progress: bool) -> list:
    """Calls every group (`call(group, source shards, first buffer position)`), returns the
    results in order once they are ready."""
    outputs = []
    bar = _progress(program, show_progress)
    start = 0
    arrays = sources.arrays
    try:
        for group in program.groups:
            # Most sources are single-device arrays already on the group's device: taken as they are.
            shards = [arrays[name] if index is None else shard_data(arrays[name], index)
                      for name, index, _ in group.source_refs]
            for k, (_, _, device) in enumerate(group.source_refs):
                if device != group.device:
                    shards[k] = jax.device_put(shards[k], group.device)
            results = call(group, tuple(shards), start)
            start += len(group.buffers)
            outputs.extend(results)
            if bar is not None:
                jax.block_until_ready(results)
                bar.update(group.nbytes)
    except BaseException:
        # The groups already dispatched may still be writing the destination (by address: memory
        # the caller may free or read as soon as the error reaches it; over IPC the rollout is
        # told the swap failed). Their writes end before the error leaves.
        _wait_quietly(outputs)
        raise
    finally:
        if bar is not None:
            bar.close()
    jax.block_until_ready(outputs)
    return outputs


def _wait_quietly(outputs) -> None:
    """Waits for dispatched work on the error path; its own failure must not hide the first."""
    try:
        jax.block_until_ready(outputs)
    except Exception:  # noqa: BLE001 - the error being raised already says what went wrong
        pass


def _progress(program: Program, show: bool):
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=program.nbytes, unit="B", unit_scale=True, desc="swap", leave=False)
