"""`demo --preset qwen3-1.7b --rollout vllm` (and qwen3-tiny): the real-size loop (loop.py) with
a vLLM engine as the rollout, its weights written by `jax_amem.vllm` (docs/vllm.md).

On a GPU the engine and the trainer share it (`jax_amem.vllm.Colocated`, vLLM's sleep mode at
SLEEP_LEVEL); on CPU vLLM has no sleep mode, and the engine stays resident beside the paused
trainer. One iteration:

  to rollout   wake the engine's weights, update them from the trainer (cast to bf16), pause
               the trainer, wake the KV cache (CPU: the update, the pause)
  rollout      vLLM samples the group's answers
  to trainer   the engine sleeps, the trainer resumes (CPU: the resume)
  train        one GRPO step (reward: the sort task)
  check        the first iteration: the engine's parameters against the trainer's cast by numpy

The switch is judged against its bound (switch_bound.py), measured in the same run.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax

import jax_amem

from .. import rollout as rollout_model
from ..vllm_rollout import vllm_policy
from ..loop import Trainer, _nbytes, _platform
from ..train import group_advantages
from . import bandwidth, switch_bound, vllm_engine
from .loop import ReserveCost, _gpu_ordinal, _Run
from .memory_peak import PeakSampler
from .presets import RealSizePreset
from .units import gb

# Colocated's default: the weights are discarded while the engine sleeps (the update writes
# every one); benchmarks/vllm_colocated.py measures level 1 beside it.
SLEEP_LEVEL = 2


@dataclasses.dataclass(frozen=True)
class VllmIteration:
    to_rollout: object            # jax_amem.vllm.SwitchReport (.update, .pause)
    to_trainer: object            # SwitchReport, .restored without its arrays
    rollout_seconds: float
    train_seconds: float
    reward: float
    loss: float
    peak_rollout: int | None      # device bytes in use while vLLM generates (None: no GPU)
    peak_train: int | None        # while the trainer trains


@dataclasses.dataclass
class VllmRealSizeResult:
    preset: RealSizePreset
    drop_state: bool
    platform: str
    devices: int
    colocated: bool               # sleep mode around the trainer's pause (a GPU); False: resident engine
    engine_dtype: str = ""
    param_bytes: int = 0
    opt_state_bytes: int = 0
    setup_seconds: float = 0.0
    reserve: ReserveCost | None = None
    ceilings: bandwidth.Ceilings | None = None
    bound: switch_bound.SwitchBound | None = None
    first_update: object = None   # VllmUpdateReport (plans and compiles)
    iterations: list = dataclasses.field(default_factory=list)
    engine_checks: list = dataclasses.field(default_factory=list)

    @property
    def checks_ok(self) -> bool:
        return bool(self.engine_checks) and all(c.ok for c in self.engine_checks)

    def medians(self) -> tuple[dict, dict]:
        """median_parts of the switches to the rollout and back."""
        return (switch_bound.median_parts([i.to_rollout for i in self.iterations]),
                switch_bound.median_parts([i.to_trainer for i in self.iterations]))


def timed(parts: dict, name: str, run):
    """run(), its seconds in parts[name]."""
    start = time.perf_counter()
    result = run()
    parts[name] = time.perf_counter() - start
    return result


class _VllmRun(_Run):
    """loop._Run with vLLM as the rollout: its own set-up and iteration."""

    def set_up(self, result: VllmRealSizeResult) -> None:
        import jax_amem.vllm as jv

        preset, start = self.preset, time.perf_counter()
        self.trainer = Trainer(preset.policy, preset.loop, preset.task)
        result.param_bytes, result.opt_state_bytes = _nbytes(self.trainer.params), _nbytes(self.trainer.opt_state)
        self.log(f"trainer: {gb(result.param_bytes)} of float32 parameters + {gb(result.opt_state_bytes)} "
                 f"of Adam state ({time.perf_counter() - start:.1f} s)")
        reservation = jax_amem.reserve(**self.tagged())
        self.llm = vllm_engine.start(preset.policy, preset.rollout_dtype, on_gpu=result.colocated,
                                     max_num_seqs=preset.loop.batch_size)
        self.engine = jv.connect(self.llm, self.trainer.params, family="qwen3", cast=preset.rollout_dtype)
        result.engine_dtype = preset.rollout_dtype
        result.first_update = self.engine.update(self.trainer.params)   # plans and compiles: outside the loop
        self.colocated = jv.Colocated(self.engine, level=SLEEP_LEVEL) if result.colocated else None
        reservation.wait()
        result.reserve = ReserveCost(reservation.bytes, reservation.pool_seconds, reservation.compile_seconds)
        ceil = result.ceilings = bandwidth.measure(rollout_model.torch_device(), result.colocated)
        result.bound = switch_bound.SwitchBound(_nbytes(self.tagged()["keep"]), self.engine.bytes,
                                                ceil.pinned_down_gb_s, ceil.pinned_up_gb_s, ceil.device_copy_gb_s)
        result.setup_seconds = time.perf_counter() - start
        self.log(f"set-up {result.setup_seconds:.1f} s: vLLM engine {preset.rollout_dtype}"
                 f"{f', sleep mode level {SLEEP_LEVEL}' if result.colocated else ', resident (no sleep mode)'}, "
                 f"first update {result.first_update.seconds:.2f} s, reserve() staged {gb(reservation.bytes)}")

    # -- the two switches: Colocated's on a GPU, the same parts without sleep mode on CPU
    def to_rollout(self):
        report = self._to_rollout(self.trainer.params, self.tagged())
        self.trainer.params = self.trainer.opt_state = None   # deleted by the pause
        return report

    def _to_rollout(self, params, tagged: dict):
        if self.colocated is not None:
            return self.colocated.to_rollout(params, **tagged)
        from jax_amem.vllm import SwitchReport

        parts, start = {}, time.perf_counter()
        update = timed(parts, "update", lambda: self.engine.update(params))
        pause = timed(parts, "pause trainer", lambda: jax_amem.pause(**tagged))
        return SwitchReport("rollout", time.perf_counter() - start, parts, update=update, pause=pause)

    def to_trainer(self):
        if self.colocated is not None:
            return self.colocated.to_trainer()
        from jax_amem.vllm import SwitchReport

        parts, start = {}, time.perf_counter()
        restored = timed(parts, "resume trainer", jax_amem.resume)
        return SwitchReport("trainer", time.perf_counter() - start, parts, restored=restored)

    def vllm_iteration(self, iteration: int, result: VllmRealSizeResult) -> VllmIteration:
        preset, task = self.preset, self.preset.task
        prompts = self.prompts()
        expected = vllm_engine.expected_tensors(self.trainer.params, preset.policy) if iteration == 0 else None
        up = self.to_rollout()
        if expected is not None:
            result.engine_checks.append(vllm_engine.check(self.llm, expected, iteration))
        with self.sampler.window() as rolling:
            began = time.perf_counter()
            tokens = vllm_engine.generate(self.llm, prompts, task.answer_length,
                                          seed=preset.loop.seed * 100_003 + iteration)
            rollout_seconds = time.perf_counter() - began
        down = self.to_trainer()
        self.untag(down.restored)
        rewards = task.rewards(prompts, tokens[:, task.prompt_length:])
        advantages = group_advantages(rewards, preset.loop.group_size)
        with self.sampler.window() as training:
            began = time.perf_counter()
            loss = self.trainer.step(tokens, advantages)
            train_seconds = time.perf_counter() - began
        down = dataclasses.replace(down, restored=dataclasses.replace(down.restored, keep=None, drop=None))
        return VllmIteration(up, down, rollout_seconds, train_seconds, float(rewards.mean()), loss,
                             rolling.peak, training.peak)


def run(preset: RealSizePreset, *, drop_state: bool = False, iterations: int | None = None,
        log: Callable[[str], None] = lambda line: None) -> VllmRealSizeResult:
    """The preset's loop with vLLM as the rollout: set-up, `iterations` (default: the preset's)
    iterations, the engine check after the first update."""
    if iterations is not None:
        preset = dataclasses.replace(preset, loop=dataclasses.replace(preset.loop, iterations=iterations))
    if preset.loop.iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {preset.loop.iterations}")
    on_gpu = rollout_model.torch_device().type == "cuda"
    # vLLM-CPU's attention takes heads of 64 or more: qwen3-tiny's (16) are widened, on a GPU too
    # (one engine shape for the preset); qwen3-1.7b's (128) stay.
    preset = dataclasses.replace(preset, policy=vllm_policy(preset.policy))
    result = VllmRealSizeResult(preset, drop_state, _platform(), len(jax.devices()), colocated=on_gpu)
    with PeakSampler(_gpu_ordinal()) as sampler:
        state = _VllmRun(preset, drop_state, sampler, log)
        state.set_up(result)
        for iteration in range(preset.loop.iterations):
            record = state.vllm_iteration(iteration, result)
            result.iterations.append(record)
            log(f"iteration {iteration + 1}/{preset.loop.iterations}: {record.to_rollout}; rollout "
                f"{record.rollout_seconds:.2f} s; {record.to_trainer}; train {record.train_seconds:.2f} s, "
                f"reward {record.reward:.3f}")
            if iteration == 0:
                c = result.engine_checks[0]
                log(f"  engine check: {'OK' if c.ok else 'FAILED'}: {len(c.compared)} tensors bit-exact"
                    + (f"; differ: {', '.join(c.mismatched[:5])}" if c.mismatched else ""))
    return result
