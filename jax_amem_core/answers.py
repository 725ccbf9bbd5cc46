"""What the trainer asks every worker: `llm.collective_rpc(METHOD, kwargs={"question": ...})`
runs `answer` on each worker (jax_amem_vllm.register adds it to vLLM's workers under METHOD) and
returns each one's answer. Asked by a method's name, not by sending a function: vLLM sends a name
to workers of other processes (the engine core's own process is its default) as it is, where a
function needs its pickle fallback (VLLM_ALLOW_INSECURE_SERIALIZATION), off by default. Plain
functions, free of vLLM, JAX and jax_amem so that a trainer without vLLM (benchmarks, test
stand-ins) imports them too.

They answer rather than raise: after one rank raises in a call, vLLM 0.32's multiprocess
executor leaves the other ranks' answers unread, and every later call reads those ranks'
answers one call late (returning before they finish). For the same reason the worker keeps an
update_weights failure for `failures_of` instead of raising it (jax_amem_vllm/engine.py).
"""

from __future__ import annotations


def _engine(worker):
    """The worker's weight-transfer engine when it is jax_amem's, else None."""
    engine = getattr(worker, "weight_transfer_engine", None)
    return engine if type(engine).__name__ == "JaxAmemWeightTransferEngine" else None


def failures_of(worker) -> str:
    """The failure of the worker's last update_weights ("" if none), taken: read after each
    commit call."""
    engine = _engine(worker)
    return engine.take_failure() if engine is not None else ""


def setup_of(worker) -> str:
    """The id of the worker engine's current setup ("" when it is not set up): a fresh one per
    init, carried by the note the trainer planned from. Read before an update by a trainer whose
    workers run in other processes: another id means the worker was set up again since (another
    connect, even under the same session name), so its staging is not where that trainer's
    mappings point."""
    engine = _engine(worker)
    return engine.setup if engine is not None else ""


def serving_state_of(worker) -> str:
    """What the worker's engine serves: "serving", "refusing" (a mix of versions) or "updating";
    read by a trainer whose update failed, after it ended the update."""
    engine = _engine(worker)
    return engine.serving_state() if engine is not None else ""


def asleep_of(worker) -> list[str]:
    """The vLLM memory tags asleep in the worker's process ("weights", "kv_cache"), as its
    engine says: read before an update and by a colocated loop before it wakes the KV cache."""
    engine = _engine(worker)
    return engine.asleep() if engine is not None else []


def refuse_until_update(worker, why: str) -> bool:
    """The worker's engine refuses to serve until an update completes (`why` in its refusal):
    asked by a colocated loop that woke weights holding nothing (vLLM's sleep level 2). False
    where the worker has no jax_amem engine."""
    engine = _engine(worker)
    if engine is None:
        return False
    engine.refuse_until_update(why)
    return True


# The name of the worker method that answers (`answer`), and the questions it takes.
METHOD = "jax_amem_answer"
QUESTIONS = {"failure": failures_of, "setup": setup_of, "serving_state": serving_state_of, "asleep": asleep_of,
             "refuse_until_update": refuse_until_update}


def answer(worker, question: str, **kwargs):
    """The worker's answer to `question` (a key of QUESTIONS), with the question's arguments."""
    if question not in QUESTIONS:
        raise ValueError(f"jax_amem: a worker was asked {question!r}, which it does not answer "
                         f"(it answers {sorted(QUESTIONS)}): the trainer's jax-amem is not the worker's; "
                         "install one version in both")
    return QUESTIONS[question](worker, **kwargs)
