"""Runs a compiled Program in this process: every source shard located before the first byte
moves, then one jitted call per group, then a wait until the device is idle.

Destinations written by address (PyTorch tensors, another process's tensors over CUDA IPC:
the "addresses" route) get the program built for exactly the addresses they have now (part
of its cache key); the swap holds them until the copy is done. Before writing, the
destination says what must finish first (`before_writing`: PyTorch's current stream of each
destination GPU, so work still reading the old weights finishes first; nothing over IPC,
where the rollout said it is idle); after, the swap blocks until XLA's work is done, so
PyTorch work issued after `swap` returns sees the new values on any stream. Large whole copies
into this process's PyTorch tensors are PyTorch's own, queued beside each group's call
(torch_copies.py); the swap then also waits for PyTorch's stream.

JAX destinations are donated and come back as new arrays in the same memory.
"""

from __future__ import annotations

import jax

from .. import report as R
from ..sources import shard_data
from . import direct, torch_copies
from .programs import Program


def run(program: Program, sources, destination, show_progress: bool):
    """Returns (the written JAX arrays in `program.order`, or [] for a destination written by
    address; extra transports) once all work is done."""
    if destination.writes_by_address:
        launch = direct.plan_for(program)  # eager swaps of plain copies: launched outside XLA
        if launch is not None:  # ordered after PyTorch's work on the stream it takes (before_launch)
            launch.run([[sources.arrays[name] for name, _, _ in g.source_refs] for g in program.groups],
                       destination, show_progress)
            return [], {}
        destination.before_writing({g.device for g in program.groups})
        if not program.torch_copies:
            _dispatch(program, sources, lambda k, shards, start: program.fns[k](shards), show_progress)
            return [], {}

        def call(k, shards, start):  # the XLA call (if any is left), then PyTorch's copies beside it
            fn = program.fns[k]
            out = fn(shards) if fn is not None else ()
            torch_copies.run(program.groups[k], shards, destination.torch_tensors)
            return out

        try:
            _dispatch(program, sources, call, show_progress)
        finally:
            torch_copies.synchronize(program)
        return [], {}
    destination.before_donating(sources)
    donated = destination.inputs(program.order, program.dst_indices)
    pointers = [a.unsafe_buffer_pointer() for a in donated]

    def call(k, shards, start):
        return program.fns[k](shards, tuple(donated[start:start + len(program.groups[k].buffers)]))

    outputs = []
    try:
        _dispatch(program, sources, call, show_progress, outputs)
    except BaseException as error:
        if not outputs:
            raise  # nothing was donated: the arrays are as they were
        # Groups already ran: their donated buffers live on only in `outputs`; hand them back.
        failure = destination.recover(program.order, program.dst_indices, outputs, program.buffers, error)
        if isinstance(error, Exception):
            raise failure from error
        error.partial_swap = failure  # KeyboardInterrupt and the like stay what they are
        raise
    landed = [o.unsafe_buffer_pointer() for o in outputs]
    moved = sum(o.nbytes for o, was, now in zip(outputs, pointers, landed) if was != now)
    return outputs, ({R.NOT_IN_PLACE: moved} if moved else {})


def _dispatch(program: Program, sources, call, show_progress: bool, outputs: list | None = None) -> list:
    """Calls every group (`call(group number, source shards, first buffer position)`), returns the
    results in order once they are ready; they are appended to `outputs` as they come, so a
    caller still holds those of the groups that ran when a later one fails."""
    outputs = [] if outputs is None else outputs
    bar = _progress(program, show_progress)
    start = 0
    arrays = sources.arrays
    try:
        for k, group in enumerate(program.groups):
            # Most sources are single-device arrays already on the group's device: taken as they are.
            shards = [arrays[name] if index is None else shard_data(arrays[name], index)
                      for name, index, _ in group.source_refs]
            for j, (_, _, device) in enumerate(group.source_refs):
                if device != group.device:
                    shards[j] = jax.device_put(shards[j], group.device)
            results = call(k, tuple(shards), start)
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
