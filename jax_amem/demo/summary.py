"""The table printed at the end of a run: reward curve, time per phase, memory, swap, check."""

from __future__ import annotations

import numpy as np

from .loop import LOGITS_TOLERANCE, PHASES, LoopResult
from .memory_view import mib, pause_effect

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values, width: int = 30) -> str:
    """`values` averaged into at most `width` buckets, one bar each, from the lowest bucket
    (the shortest bar) to the highest (the tallest)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return ""
    means = [bucket.mean() for bucket in np.array_split(values, min(width, values.size))]
    low, high = min(means), max(means)
    out = []
    for mean in means:
        level = (mean - low) / (high - low) if high > low else 0.0
        out.append(BARS[int(np.clip(round(level * (len(BARS) - 1)), 0, len(BARS) - 1))])
    return "".join(out)


def window(values) -> int:
    """How many iterations 'first' and 'last' average over: a tenth of the run, 1 to 10."""
    return max(1, min(10, len(values) // 10))


def first_and_last(rewards) -> tuple[float, float]:
    """Mean reward over the first and the last `window` iterations."""
    k = window(rewards)
    return float(np.mean(rewards[:k])), float(np.mean(rewards[-k:]))


def summary_table(result: LoopResult) -> str:
    p, lp, task = result.policy, result.loop, result.task
    n = len(result.rewards)
    lines = [
        f"jax-amem demo: GRPO on 'sort {task.digits} digits'; trainer JAX on {result.platform}, "
        f"{result.devices} device(s), FSDP; rollout {result.rollout_engine} on {result.rollout_device}",
        f"policy: Llama-style, {p.num_layers} layers, d={p.hidden_size}, {p.num_heads} heads "
        f"({p.num_kv_heads} kv), {mib(result.param_bytes)} float32 (+{mib(result.opt_state_bytes)} Adam); "
        f"{n} iterations x {lp.batch_size} samples; setup {result.setup_seconds:.1f} s",
        "",
    ]
    if n:
        k = window(result.rewards)
        first, last = first_and_last(result.rewards)
        lines.append(f"reward        first {k}: {first:.3f}   last {k}: {last:.3f}   "
                     f"(random policy ~{1 / p.vocab_size:.3f}, perfect 1)")
        lines.append(f"reward curve  {sparkline(result.rewards)}  (bucket means, lowest to highest bar)")
        lines.append("")
        lines.append(f"{'phase':<10}{'total s':>10}{'ms/iteration':>14}{'median ms':>11}{'share':>8}")
        totals = {ph: float(np.sum(result.phase_seconds[ph])) for ph in PHASES}
        whole = sum(totals.values()) or 1.0
        for ph in PHASES:
            median = float(np.median(result.phase_seconds[ph])) * 1e3
            lines.append(f"{ph:<10}{totals[ph]:>10.2f}{totals[ph] / n * 1e3:>14.2f}{median:>11.2f}"
                         f"{totals[ph] / whole:>8.1%}")
        lines.append("")
        lines.append(f"memory during rollout: {pause_effect(result.pauses)}")
        if result.memory_before is not None and result.memory_before.devices:
            for before, during in zip(result.memory_before.devices, result.memory_paused.devices):
                lines.append(f"  GPU {before.ordinal} process memory: {mib(before.process_bytes)} before "
                             f"the first pause, {mib(during.process_bytes)} during the rollout "
                             f"({before.process_source})")
        swaps = result.swaps
        seconds = float(np.median([s.seconds for s in swaps]))
        last = swaps[-1]
        ways = ", ".join(f"{name} {mib(n)}" for name, n in last.transports.items())
        lines.append(f"swap (jax_amem.swap): {len(swaps)} swaps of {mib(last.bytes)} into {last.buffers} "
                     f"tensors, median {seconds * 1e3:.2f} ms = {last.bytes / seconds / 1e9:.3f} GB/s "
                     f"({last.segments} segments, {last.launches} copy launches; {ways}); first swap "
                     f"(plans, compiles) {result.initial_swap.seconds:.2f} s")
    if result.checks:
        worst = max(result.checks, key=lambda c: c.relative)
        verdict = "OK" if result.checks_ok else "FAILED"
        lines.append(f"logits check: {verdict}: {len(result.checks)} checks (every {lp.check_every} "
                     f"iterations and at the end), worst max|jax - torch| / max|logit| = "
                     f"{worst.relative:.1e} at iteration {worst.iteration} (tolerance {LOGITS_TOLERANCE:.0e})")
    return "\n".join(lines)
