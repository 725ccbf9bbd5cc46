"""A vLLM worker extension for the tests (`vllm.LLM(worker_extension_cls="vllm_worker_probe.Probe")`):
what a worker process holds, read by `llm.collective_rpc("probe")`, a method's name, so that the
engine core runs in its own process without vLLM's pickle fallback (VLLM_ALLOW_INSECURE_SERIALIZATION),
as users run it. Imports neither JAX nor jax_amem."""

import os
import sys


def engine_process_env() -> dict:
    """The environment of a process whose vLLM engine core runs in a process of its own, as users
    run it: vLLM's pickle fallback off (whatever this process has), and this module importable
    there (the `worker_extension_cls`)."""
    env = {key: value for key, value in os.environ.items() if key != "VLLM_ALLOW_INSECURE_SERIALIZATION"}
    here = os.path.dirname(os.path.abspath(__file__))
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="1", PYTHONPATH=os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")])))
    return env


class Probe:
    def probe(self):
        """(pid, the worker's weight-transfer engine's class name, the JAX and jax_amem modules
        loaded, whether the backend's NCCL half is loaded)."""
        return (os.getpid(), type(self.weight_transfer_engine).__name__,
                sorted(m for m in sys.modules if m == "jax" or m.startswith(("jax.", "jax_amem."))),
                "jax_amem_vllm.nccl" in sys.modules)

    def digests(self):
        """Each parameter of the worker's model: "dtype:shape:sha256 of its bytes"."""
        import vllm_gpu_engines

        return vllm_gpu_engines.digests(self)
