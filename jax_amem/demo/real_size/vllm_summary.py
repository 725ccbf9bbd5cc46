"""The table printed at the end of a real-size run with `--rollout vllm` (vllm_loop.py): the
switch's parts against its bound, memory in each phase, the engine check, the reward; and the
same figures as JSON (`--json PATH`)."""

from __future__ import annotations

import json

from . import switch_bound
from .summary import parameters
from .units import count, gb
from .vllm_loop import SLEEP_LEVEL, VllmRealSizeResult

FORMAT = 1  # bumped when a key changes meaning


def summary_table(result: VllmRealSizeResult) -> str:
    p, preset, ceil, bound = result.preset.policy, result.preset, result.ceilings, result.bound
    its = result.iterations
    state = "Adam state dropped at each pause (it comes back zeroed), parameters kept" if result.drop_state \
        else "parameters and Adam state kept"
    engine = (f"sleep mode level {SLEEP_LEVEL}, colocated with the trainer (jax_amem.vllm.Colocated)"
              if result.colocated else "resident beside the paused trainer (vLLM-CPU has no sleep mode)")
    to_rollout, to_trainer = result.medians()
    lines = [
        f"jax-amem demo, preset {preset.name}, rollout vLLM: Qwen3-style policy, {p.num_layers} layers, "
        f"d={p.hidden_size}, {p.num_heads} heads ({p.num_kv_heads} kv) of {p.head_dim}, MLP {p.intermediate_size}, "
        f"vocabulary {p.vocab_size}: {count(parameters(p))} parameters",
        f"trainer: JAX on {result.platform}, {result.devices} device(s); {gb(result.param_bytes)} float32 parameters "
        f"+ {gb(result.opt_state_bytes)} Adam; {state} in the {'pinned' if ceil.pinned else 'staging'} pool",
        f"rollout: vLLM in this process, {result.engine_dtype}, {engine}; {gb(bound.engine_bytes)} of weights "
        f"written per update (first update, which plans and compiles: {result.first_update.seconds:.2f} s)",
        f"set-up {result.setup_seconds:.1f} s; reserve(): {gb(result.reserve.bytes)} of staging pool, outside "
        "the switch",
        f"ceilings measured in this run: {'pinned' if ceil.pinned else 'host (not pinned: no GPU)'} copy "
        f"{ceil.pinned_down_gb_s:.1f} GB/s device->host, {ceil.pinned_up_gb_s:.1f} GB/s host->device; device copy "
        f"{ceil.device_copy_gb_s:.1f} GB/s",
        "",
        switch_bound.table(f"the switch: median of {len(its)} iteration(s), seconds",
                           switch_bound.rows(to_rollout, to_trainer, bound)),
        "  " + switch_bound.bound_line(bound),
        "",
    ] + memory_lines(result) + [""] + check_lines(result)
    return "\n".join(lines)


def memory_lines(result: VllmRealSizeResult) -> list[str]:
    its = result.iterations
    if not result.colocated:
        return ["memory: no GPU here: the engine stays resident and a pause copies the trainer to host memory; "
                "device figures need a GPU run"]
    freed = [i.to_rollout.pause.bytes_freed for i in its]
    return [f"memory: each pause freed {gb(min(freed))} to {gb(max(freed))} of device memory (trainer state "
            f"{gb(result.param_bytes + result.opt_state_bytes)}); peak device memory in use (cuMemGetInfo, all "
            "processes):",
            f"  while vLLM generates (trainer paused): {gb(max(i.peak_rollout for i in its))}",
            f"  while the trainer trains (engine asleep): {gb(max(i.peak_train for i in its))}"]


def check_lines(result: VllmRealSizeResult) -> list[str]:
    lines = []
    for c in result.engine_checks:
        lines.append(f"engine check (iteration {c.iteration}, after its update): {'OK' if c.ok else 'FAILED'}: "
                     f"{len(c.compared)} of the engine's parameters ({c.dtype}; the embedding, the final norm, the "
                     "first and last layers) bit-exact against the trainer's cast by numpy"
                     + (f"; differ: {', '.join(c.mismatched[:5])}" if c.mismatched else "")
                     + (f"; {len(c.packed)} linear weights not readable (vLLM-CPU repacks them into its GEMM's "
                        "layout)" if c.packed else ""))
    rewards = [i.reward for i in result.iterations]
    lines.append(f"reward: first {rewards[0]:.3f}, last {rewards[-1]:.3f} over {len(rewards)} iteration(s)"
                 + (" (a systems preset: not expected to rise)" if result.preset.systems_preset else ""))
    return lines


def figures(result: VllmRealSizeResult) -> dict:
    to_rollout, to_trainer = result.medians()
    bound, ceil = result.bound, result.ceilings
    return dict(
        format=FORMAT, preset=result.preset.name, rollout="vllm", platform=result.platform,
        colocated=result.colocated, sleep_level=SLEEP_LEVEL if result.colocated else None,
        param_bytes=result.param_bytes, opt_state_bytes=result.opt_state_bytes, engine_bytes=bound.engine_bytes,
        setup_seconds=result.setup_seconds, first_update_seconds=result.first_update.seconds,
        ceilings=dict(pinned_down_gb_s=ceil.pinned_down_gb_s, pinned_up_gb_s=ceil.pinned_up_gb_s,
                      device_copy_gb_s=ceil.device_copy_gb_s, pinned=ceil.pinned),
        switch=[dict(part=label, seconds=seconds, bound_seconds=b)
                for label, seconds, b in switch_bound.rows(to_rollout, to_trainer, bound)],
        iterations=[dict(to_rollout=i.to_rollout.parts, to_trainer=i.to_trainer.parts,
                         rollout_seconds=i.rollout_seconds, train_seconds=i.train_seconds, reward=i.reward,
                         peak_rollout=i.peak_rollout, peak_train=i.peak_train) for i in result.iterations],
        checks=dict(ok=result.checks_ok, engine=[dict(iteration=c.iteration, ok=c.ok, compared=list(c.compared),
                                                      mismatched=list(c.mismatched), packed=list(c.packed))
                                                 for c in result.engine_checks]),
    )


def write(result: VllmRealSizeResult, path: str) -> None:
    with open(path, "w") as f:
        json.dump(figures(result), f, indent=1)
        f.write("\n")
