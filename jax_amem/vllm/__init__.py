"""A vLLM engine as a destination of the swap: the trainer's half of the `jax_amem` backend of
vLLM's weight-transfer API (the worker's half is the `jax_amem_vllm` package, which vLLM loads).

    llm = vllm.LLM(model=..., weight_transfer_config={"backend": "jax_amem"})
    engine = jax_amem.vllm.connect(llm, params, family="qwen3")   # plans once, per layer group
    report = engine.update(params)                                # every training step
    print(report)

    loop = jax_amem.vllm.Colocated(engine)   # an engine with sleep mode, sharing the GPU with the trainer
    loop.to_rollout(params, keep=state)      # wake weights, update, pause the trainer, wake the KV cache
    loop.to_trainer()                        # the engine sleeps, the trainer resumes

See docs/vllm.md.
"""

from .colocated import Colocated, SwitchReport
from .errors import VllmBackendError, VllmPlanError, VllmUpdateError
from .trainer import VllmEngine, VllmUpdateReport, connect

__all__ = ["Colocated", "SwitchReport", "VllmBackendError", "VllmEngine", "VllmPlanError", "VllmUpdateError",
           "VllmUpdateReport", "connect"]
