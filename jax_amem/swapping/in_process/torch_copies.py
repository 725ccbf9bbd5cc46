"""Whole-tensor copies into PyTorch tensors that PyTorch makes itself: a destination buffer that
is one plain copy (no transpose, no cast) of a whole single-device source of at least MIN_BYTES,
on the same GPU, is written with `tensor.copy_(torch.from_dlpack(source))` on PyTorch's current
stream instead of inside the XLA call.

Why: on the H200 the same driver copies issued from inside an XLA executable ran 10-30% below
PyTorch's own `copy_` of the same bytes (4 x 512 MiB: 72% of the device copy against 96% for a
per-tensor `copy_` loop reading the JAX arrays through DLPack; 4 x 2 GiB: 85% against 99%;
benchmarks/swap.py, docs/benchmarks.md). The DLPack import costs some 20 us of host time per
tensor, hidden behind the previous copy for tensors this large. Ordering: `torch.from_dlpack`
passes PyTorch's stream to JAX's `__dlpack__`, which makes that stream wait until the array is
ready; the JAX view is only read. The swap synchronises PyTorch's stream before it returns.
"""

from __future__ import annotations

import numpy as np

from ...reshard.plan_data import Plan

MIN_BYTES = 64 << 20
PLATFORMS = ("gpu",)   # where the copies go to PyTorch (a module attribute: tests add "cpu")


def whole_copies(plan: Plan, group) -> dict[int, int]:
    """{buffer position: source operand} for the scheduled group's buffers PyTorch copies
    (module docstring); `group.targets[position]` is the buffer's (address, bytes)."""
    if group.device.platform not in PLATFORMS:
        return {}
    out = {}
    for position, steps in enumerate(group.steps):
        nbytes = group.targets[position][1]
        if len(steps) != 1 or nbytes < MIN_BYTES:
            continue
        step = steps[0]
        name, perm, dtype = plan.views[step.view]
        src_name, index, device = group.source_refs[step.source]
        layout = plan.src_layouts[name]
        table = np.asarray(step.segments).reshape(-1, 3)
        if (index is None and device == group.device and tuple(perm) == tuple(range(len(perm)))
                and plan.affine(step.view) is None
                and np.dtype(dtype) == layout.dtype and len(table) == 1 and tuple(table[0]) == (0, 0, nbytes)
                and int(np.prod(layout.shape, dtype=np.int64)) * layout.dtype.itemsize == nbytes):
            out[position] = step.source
    return out


def run(group, shards, tensors) -> None:
    """Queues the group's PyTorch copies (shards: the group's source operands, in order;
    tensors: the destination's, by name)."""
    import torch

    with torch.no_grad():
        for position, slot in group.torch_copies.items():
            name, _ = group.buffers[position]
            # `.data`: the same memory under a version counter of its own, so the copy, like the
            # XLA call's writes by address, leaves the tensor's version alone: the swap bumps it
            # once for every tensor (before_writing), and repeat.py reads it back after that
            tensors[name].data.view(-1).copy_(torch.from_dlpack(shards[slot]).view(-1))


def synchronize(program) -> None:
    """Waits for PyTorch's current stream on every GPU where a copy was queued."""
    import torch

    for index in sorted({g.device.local_hardware_id for g in program.groups
                         if g.torch_copies and g.device.platform == "gpu"}):
        torch.cuda.current_stream(index).synchronize()
