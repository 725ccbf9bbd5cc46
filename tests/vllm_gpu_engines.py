"""Real vLLM GPU engines for the tests of test_vllm_gpu.py: tiny configs from tests/vllm_models.py,
started from a local config (`load_format="dummy"`, nothing from the hub) or from a checkpoint of
the trainer's weights, in bfloat16, with CUDA graphs (vLLM's default) or eager.

The oracle of an update is a second engine that loaded the same weights through vLLM's own
loader from a float32 safetensors checkpoint: every parameter must be bit-identical (both sides
round float32 to bfloat16 to nearest even) and the greedy tokens equal (same kernels, same mode).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import vllm_models as vm

# vLLM sizes its KV cache from this share of the GPU; several engines of these tests live at
# once on one GPU beside the trainer's JAX, so each takes a small one.
GPU_SHARE = 0.12
KV_CACHE_BYTES = 128 << 20
CAPTURE_SIZES = [1, 2, 4, 8]   # the batch sizes CUDA graphs are captured for (2 prompts here)


def config_dir(directory: Path, family: str, kv: int) -> Path:
    """A model folder holding only config.json: the engine starts with dummy weights."""
    config, cls = vm.hf_config(family, kv=kv)
    config.architectures = [cls.__name__]   # else vLLM resolves the bare model, a pooling one
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    return directory


def checkpoint_dir(directory: Path, family: str, tree: dict) -> Path:
    """A float32 safetensors checkpoint of the trainer's tree, as transformers saves it."""
    vm.checkpoint(vm.hf_model(family, tree), directory)
    return directory


def engine_kwargs(directory, *, backend: bool, eager: bool, dummy: bool = False, sleep: bool = False) -> dict:
    kwargs = dict(model=str(directory), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=128,
                  enforce_eager=eager, gpu_memory_utilization=GPU_SHARE, kv_cache_memory_bytes=KV_CACHE_BYTES)
    if not eager:
        kwargs["compilation_config"] = {"cudagraph_capture_sizes": CAPTURE_SIZES}
    if dummy:
        kwargs["load_format"] = "dummy"
    if backend:
        kwargs["weight_transfer_config"] = {"backend": "jax_amem"}
    if sleep:
        kwargs["enable_sleep_mode"] = True
    return kwargs


def start(directory, **options):
    import gc

    import vllm

    gc.collect()   # an engine collected later would tear down the parallel groups of this one
    return vllm.LLM(**engine_kwargs(directory, **options))


def digests(worker) -> dict:
    """Every parameter of the worker's model: name -> sha256 of its bytes (run on the worker
    through collective_rpc, so it holds for engines in other processes too)."""
    import torch

    model = worker.model_runner.get_model()
    out = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            data = param.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()
            out[name] = f"{param.dtype}:{tuple(param.shape)}:{hashlib.sha256(data).hexdigest()}"
    return out


_ORACLE = """
import json, sys
sys.path.insert(0, {tests!r})
import numpy as np
import vllm_gpu_engines as ge, vllm_models as vm
if __name__ == "__main__":
    out = []
    for version, directory in enumerate({directories!r}, 1):
        tree = {{k: v for k, v in np.load(directory + ".npz", allow_pickle=True).items()}}["tree"].item()
        llm = ge.start(ge.checkpoint_dir(ge.Path(directory), {family!r}, tree), backend=False, eager={eager})
        out.append({{"digests": llm.collective_rpc(ge.digests)[0], "tokens": vm.greedy(llm)}})
        vm.shut(llm)
    print("ORACLE " + json.dumps(out))
"""


class Oracles:
    """vLLM's own load of each tree, in a process of its own, started at once and read when
    needed (`result()`): per version, its parameters' digests and its greedy tokens. Apart
    because a vLLM engine's shutdown tears down the parallel groups of its process, which an
    engine under test in that process shares; started early, its engines start while the test's
    own engine does."""

    def __init__(self, directory: Path, family: str, trees: list[dict], *, eager: bool):
        import os
        import subprocess
        import sys

        import numpy as np

        directory.mkdir(parents=True, exist_ok=True)
        directories = []
        for version, tree in enumerate(trees, 1):
            path = directory / f"v{version}"
            np.savez(str(path) + ".npz", tree=np.array(tree, dtype=object))
            directories.append(str(path))
        script = _ORACLE.format(tests=str(Path(__file__).resolve().parent), directories=directories, family=family,
                                eager=eager)
        self.process = subprocess.Popen([sys.executable, "-P", "-c", script], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, cwd=directory,
                                        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
        self.versions: list[dict] | None = None

    def result(self) -> list[dict]:
        if self.versions is None:
            stdout, stderr = self.process.communicate(timeout=600)
            lines = [line for line in stdout.splitlines() if line.startswith("ORACLE ")]
            assert lines, stdout[-3000:] + stderr[-6000:]
            self.versions = json.loads(lines[0][len("ORACLE "):])
        return self.versions


def oracles(directory: Path, family: str, trees: list[dict], *, eager: bool) -> list[dict]:
    """`Oracles(...)`, waited for."""
    return Oracles(directory, family, trees, eager=eager).result()


def differing(ours: dict, theirs: dict) -> list[str]:
    """The parameters whose bytes (or names, shapes, dtypes) differ."""
    return sorted(name for name in set(ours) | set(theirs) if ours.get(name) != theirs.get(name))


def save(path: Path, value) -> None:
    path.write_text(json.dumps(value))
