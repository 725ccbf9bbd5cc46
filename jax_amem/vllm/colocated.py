"""A JAX trainer and a vLLM engine taking turns on the same GPUs (`jax_amem.vllm.Colocated`).

The engine runs with vLLM's sleep mode (`vllm.LLM(..., enable_sleep_mode=True)`): its weights
and KV cache live in vLLM's own pool, which `llm.sleep()` unmaps and `llm.wake_up(tags=...)`
maps back. The trainer's memory is paused by jax-amem (`jax_amem.pause`: the arrays to pinned
host memory, XLA's pool and NCCL's buffers freed). One step of the loop:

    trainer phase   engine asleep (weights and KV cache unmapped), trainer on the GPU
    to_rollout      wake the weights -> update them from the trainer -> pause the trainer
                    -> wake the KV cache
    rollout phase   trainer paused, engine serving
    to_trainer      engine sleeps -> resume the trainer

Each switch checks its state first and refuses, with nothing changed, what would fault or
serve wrong weights: an update while the weights sleep (vLLM faults there), an update during a
generate, the KV cache woken while the weights sleep, a switch out of order, an engine started
without sleep mode, and a JAX that preallocates most of the GPU beside the engine.

Sleep level: every parameter the engine serves is written by the update, so the weights need
not be kept while the engine sleeps; `level=2` discards them (no copy to host at sleep, none
back at wake), `level=1` (vLLM's default) backs them up to host memory and copies them back
before the update overwrites them. A failed update leaves the engine refusing to serve
(docs/vllm.md, "Versions") either way; with level 2 the next complete update is the only way
back, as it is with level 1 once a group was written.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field

from .errors import VllmBackendError, VllmUpdateError
from . import readiness


@dataclass
class SwitchReport:
    """What one switch did and how long each part took (seconds)."""

    direction: str
    seconds: float
    parts: dict = field(default_factory=dict)   # part -> seconds, in the order they ran
    update: object = None                        # the VllmUpdateReport (to_rollout)
    pause: object = None                         # jax_amem.pause's PauseInfo (to_rollout)
    restored: object = None                      # jax_amem.resume's Restored (to_trainer)

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in self.parts.items())
        return f"switch to {self.direction} in {self.seconds * 1e3:.1f} ms ({parts})"


class Colocated:
    """A connected engine (`jax_amem.vllm.connect`) and the trainer of this process, switched.

    The engine is put to sleep here if it is awake (the loop starts in the trainer phase).
    `level` is its sleep level (2, the default: the weights are discarded while it sleeps; or
    1, vLLM's default: backed up to host memory; module docstring).

    `to_rollout(params, keep=..., drop=...)` wakes the weights, updates them from `params`,
    pauses the trainer (`keep`/`drop` as jax_amem.pause takes them: the arrays are deleted) and
    wakes the KV cache; `to_trainer()` puts the engine to sleep and resumes the trainer, its
    report's `.restored` holding jax_amem.resume's new arrays (`.keep`). The steps are also
    methods of their own, for a loop that orders them itself (the demo's rollout updates before
    it pauses, and generates, then sleeps, inside its pause): `wake_weights`, `update`,
    `wake_kv_cache`, `sleep`."""

    def __init__(self, engine, *, level: int = 2):
        llm = getattr(engine, "llm", None)
        if llm is None:
            raise VllmBackendError(f"Colocated takes the handle jax_amem.vllm.connect(llm, params, ...) returns, not "
                                   f"{type(engine).__name__}: connect to the engine first")
        if not readiness.sleep_mode(llm):
            raise VllmBackendError("Colocated needs an engine started with sleep mode: vllm.LLM(..., "
                                   "enable_sleep_mode=True); this one was started without it, so its memory "
                                   "cannot be freed for the trainer")
        if isinstance(level, bool) or not isinstance(level, numbers.Integral) or level not in (1, 2):
            raise VllmBackendError(f"Colocated(level={level!r:.40}): vLLM's sleep level is 1 (weights backed up "
                                   "to host memory) or 2 (weights discarded: every one is written by the update)")
        preallocated = readiness.xla_preallocation()
        if preallocated is not None:
            raise VllmBackendError(f"Colocated: {preallocated}")
        self.engine, self.llm, self.level = engine, llm, int(level)
        if self.asleep() != ["kv_cache", "weights"]:
            self.sleep()

    def asleep(self) -> list[str]:
        """The engine's memory tags asleep now ("weights", "kv_cache"), as its workers say."""
        return self.engine.asleep()

    # --- the steps ----------------------------------------------------------------------------
    def sleep(self) -> None:
        """The engine's weights and KV cache unmapped (refused while it has requests in flight)."""
        if readiness.generating(self.llm):
            raise VllmBackendError("the engine has requests in flight: it sleeps once they finish; nothing was "
                                   "changed")
        self.llm.sleep(level=self.level)

    def wake_weights(self) -> None:
        """The weights mapped back. At level 2 they hold nothing until the update writes them:
        the engine refuses to serve until an update completes (an update that fails after this
        leaves it refusing, never serving what the memory held)."""
        if "weights" in self.asleep():
            self.llm.wake_up(tags=["weights"])
            if self.level == 2:
                self.engine.refuse_until_update("its weights were woken from sleep level 2 and hold nothing until "
                                                "an update writes them")

    def update(self, params):
        """The engine's weights from `params` (VllmEngine.update; refused while they sleep)."""
        return self.engine.update(params)

    def wake_kv_cache(self) -> None:
        """The KV cache mapped back; refused while the weights sleep (a generate would read
        unmapped weights)."""
        asleep = self.asleep()
        if "weights" in asleep:
            raise VllmBackendError("the engine's weights sleep: wake them (and update them) before the KV cache, "
                                   "llm.wake_up(tags=['weights']); nothing was woken")
        if "kv_cache" in asleep:
            self.llm.wake_up(tags=["kv_cache"])

    # --- the two switches -----------------------------------------------------------------------
    def to_rollout(self, params, *, keep=None, drop=None) -> SwitchReport:
        import jax_amem

        if jax_amem.is_paused():
            raise VllmBackendError("Colocated.to_rollout: the trainer is paused already (the loop is in its "
                                   "rollout phase); to_trainer() comes first")
        if readiness.generating(self.llm):
            raise VllmUpdateError("the engine has requests in flight: a switch to the rollout waits for them; "
                                  "nothing was changed", served="old")
        parts, start = {}, time.perf_counter()
        self._timed(parts, "wake weights", self.wake_weights)
        update = self._timed(parts, "update", lambda: self.update(params))
        pause = self._timed(parts, "pause trainer", lambda: jax_amem.pause(keep=keep, drop=drop))
        self._timed(parts, "wake kv cache", self.wake_kv_cache)
        return SwitchReport("rollout", time.perf_counter() - start, parts, update=update, pause=pause)

    def to_trainer(self) -> SwitchReport:
        import jax_amem

        if not jax_amem.is_paused():
            raise VllmBackendError("Colocated.to_trainer: the trainer is not paused (the loop is in its trainer "
                                   "phase); to_rollout(params) comes first")
        parts, start = {}, time.perf_counter()
        self._timed(parts, "engine sleep", self.sleep)
        restored = self._timed(parts, "resume trainer", jax_amem.resume)
        return SwitchReport("trainer", time.perf_counter() - start, parts, restored=restored)

    @staticmethod
    def _timed(parts: dict, name: str, run):
        t0 = time.perf_counter()
        result = run()
        parts[name] = time.perf_counter() - t0
        return result
