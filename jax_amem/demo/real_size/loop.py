"""The real-size loop: a Qwen3-style JAX trainer and a bf16 transformers rollout on one device.

Set-up: the trainer (parameters and Adam state, float32, FSDP over every device), then
`jax_amem.reserve()` (the pinned pool and resume's program, on background threads, outside
the switch), the rollout model (weights NaN until the first swap), the first swap (plans and
compiles), and the two ceilings (pinned copy, device copy) measured on this machine.

One iteration (the switch is pause + swap + resume):
  pause    the trainer's state leaves the device (`jax_amem.pause`): kept in the pinned pool,
           or with --drop-state the Adam state dropped (it comes back zeroed)
  rollout  the rollout model generates with its KV cache
  resume   the trainer's arrays come back (bit-identical when kept)
  train    one GRPO step (reward: the sort task)
  swap     `jax_amem.swap` writes the new parameters into the rollout's own tensors, in place,
           cast to bf16 by the rules (`rules.qwen3(source="flax", layout="hf")`)
  checks   the first iteration: every rollout parameter bit-exact against a numpy conversion;
           every `check_every` iterations and the last: the two models' logits
Then the baselines (baselines.py): (a) device_get + numpy + load_state_dict, (b) iterations
with no pause, both models resident.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import numpy as np

import jax_amem

from .. import rollout as rollout_model
from ..loop import Rollout, Trainer, _nbytes, _platform
from ..train import group_advantages
from . import bandwidth, baselines, checks
from .memory_peak import PeakSampler
from .presets import RealSizePreset
from .units import gb


@dataclasses.dataclass(frozen=True)
class Iteration:
    pause: object                 # PauseInfo
    resume: object                # Restored, its trees dropped (figures only)
    swap: object                  # SwapReport
    rollout_seconds: float
    train_seconds: float
    reward: float
    loss: float
    peak_iteration: int | None    # device bytes in use (None: no GPU)
    peak_rollout: int | None


@dataclasses.dataclass(frozen=True)
class ReserveCost:
    bytes: int
    pool_seconds: float           # pinning the pool (background thread)
    compile_seconds: float        # resume's allocation program (background thread)


@dataclasses.dataclass
class RealSizeResult:
    preset: RealSizePreset
    drop_state: bool
    platform: str
    devices: int
    rollout_device: str
    param_bytes: int = 0
    opt_state_bytes: int = 0
    rollout_bytes: int = 0
    setup_seconds: float = 0.0
    reserve: ReserveCost | None = None
    ceilings: bandwidth.Ceilings | None = None
    initial_swap: object = None
    iterations: list = dataclasses.field(default_factory=list)
    exact_checks: list = dataclasses.field(default_factory=list)
    logits_checks: list = dataclasses.field(default_factory=list)
    host_baseline: baselines.HostBaseline | None = None
    resident_baseline: baselines.ResidentBaseline | None = None

    @property
    def checks_ok(self) -> bool:
        return (bool(self.exact_checks) and all(c.ok for c in self.exact_checks)
                and bool(self.logits_checks) and all(c.ok for c in self.logits_checks))

    @property
    def on_gpu(self) -> bool:
        return self.rollout_device.startswith("cuda")


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def _gpu_ordinal() -> int | None:
    device = jax.devices()[0]
    return device.local_hardware_id if device.platform == "gpu" else None


class _Run:
    """One run's state: the two models, the task's randomness, the memory sampler."""

    def __init__(self, preset: RealSizePreset, drop_state: bool, sampler: PeakSampler,
                 log: Callable[[str], None]):
        self.preset, self.drop_state, self.sampler, self.log = preset, drop_state, sampler, log
        self.rng = np.random.default_rng(preset.loop.seed)
        task = preset.task
        check_prompts = task.prompts(np.random.default_rng(preset.loop.seed + 1), preset.check_sequences)
        self.check_tokens = np.concatenate([check_prompts, task.targets(check_prompts)], axis=1)

    # -- the trainer's state as pause and reserve take it: all kept, or Adam's dropped
    def tagged(self) -> dict:
        t = self.trainer
        return dict(keep=t.params, drop=t.opt_state) if self.drop_state else dict(keep=(t.params, t.opt_state))

    def untag(self, restored) -> None:
        if self.drop_state:
            self.trainer.params, self.trainer.opt_state = restored.keep, restored.drop
        else:
            self.trainer.params, self.trainer.opt_state = restored.keep

    def set_up(self, result: RealSizeResult) -> None:
        preset = self.preset
        start = time.perf_counter()
        self.trainer = Trainer(preset.policy, preset.loop, preset.task)
        result.param_bytes = _nbytes(self.trainer.params)
        result.opt_state_bytes = _nbytes(self.trainer.opt_state)
        self.log(f"trainer: {gb(result.param_bytes)} of float32 parameters + {gb(result.opt_state_bytes)} "
                 f"of Adam state ({time.perf_counter() - start:.1f} s)")
        reservation = jax_amem.reserve(**self.tagged())
        self.roll = Rollout(preset.policy, dtype=_torch_dtype(preset.rollout_dtype), params=self.trainer.params)
        result.rollout_device = str(next(self.roll.model.parameters()).device)
        result.rollout_bytes = sum(t.numel() * t.element_size() for t in self.roll.tensors.values())
        result.initial_swap = self.roll.load(self.trainer.params)
        reservation.wait()
        result.reserve = ReserveCost(reservation.bytes, reservation.pool_seconds, reservation.compile_seconds)
        result.ceilings = bandwidth.measure(rollout_model.torch_device(), _gpu_ordinal() is not None)
        result.setup_seconds = time.perf_counter() - start
        self.log(f"set-up {result.setup_seconds:.1f} s: rollout {preset.rollout_dtype} on "
                 f"{result.rollout_device}, first swap {result.initial_swap.seconds:.2f} s, reserve() "
                 f"staged {gb(reservation.bytes)} in {reservation.pool_seconds:.2f} s")

    # -- phases shared by the loop and the resident baseline
    def prompts(self) -> np.ndarray:
        loop = self.preset.loop
        return np.repeat(self.preset.task.prompts(self.rng, loop.prompts_per_iteration), loop.group_size, axis=0)

    def generate(self, prompts, iteration: int):
        with self.sampler.window() as window:
            began = time.perf_counter()
            tokens = self.roll.sample(prompts, self.preset.task.answer_length,
                                      seed=self.preset.loop.seed * 100_003 + iteration)
            seconds = time.perf_counter() - began
        return tokens, seconds, window.peak

    def learn(self, prompts, tokens):
        task = self.preset.task
        rewards = task.rewards(prompts, tokens[:, task.prompt_length:])
        advantages = group_advantages(rewards, self.preset.loop.group_size)
        began = time.perf_counter()
        loss = self.trainer.step(tokens, advantages)
        train_seconds = time.perf_counter() - began
        swap = self.roll.load(self.trainer.params)
        return float(rewards.mean()), loss, train_seconds, swap

    # -- the loop
    def paused_iteration(self, iteration: int) -> Iteration:
        prompts = self.prompts()
        with self.sampler.window() as whole:
            info = jax_amem.pause(**self.tagged())
            self.trainer.params = self.trainer.opt_state = None  # deleted by the pause
            tokens, rollout_seconds, rollout_peak = self.generate(prompts, iteration)
            restored = jax_amem.resume()
            self.untag(restored)
            reward, loss, train_seconds, swap = self.learn(prompts, tokens)
        figures = dataclasses.replace(restored, keep=None, drop=None)
        return Iteration(info, figures, swap, rollout_seconds, train_seconds, reward, loss, whole.peak,
                         rollout_peak)

    def checks(self, result: RealSizeResult, iteration: int) -> None:
        loop = self.preset.loop
        if iteration == 0:
            check = checks.exact_check(self.trainer.params, self.roll.model, self.preset.policy, iteration)
            result.exact_checks.append(check)
            self.log(f"  exact check: {'OK' if check.ok else 'FAILED'}: {check.tensors} tensors, "
                     f"{gb(check.bytes)} bit-exact against numpy ({check.seconds:.1f} s)"
                     + (f"; differ: {', '.join(check.mismatched[:5])}" if check.mismatched else ""))
        if (iteration + 1) % loop.check_every == 0 or iteration == loop.iterations - 1:
            check = checks.logits_check(self.trainer, self.roll, self.check_tokens, iteration,
                                        self.preset.rollout_dtype)
            result.logits_checks.append(check)
            self.log(f"  logits check: {'OK' if check.ok else 'FAILED'}: max|jax - torch| / max|logit| = "
                     f"{check.relative:.1e} (tolerance {check.tolerance:.0e})")

    def resident(self, iterations: int) -> baselines.ResidentBaseline:
        out = baselines.ResidentBaseline()
        try:
            for k in range(iterations):
                prompts = self.prompts()
                with self.sampler.window() as whole:
                    tokens, seconds, rollout_peak = self.generate(prompts, self.preset.loop.iterations + k)
                    self.learn(prompts, tokens)
                out.iterations += 1
                out.rollout_seconds.append(seconds)
                out.peak_rollout = _max(out.peak_rollout, rollout_peak)
                out.peak_iteration = _max(out.peak_iteration, whole.peak)
        except Exception as error:  # noqa: BLE001  (only out-of-memory is expected; others re-raise)
            if not baselines.is_out_of_memory(error):
                raise
            out.error = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        return out


def _max(a, b):
    return b if a is None else (a if b is None else max(a, b))


def run(preset: RealSizePreset, *, drop_state: bool = False, iterations: int | None = None,
        log: Callable[[str], None] = lambda line: None) -> RealSizeResult:
    """Runs the preset: set-up, `iterations` (default: the preset's) paused iterations, the two
    baselines. `log(line)` is called with a line of progress at each step."""
    if iterations is not None:
        preset = dataclasses.replace(preset, loop=dataclasses.replace(preset.loop, iterations=iterations))
    if preset.loop.iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {preset.loop.iterations}")
    result = RealSizeResult(preset, drop_state, _platform(), len(jax.devices()), "")
    with PeakSampler(_gpu_ordinal()) as sampler:
        state = _Run(preset, drop_state, sampler, log)
        state.set_up(result)
        for iteration in range(preset.loop.iterations):
            record = state.paused_iteration(iteration)
            result.iterations.append(record)
            log(f"iteration {iteration + 1}/{preset.loop.iterations}: pause {record.pause.seconds:.3f} s, "
                f"rollout {record.rollout_seconds:.2f} s, resume {record.resume.seconds:.3f} s, train "
                f"{record.train_seconds:.2f} s, swap {record.swap.seconds * 1e3:.1f} ms, reward {record.reward:.3f}")
            state.checks(result, iteration)
        result.host_baseline = baselines.host_copy_and_load(state.trainer.params, state.roll.model, preset.policy)
        log(f"baseline (a) device_get + numpy + load_state_dict: {result.host_baseline.seconds:.2f} s")
        result.resident_baseline = state.resident(preset.no_pause_iterations)
        resident = result.resident_baseline
        log(f"baseline (b) no pause: {resident.iterations} iteration(s)"
            + (f"; did not fit: {resident.error}" if resident.error else ""))
    return result
