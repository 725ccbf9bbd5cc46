"""jax-amem's backend for vLLM's weight-transfer API: the half that runs inside vLLM.

vLLM loads this package in every one of its processes (the `vllm.general_plugins` entry point
calls `register()`), so an engine started with

    vllm.LLM(model=..., weight_transfer_config={"backend": "jax_amem"})

builds `JaxAmemWeightTransferEngine` in each worker. The trainer's half is `jax_amem.vllm`
(JAX, the planner and the swap). This package imports neither JAX nor jax_amem: a worker that
imported JAX could start a JAX backend inside vLLM's process (on a GPU, JAX's default
preallocation takes 75% of the device). tests/test_vllm_backend.py checks that it holds. What
both halves share (the compiled core, the link's protocol, the staging note, the answers to
the trainer's calls, the registry of this process's engines) is `jax_amem_core`, which both
import.

See docs/vllm.md.
"""

BACKEND = "jax_amem"


def register() -> None:
    """Registers the backend with vLLM's factory and gives vLLM's workers the method that answers
    the trainer's questions (idempotent: vLLM may load plugins twice)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    from vllm.v1.worker.worker_base import WorkerBase

    from jax_amem_core import answers

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "jax_amem_vllm.engine", "JaxAmemWeightTransferEngine")
    # The trainer asks by this method's name (jax_amem_core/answers.py says why a name): vLLM runs a
    # method of its worker by name in every placement. Added to the base of its workers, as vLLM
    # itself adds a `worker_extension_cls`, so that users need not pass one.
    if not hasattr(WorkerBase, answers.METHOD):
        setattr(WorkerBase, answers.METHOD, answers.answer)
