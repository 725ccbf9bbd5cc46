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
from .programs import Program


def run(program: Program, sources, destination, show_progress: bool):
    """Returns (the written JAX arrays in `program.order`, or [] for PyTorch destinations;
    extra transports) once all work is done."""
    if destination.kind in ("torch", "remote"):  # remote: the rollout said it is idle (same_host/ready_done.py)
        if destination.kind == "torch":
            torch_bridge.wait_for_torch({g.device.local_hardware_id for g in program.groups
                                         if g.device.platform == "gpu"})
            destination.before_writing()
        _dispatch(program, sources, lambda group, shards, start: group.fn(shards), show_progress)
        return [], {}
    destination.before_donating(sources)
    donated = destination.inputs(program.order, program.dst_indices)
    pointers = [a.unsafe_buffer_pointer() for a in donated]

    def call(group, shards, start):
        return group.fn(shards, tuple(donated[start:start + len(group.buffers)]))

    outputs = []
    try:
        _dispatch(program, sources, call, show_progress, outputs)
    except BaseException as error:
        if not outputs:
            raise  # nothing was donated: the arrays are as they were
        # Groups already ran: their donated buffers live on only in `outputs`; hand them back.
        failure = destination.recover(program, outputs, error)
        if isinstance(error, Exception):
            raise failure from error
        error.partial_swap = failure  # KeyboardInterrupt and the like stay what they are
        raise
    landed = [o.unsafe_buffer_pointer() for o in outputs]
    moved = sum(o.nbytes for o, was, now in zip(outputs, pointers, landed) if was != now)
    return outputs, ({R.NOT_IN_PLACE: moved} if moved else {})


def _dispatch(program: Program, sources, call, show_progress: bool, outputs: list | None = None) -> list:
    """Calls every group (`call(group, source shards, first buffer position)`), returns the
    results in order once they are ready; they are appended to `outputs` as they come, so a
    caller still holds those of the groups that ran when a later one fails."""
    outputs = [] if outputs is None else outputs
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
