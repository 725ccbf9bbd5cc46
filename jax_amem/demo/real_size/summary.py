"""The table printed at the end of a real-size run: the switch against its ceilings, memory,
the two baselines, the checks, the reward."""

from __future__ import annotations

import statistics

from .loop import RealSizeResult
from .units import count, gb


def parameters(policy) -> int:
    """Parameter count of a Qwen3-style policy (what the trainer holds, tied head counted once)."""
    c = policy
    attention = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads) + 2 * c.head_dim
    layer = attention + 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size
    head = 0 if c.tie_embeddings else c.vocab_size * c.hidden_size
    return c.num_layers * layer + c.vocab_size * c.hidden_size + c.hidden_size + head


def _pause_parts(pause) -> str:
    """Where a pause's time went, so that a slow first pause says which part was slow."""
    return (f"staging {pause.staging_seconds:.4f} (pinning {pause.allocate_seconds:.4f}), copies "
            f"{pause.copy_seconds:.4f}, release {pause.release_seconds:.4f} s, {pause.collections} "
            "garbage collections")


def _median(values) -> float:
    return statistics.median(values) if values else float("nan")


def switch_rows(result: RealSizeResult) -> list[dict]:
    """pause, swap, resume and their sum: median seconds over the iterations, bytes, both bounds."""
    its, ceil = result.iterations, result.ceilings
    pause_bytes = its[-1].pause.bytes_offloaded
    resume_bytes = its[-1].resume.bytes_reloaded
    swap_written = its[-1].swap.bytes
    swap_traffic = result.param_bytes + swap_written   # each source byte read, each destination byte written
    device = ceil.device_copy_gb_s * 1e9
    rows = [
        dict(part="pause", seconds=_median([i.pause.seconds for i in its]), bytes=f"{gb(pause_bytes)} to host",
             pinned=pause_bytes / (ceil.pinned_down_gb_s * 1e9), device=pause_bytes / device, judged="pinned"),
        dict(part="swap", seconds=_median([i.swap.seconds for i in its]),
             bytes=f"{gb(result.param_bytes)} read, {gb(swap_written)} written",
             pinned=None, device=swap_traffic / 2 / device, judged="device"),
        dict(part="resume", seconds=_median([i.resume.seconds for i in its]), bytes=f"{gb(resume_bytes)} to device",
             pinned=resume_bytes / (ceil.pinned_up_gb_s * 1e9), device=resume_bytes / device, judged="pinned"),
    ]
    bound = rows[0]["pinned"] + rows[1]["device"] + rows[2]["pinned"]
    rows.append(dict(part="switch", seconds=sum(r["seconds"] for r in rows), bytes="", pinned=None,
                     device=None, judged="sum", bound=bound))
    for r in rows:
        r.setdefault("bound", r["pinned"] if r["judged"] == "pinned" else r["device"])
    return rows


def _seconds(value) -> str:
    return "" if value is None else f"{value:.4f}"


def summary_table(result: RealSizeResult) -> str:
    p, preset, ceil = result.preset.policy, result.preset, result.ceilings
    its = result.iterations
    samples = preset.loop.batch_size
    pool = "pinned pool" if ceil.pinned else "staging pool (host memory, not pinned: no GPU)"
    state = f"Adam state dropped at each pause (it comes back zeroed), parameters kept in the {pool}" \
        if result.drop_state else f"parameters and Adam state kept in the {pool}"
    lines = [
        f"jax-amem demo, preset {preset.name}: Qwen3-style policy, {p.num_layers} layers, d={p.hidden_size}, "
        f"{p.num_heads} heads ({p.num_kv_heads} kv) of {p.head_dim}, MLP {p.intermediate_size}, vocabulary "
        f"{p.vocab_size}{', tied embeddings' if p.tie_embeddings else ''}: {count(parameters(p))} parameters",
        f"trainer: JAX on {result.platform}, {result.devices} device(s), FSDP; {gb(result.param_bytes)} float32 "
        f"parameters + {gb(result.opt_state_bytes)} Adam = {gb(result.param_bytes + result.opt_state_bytes)}; {state}",
        f"rollout: transformers Qwen3ForCausalLM, {preset.rollout_dtype}, on {result.rollout_device}, "
        f"{gb(result.rollout_bytes)} of weights; {samples} samples x {preset.task.answer_length} tokens per "
        f"iteration, generated with its KV cache",
        f"set-up {result.setup_seconds:.1f} s; reserve(): {gb(result.reserve.bytes)} of staging pool in "
        f"{result.reserve.pool_seconds:.2f} s and resume's program compiled in {result.reserve.compile_seconds:.2f} s, "
        f"on background threads during set-up: outside the switch",
        f"ceilings measured in this run: {'pinned' if ceil.pinned else 'host (not pinned: no GPU)'} copy "
        f"{ceil.pinned_down_gb_s:.1f} GB/s device->host, {ceil.pinned_up_gb_s:.1f} GB/s host->device "
        f"({ceil.pinned_buffer / 2**20:.0f} MiB); device copy {ceil.device_copy_gb_s:.1f} GB/s "
        f"({ceil.device_buffer / 2**20:.0f} MiB, torch copy_)",
        "",
        f"the switch: median of {len(its)} iteration(s); bound = bytes / the ceiling's speed "
        "(pause, resume: pinned copy; swap: (bytes read + written) / 2 / device copy)",
        f"{'part':<8}{'seconds':>10}  {'bytes':<34}{'pinned bound':>13}{'device bound':>13}{'x bound':>9}",
    ]
    for r in switch_rows(result):
        ratio = r["seconds"] / r["bound"] if r["bound"] else float("nan")
        lines.append(f"{r['part']:<8}{r['seconds']:>10.4f}  {r['bytes']:<34}{_seconds(r['pinned']):>13}"
                     f"{_seconds(r['device']):>13}{ratio:>8.2f}x")
    first, later = its[0].pause, [i.pause for i in its[1:]]
    lines.append(f"  first pause {first.seconds:.4f} s" + (
        f" = {first.seconds / _median([i.seconds for i in later]):.2f}x the later ones" if later else "")
        + f"; pause parts (first / last): {_pause_parts(first)} / {_pause_parts(its[-1].pause)}")
    lines.append(f"  NCCL paused: {its[-1].pause.nccl_paused} (one process: XLA makes communicators for "
                 "multi-GPU collectives only)" if not its[-1].pause.nccl_paused else "  NCCL paused: True")
    lines += [""] + memory_lines(result) + [""] + baseline_lines(result) + [""] + check_lines(result)
    return "\n".join(lines)


def memory_lines(result: RealSizeResult) -> list[str]:
    its, resident = result.iterations, result.resident_baseline
    if not result.on_gpu:
        return ["memory: no GPU here: nothing goes back to a driver (a pause copies to host memory and "
                "deletes the arrays); device figures need a GPU run"]
    freed = [i.pause.bytes_freed for i in its]
    lines = [f"memory: each pause freed {gb(min(freed))} to {gb(max(freed))} of device memory (cuMemGetInfo "
             f"before and after; trainer state {gb(result.param_bytes + result.opt_state_bytes)})",
             "peak device memory in use (GPU 0, cuMemGetInfo, all processes, sampled every 5 ms):",
             f"  {'':<26}{'whole iteration':>16}{'during the rollout':>20}",
             f"  {'with the pause':<26}{gb(max(i.peak_iteration for i in its)):>16}"
             f"{gb(max(i.peak_rollout for i in its)):>20}"]
    if resident.fitted:
        lines.append(f"  {'no pause (baseline b)':<26}{gb(resident.peak_iteration):>16}{gb(resident.peak_rollout):>20}")
    else:
        lines.append(f"  no pause (baseline b): did not fit on this device ({resident.error})")
    return lines


def baseline_lines(result: RealSizeResult) -> list[str]:
    host, resident, its = result.host_baseline, result.resident_baseline, result.iterations
    swap = _median([i.swap.seconds for i in its])
    switch = switch_rows(result)[-1]["seconds"]
    lines = [f"baseline (a), what users do today: jax.device_get {host.get_seconds:.3f} s + numpy conversion "
             f"{host.convert_seconds:.3f} s + load_state_dict {host.load_seconds:.3f} s = {host.seconds:.3f} s; "
             f"jax_amem.swap {swap:.4f} s (baseline / swap = {host.seconds / swap:.1f}); the whole switch (pause + "
             f"swap + resume) {switch:.3f} s (baseline's weight copy alone / switch = {host.seconds / switch:.2f})"]
    if resident.fitted:
        rollout = _median([i.rollout_seconds for i in its])
        lines.append(f"baseline (b), no pause, both models resident: {resident.iterations} iteration(s), rollout "
                     f"median {_median(resident.rollout_seconds):.3f} s (with the pause: {rollout:.3f} s)")
    else:
        lines.append(f"baseline (b), no pause: did not fit ({resident.error}) after {resident.iterations} iteration(s)")
    return lines


def check_lines(result: RealSizeResult) -> list[str]:
    its, preset = result.iterations, result.preset
    rewards = [i.reward for i in its]
    lines = []
    for c in result.exact_checks:
        lines.append(f"exact check (iteration {c.iteration}): {'OK' if c.ok else 'FAILED'}: {c.tensors} rollout "
                     f"tensors, {gb(c.bytes)}, bit-exact against an independent numpy conversion of the trainer's "
                     "parameters" + (f"; differ: {', '.join(c.mismatched[:5])}" if c.mismatched else ""))
    if result.logits_checks:
        worst = max(result.logits_checks, key=lambda c: c.relative)
        verdict = "OK" if all(c.ok for c in result.logits_checks) else "FAILED"
        lines.append(f"logits check: {verdict}: {len(result.logits_checks)} check(s), worst max|jax - torch| / "
                     f"max|logit| = {worst.relative:.1e} at iteration {worst.iteration} (tolerance "
                     f"{worst.tolerance:.0e} for a {preset.rollout_dtype} rollout against float32 JAX)")
    lines.append(f"reward: first {rewards[0]:.3f}, last {rewards[-1]:.3f} over {len(rewards)} iteration(s)")
    if preset.systems_preset:
        lines.append(f"  a systems preset: {len(rewards)} iteration(s) of GRPO on a randomly initialised model "
                     "measure the switch; they cannot teach it the task, and the reward is not expected to rise "
                     "(the small preset, `--preset small`, is the one that learns)")
    return lines
