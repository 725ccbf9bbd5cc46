"""Whether an engine can take an update now, asked before anything is written.

Two states of a running engine make an update wrong, and neither is the trainer's to see
without asking:

* **A generate in flight.** vLLM runs an update's calls between its scheduler's steps, so an
  update that arrives while requests run would change the weights under sequences half
  generated: they would end on the new version. Refused while the engine has unfinished
  requests (`llm_engine.has_unfinished_requests()`).
* **Weights asleep.** An engine with sleep mode unmaps its weights at `llm.sleep()`; a write to
  them faults the GPU (vLLM itself crashes there). Refused until
  `llm.wake_up(tags=["weights"])`. The worker checks too, at start_weight_update.
"""

from __future__ import annotations

import os


def generating(llm) -> bool:
    """Whether the engine has requests not yet finished (False where vLLM cannot say)."""
    engine = getattr(llm, "llm_engine", None)
    check = getattr(engine, "has_unfinished_requests", None)
    try:
        return bool(check()) if callable(check) else False
    except Exception:  # noqa: BLE001 - an engine that cannot answer is asked no further here
        return False


def sleep_mode(llm) -> bool:
    """Whether the engine was started with enable_sleep_mode=True."""
    try:
        return bool(llm.llm_engine.vllm_config.model_config.enable_sleep_mode)
    except AttributeError:
        return False


def refusal(llm, asleep: list[str]) -> str | None:
    """Why an update must not start now (`asleep`: the workers' sleeping tags), or None."""
    if "weights" in asleep:
        return ("the engine sleeps and its weights are not mapped: call llm.wake_up(tags=['weights']) "
                "before the update")
    if generating(llm):
        return ("the engine has requests in flight (a generate is running): an update now would change the "
                "weights under sequences half generated; update between generates")
    return None


def xla_preallocation() -> str | None:
    """Why JAX's GPU backend in this process holds most of the GPU whatever it needs, or None:
    its default allocator takes 75% of the GPU at start and keeps it, so an engine beside it
    cannot wake its weights while the trainer runs (Colocated's step before the pause). A
    fraction set by the user (XLA_PYTHON_CLIENT_MEM_FRACTION) is taken as sized for the engine."""
    import jax

    if jax.default_backend() != "gpu":
        return None
    if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").lower() == "platform":
        return None
    if os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() in ("false", "0"):
        return None
    if "XLA_PYTHON_CLIENT_MEM_FRACTION" in os.environ:
        return None
    return ("JAX's GPU backend preallocates 75% of the GPU in this process (XLA_PYTHON_CLIENT_PREALLOCATE is "
            "not false), which the engine then cannot use while the trainer runs: start the process with "
            "XLA_PYTHON_CLIENT_PREALLOCATE=false (set before JAX starts), or size it with "
            "XLA_PYTHON_CLIENT_MEM_FRACTION")
