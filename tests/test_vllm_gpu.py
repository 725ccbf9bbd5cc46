"""jax-amem's vLLM backend in real vLLM GPU engines (vLLM 0.26 on an H100/H200; `bash
scripts/gpu_test.sh build vllm_payload vllm_gpu`, docs/development.md).

Each test updates an engine three times in a row from a JAX trainer's tree on the same GPU and
checks every version against an oracle engine that loaded the same weights through vLLM's own
loader: every parameter bit-identical, the greedy tokens equal (tests/vllm_gpu_engines.py).

* in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): Qwen3 (tied), Llama with one KV head and
  Qwen3-MoE, eager and with CUDA graphs (a captured graph must serve the new weights);
* in vLLM's own engine-core process (its default): the trainer writes the worker's staging
  buffer over CUDA IPC;
* the colocated loop: the trainer paused by jax-amem while the engine, started with sleep mode,
  serves, and the engine asleep while the trainer trains; the refusals of that loop.

Skips cleanly without a GPU or without vLLM.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # vLLM's engines share the GPU
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")   # FlashInfer is not in the GPU payload

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU here", allow_module_level=True)
vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (scripts/gpu_test.sh vllm_payload)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_amem  # noqa: E402,F401
import jax_amem.vllm as jv  # noqa: E402
import vllm_gpu_engines as ge  # noqa: E402
import vllm_models as vm  # noqa: E402
import vllm_worker_probe  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]
HERE = Path(__file__).resolve().parent
_oracles: dict = {}


def trees(family: str, kv: int) -> list[dict]:
    return [vm.flax_tree(family, seed, kv=kv) for seed in (11, 12, 13)]


def on_gpu(tree):
    return jax.tree.map(lambda a: jax.device_put(jnp.asarray(a), jax.devices("gpu")[0]), tree)


def start_oracle(tmp_root: Path, family: str, kv: int, eager: bool) -> None:
    """Starts vLLM's own load of every version, once per test session, in a process of its own
    (vllm_gpu_engines.Oracles says why): a test starts it before its own engine."""
    key = (family, kv, eager)
    if key not in _oracles:
        directory = tmp_root / f"oracle-{family}-kv{kv}-{'eager' if eager else 'graphs'}"
        _oracles[key] = ge.Oracles(directory, family, trees(family, kv), eager=eager)


def oracle(tmp_root: Path, family: str, kv: int, version: int, eager: bool) -> dict:
    """vLLM's own load of version `version` (1-3)."""
    start_oracle(tmp_root, family, kv, eager)
    return _oracles[(family, kv, eager)].result()[version - 1]


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
    yield tmp_path_factory.mktemp("vllm-gpu")
    for started in _oracles.values():   # one no test read (a test that failed first) ends with the module
        if started.process.poll() is None:
            started.process.kill()


def check_version(llm, tmp_root, family, kv, version, eager, digests=None):
    expected = oracle(tmp_root, family, kv, version, eager)
    digests = digests if digests is not None else llm.collective_rpc(ge.digests)[0]
    assert not ge.differing(digests, expected["digests"]), \
        f"version {version}: parameters differ from vLLM's own load: {ge.differing(digests, expected['digests'])[:8]}"
    assert vm.greedy(llm) == expected["tokens"], f"version {version}: greedy tokens differ from vLLM's own load"


@pytest.mark.parametrize("family, kv, eager", [("qwen3", 2, True), ("qwen3", 2, False), ("llama", 1, False),
                                               ("qwen3_moe", 2, True)])
def test_in_process_engine_three_versions_equal_vllms_own_load(tmp_root, family, kv, eager):
    """The engine in the trainer's process: three updates, each bit-identical to vLLM's own
    load and serving its tokens; with CUDA graphs, the graphs captured at start serve every
    version (the update writes the captured addresses)."""
    versions = trees(family, kv)
    start_oracle(tmp_root, family, kv, eager)
    llm = ge.start(ge.config_dir(tmp_root / f"config-{family}-kv{kv}", family, kv), backend=True, eager=eager,
                   dummy=True)
    try:
        engine = jv.connect(llm, on_gpu(versions[0]), family=family, cast="bfloat16")
        assert engine.transport == "in_process"
        for version, tree in enumerate(versions, 1):
            report = engine.update(on_gpu(tree))
            assert report.version == version and report.groups == vm.L + 2
            check_version(llm, tmp_root, family, kv, version, eager)
        # A mix of versions is refused by the model's forward, also where CUDA graphs replay (last:
        # vLLM keeps the refused requests, so the engine serves nothing after).
        engine.worker._refuse("a test's mix")
        with pytest.raises(Exception, match="mix of two versions"):
            vm.greedy(llm)
    finally:
        vm.shut(llm)


_ENGINE_CORE = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    import jax_amem, jax, jax.numpy as jnp, vllm
    import jax_amem.vllm as jv
    import vllm_gpu_engines as ge, vllm_models as vm

    if __name__ == "__main__":
        trees = [vm.flax_tree({family!r}, seed, kv={kv}) for seed in (11, 12, 13)]
        gpu = lambda t: jax.tree.map(lambda a: jax.device_put(jnp.asarray(a), jax.devices("gpu")[0]), t)
        llm = vllm.LLM(**ge.engine_kwargs({config!r}, backend=True, eager={eager}, dummy=True),
                       worker_extension_cls="vllm_worker_probe.Probe")
        engine = jv.connect(llm, gpu(trees[0]), family={family!r}, cast="bfloat16")
        out = {{"transport": engine.transport, "trainer": __import__("os").getpid(), "worker": llm.collective_rpc("probe")[0][0],
               "versions": []}}
        for tree in trees:
            report = engine.update(gpu(tree))
            out["versions"].append({{"digests": llm.collective_rpc("digests")[0], "tokens": vm.greedy(llm),
                                    "seconds": report.seconds}})
        vm.shut(llm)
        print("RESULT", json.dumps(out))
""")


def test_engine_core_process_over_cuda_ipc_three_versions(tmp_root):
    """vLLM's default placement: the engine core and its worker in a process of their own. The
    trainer writes the worker's staging buffer over CUDA IPC, and the worker commits it; CUDA
    graphs on. Each version bit-identical to vLLM's own load and serving its tokens."""
    family, kv, eager = "qwen3", 2, False
    start_oracle(tmp_root, family, kv, eager)
    config = ge.config_dir(tmp_root / f"config-{family}-kv{kv}", family, kv)
    script = _ENGINE_CORE.format(tests=str(HERE), family=family, kv=kv, eager=eager, config=str(config))
    # As users run it: vLLM's pickle fallback off, so the trainer's calls into the engine core's
    # process are what vLLM sends by default; the tests read the worker through vllm_worker_probe.
    env = vllm_worker_probe.engine_process_env()
    done = subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True, text=True, timeout=400,
                          cwd=tmp_root)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-6000:]
    import json
    out = json.loads(lines[0][len("RESULT "):])
    assert out["transport"] == "cuda_ipc" and out["worker"] != out["trainer"]
    for version, seen in enumerate(out["versions"], 1):
        expected = oracle(tmp_root, family, kv, version, eager)
        assert not ge.differing(seen["digests"], expected["digests"]), f"version {version}"
        assert seen["tokens"] == expected["tokens"], f"version {version}"


def test_colocated_loop_with_sleep_mode(tmp_root):
    """The trainer and an engine with sleep mode take turns on the GPU, three versions: sleep ->
    wake the weights -> update -> pause the trainer -> wake the KV cache -> generate -> sleep ->
    resume. Each version equals vLLM's own load; the trainer's state comes back bit-identical;
    the engine's memory is freed while it sleeps. The loop's refusals leave everything as it was."""
    family, kv, eager = "qwen3", 2, False
    versions = trees(family, kv)
    start_oracle(tmp_root, family, kv, eager)
    llm = ge.start(ge.config_dir(tmp_root / f"config-{family}-kv{kv}", family, kv), backend=True, eager=eager,
                   dummy=True, sleep=True)
    try:
        params = on_gpu(versions[0])
        state = on_gpu({"moment": np.arange(1 << 20, dtype=np.float32)})
        engine = jv.connect(llm, params, family=family, cast="bfloat16")
        loop = jv.Colocated(engine)
        assert loop.asleep() == ["kv_cache", "weights"]
        with pytest.raises(jv.VllmUpdateError, match="wake_up.*weights.*nothing was written") as refused:
            engine.update(params)   # vLLM itself faults here: refused before anything
        assert refused.value.served == "old"
        with pytest.raises(jv.VllmBackendError, match="weights sleep"):
            loop.wake_kv_cache()
        assert loop.asleep() == ["kv_cache", "weights"]
        with pytest.raises(jv.VllmBackendError, match="trainer is not paused"):
            loop.to_trainer()
        for version, tree in enumerate(versions, 1):
            params = on_gpu(tree)
            expected_state = np.asarray(state["moment"])
            switch = loop.to_rollout(params, keep=state, drop=params)
            assert switch.update.version == version and loop.asleep() == []
            check_version(llm, tmp_root, family, kv, version, eager)
            back = loop.to_trainer()
            assert loop.asleep() == ["kv_cache", "weights"]
            state = back.restored.keep
            np.testing.assert_array_equal(np.asarray(state["moment"]), expected_state)
    finally:
        vm.shut(llm)


def test_update_refused_while_a_generate_is_in_flight(tmp_root):
    """A request the engine has not finished: the update is refused before anything is written,
    and served after the request ends. Run after the colocated loop, whose engine ends asleep:
    that engine's memory left asleep in vLLM's pool (one per process) must not make this one,
    started without sleep mode, look asleep."""
    family, kv = "llama", 1
    versions = trees(family, kv)
    start_oracle(tmp_root, family, kv, True)
    llm = ge.start(ge.config_dir(tmp_root / f"config-{family}-kv{kv}", family, kv), backend=True, eager=True,
                   dummy=True)
    try:
        engine = jv.connect(llm, on_gpu(versions[0]), family=family, cast="bfloat16")
        engine.update(on_gpu(versions[0]))
        before = llm.collective_rpc(ge.digests)[0]
        llm.llm_engine.add_request("in-flight", {"prompt_token_ids": vm.PROMPTS[0]},
                                   vllm.SamplingParams(max_tokens=4, temperature=0, detokenize=False))
        with pytest.raises(jv.VllmUpdateError, match="requests in flight.*nothing was written"):
            engine.update(on_gpu(versions[1]))
        assert llm.collective_rpc(ge.digests)[0] == before
        llm.llm_engine.abort_request(["in-flight"])
        engine.update(on_gpu(versions[0]))
        check_version(llm, tmp_root, family, kv, 1, True)
    finally:
        vm.shut(llm)


def test_colocated_refuses_an_engine_without_sleep_mode(tmp_root):
    family, kv = "llama", 1
    llm = ge.start(ge.config_dir(tmp_root / f"config-{family}-kv{kv}", family, kv), backend=True, eager=True,
                   dummy=True)
    try:
        engine = jv.connect(llm, on_gpu(trees(family, kv)[0]), family=family, cast="bfloat16")
        with pytest.raises(jv.VllmBackendError, match="enable_sleep_mode=True"):
            jv.Colocated(engine)
    finally:
        vm.shut(llm)
