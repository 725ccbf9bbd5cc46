"""The direct launch: an eager swap into destinations written by address (this process's
PyTorch tensors, another process's tensors mapped through CUDA IPC) runs its copies from C++
on a CUDA stream, outside XLA's dispatch.

Why: one XLA call costs a fixed host time a copy of a few hundred microseconds cannot hide
(on the H200 about 140 us to dispatch 64 operands and 100 us more to see it done than a device
sync; 1.4 ms for 2000 operands: docs/benchmarks.md), while the copy kernel alone runs at the
device copy's speed. Launched from here, what a swap adds to its copy is its own host work: the
checks before it (run.py, repeat.py), the wait for new sources and the reading of their addresses.

What runs is what the custom call would run: the schedule's chunks (schedule.chunk_steps), their
rows checked by the same function (jax_amem.copy.address_rows: bounds, overlaps, alignment,
each destination inside its device allocation) and launched by the same C++ function
(src/copy/direct_launch.h: rows of at least jax_amem.copy.BULK_BYTES as one driver copy each,
the others as one kernel launch per chunk). A program's rows are checked and put on the device
once, on its first run (`core.copy.DirectCopy`, one per group); a swap passes only the sources'
addresses, which travel with the kernel launch (nothing uploaded per swap). The addresses are
kept between swaps: a source that is the same live array as last time keeps its entry, and
only the sources JAX gave new buffers (a training step's outputs, new LoRA adapters beside
frozen weights) are awaited and read again, in one native call (`core.copy.refresh_sources`,
src/bindings/source_addresses.cc): no Python per array. A repeat swap (repeat.py) runs the same
code inside its one native check of its inputs and hands `launch` the addresses it read.

Ordering: before, the new sources are awaited on the host, all at once (one batched
block_until_ready); their addresses are read after. The copies run on PyTorch's current stream
of the destination device (work PyTorch queued there, a rollout still reading the old weights,
comes first; its next kernels come after), or, for destinations PyTorch does not own here (CUDA
IPC, where the rollout said it is idle), on a stream of this process. After, the swap waits for
that stream before returning, as it waited for XLA's: PyTorch work issued after `swap` returns,
on any stream, sees the new values, and the sources stay referenced until the copy is done.
On the CPU the same rows run in the CPU loop, synchronously.

Which programs: the address route, whose every group reads whole single-device sources on
its own device through plain views, views the fused transpose-and-cast copy reads itself
(fused_views.py: a batched 2-D transpose and/or a cast, run by src/copy/transpose.h in the same
launch sequence, checked by the same address_rows as rows of the view's elements) or views with
constant steps the affine kernel reads itself (direct_affine.py: not transposed, cast or not;
the affine rows of the custom call's route, in the same launch sequence), or transposed ones
the fused copy reads running the same programs of steps (fused_views.stepped: MaxText's scaled
query kernel); other views are arrays XLA must make, so their programs keep the XLA call), on a GPU of a build with the
CUDA kernels, or on the CPU. The choice is made once per program, on its first run: JAX_AMEM_SWAP_DIRECT=0 (or
`ENABLED = False` here) keeps programs made after it in XLA; any other value than 0 or 1 is a
SwapError. The custom calls stay for everything else (other transforms, JAX destinations by
donation, staged sources, swaps inside jit).
"""

from __future__ import annotations


import jax
import numpy as np

from ... import _jax_compat
from ... import settings
from ..._native import core
from ...copy import address_rows, one_buffer_rows
from ..errors import SwapError
from . import deferred_wait, direct_affine, fused_views
from .schedule import _transforms, chunk_steps

ENV = "JAX_AMEM_SWAP_DIRECT"
ENABLED = True

_await = _jax_compat.batched_wait()  # one C call that waits for many arrays


def enabled() -> bool:
    """Whether eager swaps take the direct launch: JAX_AMEM_SWAP_DIRECT when set to 1 or 0,
    else ENABLED; any other value is a SwapError saying what each value does."""
    try:
        return settings.flag(ENV, bool(ENABLED))
    except settings.SettingError as error:
        raise SwapError(f"{error} (1: launch eager swaps by address outside XLA; 0: always through XLA's "
                        "custom calls); nothing was written") from error


def plan_for(program):
    """The program's DirectProgram, made on its first run and kept on it, or None where it runs
    in XLA (module docstring). A refusal of its rows raises before anything is written."""
    if program.direct is None:
        program.direct = DirectProgram.make(program) if eligible(program) else False
        if program.direct:  # its reports count what this launch runs, not what XLA's route would
            program.launches = sum(c.launches for c in program.direct.copies)
    return program.direct or None


def eligible(program) -> bool:
    if program.route != "addresses" or not enabled():
        return False
    plan = program.plan
    for group in program.groups:
        if not runs_on(group.device):
            return False
        if any(index is not None or device != group.device for _, index, device in group.source_refs):
            return False  # a shard of a sharded array, or a source staged from another device first
        if not all(reads_view(plan, v) for v in {step.view for steps in group.steps for step in steps}):
            return False  # a view only XLA makes (other permutations, conversions neither kernel has)
        if any(not direct_affine.whole_elements(plan, step.view, step.segments) if plan.affine(step.view) is not None
               else _transforms(plan, step.view) and fused_views.rows(plan, step.view,
                                                                      one_buffer_rows(step.segments)) is None
               for steps in group.steps for step in steps):
            return False  # a row that starts or ends inside an element of its view
    return True


def runs_on(device) -> bool:
    """Whether the direct launch can run on `device`: the CPU, or a GPU of a build with the CUDA kernels."""
    platform = device.platform
    return platform == "cpu" or (platform == "gpu" and core.copy.have_cuda_kernels())


def reads_view(plan, view: int) -> bool:
    """Whether the direct launch reads plan view `view` straight from its whole source: a plain
    one, one the fused transpose-and-cast copy reads, or one with constant steps the affine rows
    read (direct_affine.covers); any other view is an array XLA must make first."""
    if plan.affine(view) is not None:
        return direct_affine.covers(plan, view)
    return not _transforms(plan, view) or fused_views.covers(plan, view)


class DirectProgram:
    """Per group of a program: its DirectCopy (rows on the device) and where it runs."""

    def __init__(self, copies: list, ordinals: list, nbytes: list):
        self.copies = copies       # per group, core.copy.DirectCopy
        self.ordinals = ordinals   # per group, the CUDA ordinal, or -1 on the CPU
        self.nbytes = nbytes       # per group, destination bytes (the progress bar's steps)
        # Per group, the sources' addresses as the last swap read them (int64, one per operand),
        # kept with weak references to their arrays (core.copy.SourceAddresses): an operand that
        # is the same live array keeps its address (a jax.Array's buffer never moves, and the
        # callers refuse deleted arrays before this runs), so only the others are read again.
        self.pointers = [np.zeros(c.sources, np.int64) for c in copies]
        self.sources = [core.copy.SourceAddresses(p) for p in self.pointers]

    @classmethod
    def make(cls, program) -> "DirectProgram":
        plan = program.plan
        copies, ordinals = [], []
        for group in program.groups:
            gpu = group.device.platform == "gpu"
            ordinal = group.device.local_hardware_id if gpu else -1
            # Whole single-device sources: each operand is its source's whole layout.
            shapes = [jax.ShapeDtypeStruct(plan.src_layouts[name].shape, plan.src_layouts[name].dtype)
                      for name, _ in group.sources]
            chunks = []
            # Every buffer, those the XLA route leaves to PyTorch's copy_ too: here they are bulk rows.
            for chunk in chunk_steps(group.steps):
                operands = [operand for operand, _ in chunk.views]
                # A transposed or cast view's rows are checked as rows of the view's elements
                # (bounds, overlaps with every other row, alignment, allocation extents), then
                # run whole by the fused copy, not split into the plain rows.
                # A view with constant steps: its rows too, then run whole by the affine kernel,
                # or, transposed, by the fused copy running the steps (its program in the table).
                stepped = [k for k, (_, view) in enumerate(chunk.views) if plan.affine(view) is not None]
                fused = [k for k, (_, view) in enumerate(chunk.views) if _transforms(plan, view) and k not in stepped]
                avals = [fused_views.view_aval(plan, view) if k in fused or k in stepped else shapes[operand]
                         for k, (operand, view) in enumerate(chunk.views)]
                addresses, sizes, bulk, rows = address_rows(
                    avals, [group.targets[b][0] for b in chunk.buffers],
                    [group.targets[b][1] for b in chunk.buffers], chunk.rows, platform=group.device.platform)
                *affine, programs = direct_affine.rows(
                    plan, [(view, group.sources[operand][1]) for operand, view in chunk.views], chunk.rows,
                    [shapes[operand] for operand in operands], addresses, sizes,
                    [plan.dst_layouts[group.buffers[b][0]].dtype for b in chunk.buffers], group.device.platform)
                transposes = [fused_views.rows(plan, chunk.views[k][1], chunk.rows[chunk.rows[:, 0] == k],
                                               programs.get(k, -1))
                              for k in fused + sorted(programs)]
                whole = fused + stepped
                chunks.append((operands, addresses, sizes, bulk[~np.isin(bulk[:, 0], whole)],
                               rows[~np.isin(rows[:, 0], whole)],
                               np.concatenate(transposes) if transposes
                               else np.zeros((0, fused_views.ROW_COLUMNS), np.int64), *affine))
            source_bytes = [int(np.prod(s.shape, dtype=np.int64)) * np.dtype(s.dtype).itemsize for s in shapes]
            copies.append(core.copy.DirectCopy(ordinal, source_bytes, chunks))
            ordinals.append(ordinal)
        return cls(copies, ordinals, [g.nbytes for g in program.groups])

    def run(self, operands, destination, show_progress: bool = False) -> None:
        """Copies every group: `operands[k]` holds group k's source arrays in operand order.
        Returns when the copies are done; their failure to launch or run raises after every
        copy already launched has finished (nothing still writes when the error leaves)."""
        core.copy.refresh_sources(self.sources, operands, _await)  # every address read before the first launch
        self.launch(self.pointers, destination, show_progress)

    def launch(self, pointers: list, destination, show_progress: bool = False) -> None:
        """Copies every group with `pointers[k]`, group k's source addresses (int64, one per
        operand, read after the sources were awaited), on the streams the destination names
        (`before_launch`: what must finish first is ordered there), its bookkeeping
        (`while_launched`) done while the copies run; returns as run() does, or, inside
        `waits_deferred()`, once the copies are queued (the block waits for them)."""
        streams = self._streams(destination)
        bar = _progress(sum(self.nbytes)) if show_progress else None
        launched = []
        try:
            try:
                for copy, addresses, ordinal, nbytes in zip(self.copies, pointers, self.ordinals, self.nbytes):
                    stream = streams.get(ordinal, 0)
                    copy.run(addresses, stream)
                    launched.append((ordinal, stream))
                    if bar is not None:
                        _synchronize([(ordinal, stream)])
                        bar.update(nbytes)
            finally:
                destination.while_launched()
        except BaseException:
            try:
                _synchronize(launched)
            except Exception:  # noqa: BLE001 - the error being raised already says what went wrong
                pass
            raise
        finally:
            if bar is not None:
                bar.close()
        pending = deferred_wait.current()
        if pending is None:
            _synchronize(launched)
        else:
            pending.add(launched)

    def _streams(self, destination) -> dict:
        """{CUDA ordinal: stream} from the destination (by_address.ByAddress.before_launch:
        PyTorch's current stream for this process's tensors, one of ours over CUDA IPC); on the
        CPU no stream, the bookkeeping all the same."""
        return destination.before_launch(sorted({o for o in self.ordinals if o >= 0}))


def waits_deferred(enabled: bool = True):
    """A block inside which this thread's direct launches return once queued and are waited for
    when it ends (deferred_wait.py: the caller keeps the sources alive meanwhile)."""
    return deferred_wait.deferred(_synchronize, enabled)


def _synchronize(launched) -> None:
    for ordinal, stream in dict.fromkeys(launched):
        if ordinal >= 0:
            core.transport.synchronize_stream(stream, ordinal)


def _progress(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc="swap", leave=False)
