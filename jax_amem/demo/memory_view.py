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


LIVE = object()  # array_bytes_by_device(LIVE): every live jax.Array


def array_bytes_by_device(tree) -> dict:
    """{device: bytes} of the arrays in `tree` (every live jax.Array for LIVE), any platform.

    Each device buffer counts once: reading `addressable_shards[i].data` makes (and caches)
    a single-device array per shard, and `jax.live_arrays()` lists those as well.
    """
    leaves = jax.live_arrays() if tree is LIVE else jax.tree_util.tree_leaves(tree)
    out: dict = {}
    seen = set()
    for x in leaves:
        if not isinstance(x, jax.Array) or x.is_deleted():
            continue
        for shard in x.addressable_shards:
            try:
                buffer = (shard.device, shard.data.unsafe_buffer_pointer())
            except Exception:  # no pointer to compare (e.g. an empty array): count it
                buffer = (shard.device, id(shard.data))
            if buffer not in seen:
                seen.add(buffer)
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


def would_free(keep=None, drop=None, *, explain: bool = True) -> str:
    """What `jax_amem.pause(keep=keep, drop=drop)` would free now, per device, in words.
    explain=False leaves out the sentence on what a pause does without a GPU."""
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
        everything = array_bytes_by_device(LIVE)
        if explain:
            lines.append(f"no GPU ({report.note}): host-side figures. A pause copies the kept arrays "
                         "to host staging and deletes kept and dropped arrays; there is no device "
                         "memory to return to a driver.")
        devices = sorted({d.platform for d in everything}) or ["no"]
        lines.append(f"arrays on {len(everything)} {'/'.join(devices)} device(s): kept "
                     f"{mib(sum(kept.values()))}, dropped {mib(sum(dropped.values()))}, all live "
                     f"{mib(sum(everything.values()))} (largest on one device: "
                     f"{mib(max(everything.values(), default=0))})")
    lines += communicator_lines()
    lines.append(str(report.pool))
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


def example_cycle(seed: int = 0) -> str:
    """Builds the demo's trainer state (FSDP parameters + Adam state), says what pausing it would
    free, pauses, and says what the pause did; resumes before returning."""
    from .config import QUICK
    from .loop import Trainer
    from .task import SortTask

    policy, loop = QUICK
    trainer = Trainer(policy, loop, SortTask())
    state = (trainer.params, trainer.opt_state)
    lines = ["the demo's trainer state (parameters + Adam state, FSDP over "
             f"{len(jax.devices())} device(s)): what pausing it would free",
             would_free(keep=state, explain=False)]
    with jax_amem.paused(keep=state) as paused:
        del state
        trainer.params = trainer.opt_state = None
        lines += ["while paused:", would_free(explain=False)]
    lines.append(f"the pause: {pause_effect([paused.info])}; took {paused.info.seconds * 1e3:.1f} ms, "
                 f"resume {paused.restored.seconds * 1e3:.1f} ms")
    return "\n".join(lines)
