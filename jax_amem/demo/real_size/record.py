"""A real-size run's figures as plain data (`--json PATH`): what the notebooks plot and
docs/figures/ keeps from a GPU run, beside the printed summary made from the same result."""

from __future__ import annotations

import json
import statistics

import jax

from .loop import RealSizeResult
from .summary import parameters, switch_rows

FORMAT = 1  # bumped when a key changes meaning


def _median(values):
    return statistics.median(values) if values else None


def _pause(info) -> dict:
    return dict(seconds=info.seconds, staging_seconds=info.staging_seconds,
                pinning_seconds=info.allocate_seconds, copy_seconds=info.copy_seconds,
                release_seconds=info.release_seconds, bytes_offloaded=info.bytes_offloaded,
                bytes_freed=info.bytes_freed)


def figures(result: RealSizeResult) -> dict:
    """Every figure of the summary, JSON-ready: seconds, bytes, GB/s; None where not measured."""
    its, ceil, host, resident = (result.iterations, result.ceilings, result.host_baseline,
                                 result.resident_baseline)
    device = jax.devices()[0]
    return dict(
        format=FORMAT,
        preset=result.preset.name,
        machine=dict(platform=result.platform, device_kind=device.device_kind, devices=result.devices,
                     rollout_device=result.rollout_device, jax=jax.__version__),
        parameters=parameters(result.preset.policy),
        param_bytes=result.param_bytes, opt_state_bytes=result.opt_state_bytes,
        rollout_bytes=result.rollout_bytes, rollout_dtype=result.preset.rollout_dtype,
        drop_state=result.drop_state,
        setup_seconds=result.setup_seconds,
        reserve=dict(bytes=result.reserve.bytes, pool_seconds=result.reserve.pool_seconds,
                     compile_seconds=result.reserve.compile_seconds),
        ceilings=dict(pinned_down_gb_s=ceil.pinned_down_gb_s, pinned_up_gb_s=ceil.pinned_up_gb_s,
                      device_copy_gb_s=ceil.device_copy_gb_s, pinned=ceil.pinned),
        switch=[dict(part=r["part"], seconds=r["seconds"], bound_seconds=r["bound"]) for r in switch_rows(result)],
        iterations=[dict(pause=_pause(i.pause), resume_seconds=i.resume.seconds, swap_seconds=i.swap.seconds,
                         rollout_seconds=i.rollout_seconds, train_seconds=i.train_seconds, reward=i.reward,
                         peak_iteration=i.peak_iteration, peak_rollout=i.peak_rollout) for i in its],
        first_swap_seconds=result.initial_swap.seconds,
        host_baseline=dict(seconds=host.seconds, get_seconds=host.get_seconds,
                           convert_seconds=host.convert_seconds, load_seconds=host.load_seconds),
        resident_baseline=dict(iterations=resident.iterations, error=resident.error,
                               rollout_seconds=_median(resident.rollout_seconds),
                               peak_iteration=resident.peak_iteration, peak_rollout=resident.peak_rollout),
        checks=dict(ok=result.checks_ok,
                    exact=[dict(iteration=c.iteration, ok=c.ok, tensors=c.tensors, bytes=c.bytes)
                           for c in result.exact_checks],
                    logits=[dict(iteration=c.iteration, ok=c.ok, relative=c.relative, tolerance=c.tolerance)
                            for c in result.logits_checks]),
    )


def write(result: RealSizeResult, path: str) -> None:
    with open(path, "w") as f:
        json.dump(figures(result), f, indent=1)
        f.write("\n")
