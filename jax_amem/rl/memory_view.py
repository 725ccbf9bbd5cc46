"""What a pause frees, in words: shared by `python -m jax_amem report`, the demo's summary
and the notebooks.

On a GPU the figures are the driver's (`jax_amem.memory_report`, `PauseInfo`);
on XLA CPU devices there is no device memory to give back, so the text gives the
host-side figures (bytes of the arrays, bytes copied to the staging pool) and says so.
"""

from __future__ import annotations

import jax

import jax_amem


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def array_bytes_by_device(tree=None) -> dict:
    """{device: bytes} of the arrays in `tree` (all live jax.Arrays when None), every platform."""
    leaves = jax.live_arrays() if tree is None else jax.tree_util.tree_leaves(tree)
    out: dict = {}
    for x in leaves:
        if isinstance(x, jax.Array) and not x.is_deleted():
            for shard in x.addressable_shards:
                out[shard.device] = out.get(shard.device, 0) + shard.data.nbytes
    return out


def communicator_lines() -> list[str]:
    """One line per NCCL communicator jax_amem tracks, or why there are none."""
    if not jax_amem.nccl.is_installed():
        return [f"NCCL communicators: none tracked (interposer not active: {jax_amem.nccl.status()})"]
    comms = jax_amem.nccl.communicators()
    if not comms:
        return ["NCCL communicators: none in this process (XLA creates them for multi-GPU collectives)"]
    lines = [f"NCCL communicators: {len(comms)}"]
    for c in comms:
        freed = mib(c.bytes_freed) if c.bytes_freed >= 0 else "not measured yet"
        lines.append(f"  {c.id:>3} {c.owner:>8} rank {c.rank}/{c.nranks} GPU {c.device} {c.state:>7} "
                     f"last freed {freed}  {c.key}")
    return lines


def would_free(keep=None, drop=None) -> str:
    """What `jax_amem.pause(keep=keep, drop=drop)` would free now, per device, in words."""
    report = jax_amem.memory_report(keep=keep, drop=drop, measure_context=False)
    lines = []
    if report.devices:
        lines.append(f"{'GPU':<5}{'arrays kept':>14}{'arrays dropped':>16}{'pool (idle)':>14}{'NCCL':>12}"
                     f"{'= freed':>14}{'stays: untagged':>17}{'process':>14}")
        for d in report.devices:
            c = d.categories
            freed = c["arrays kept"] + c["arrays dropped"] + c["allocator pool (idle)"] + c["NCCL"]
            lines.append(f"{d.ordinal:<5}{mib(c['arrays kept']):>14}{mib(c['arrays dropped']):>16}"
                         f"{mib(c['allocator pool (idle)']):>14}{mib(c['NCCL']):>12}{mib(freed):>14}"
                         f"{mib(c['arrays untagged']):>17}{mib(d.process_bytes):>14}")
        lines.append(f"allocator: {report.allocator} (the pool goes back to the driver only under cuda_async)")
    else:
        kept, dropped = array_bytes_by_device(keep), array_bytes_by_device(drop)
        everything = array_bytes_by_device()
        lines.append(f"no GPU ({report.note}): host-side figures. A pause copies the kept arrays to "
                     "host staging and deletes kept and dropped arrays; there is no device memory "
                     "to return to a driver.")
        for device in sorted(everything, key=lambda d: d.id):
            lines.append(f"  {device}: kept {mib(kept.get(device, 0))}, dropped "
                         f"{mib(dropped.get(device, 0))}, all live arrays {mib(everything[device])}")
    lines += communicator_lines()
    lines.append(f"host staging pool: {report.pool}")
    return "\n".join(lines)


def pause_effect(infos) -> str:
    """One line on what the pauses of a run did (the first is cold: the staging pool grows)."""
    infos = list(infos)
    if not infos:
        return "no pause"
    last = infos[-1]
    where = ", ".join(f"GPU {o}: {mib(last.device_free_after[o] - last.device_free_before[o])}"
                      for o in sorted(last.device_free_after))
    freed = (f"device memory freed (driver): {where}" if where else
             "no GPU: nothing to return to a driver (host-side figures)")
    if not where:
        pool = "no allocator pool to return"
    else:
        pool = "allocator pool returned" if last.pool_returned else f"allocator pool kept ({last.pool_note})"
    return (f"{freed}; {last.arrays_kept} arrays kept ({mib(last.bytes_kept)}), "
            f"{mib(last.bytes_offloaded)} copied to host at {last.offload_gb_per_s:.2f} GB/s; {pool}; "
            f"NCCL paused: {last.nccl_paused}")
