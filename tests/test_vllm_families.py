"""jax-amem's vLLM backend into real engines of the preset families the other vLLM tests do not
serve (`make test-vllm`), each from a Flax-style trainer tree with `family=`:

* Qwen2: q/k/v biases, fused by vLLM into `qkv_proj.bias`; 2 query heads and one KV head, so
  at TP=2 each rank's qkv weight and bias hold its query head and the replicated KV head;
  untied head. TP=1 in this process and TP=2 with two worker processes.
* Gemma (1): Llama's tensors, tied head, GemmaRMSNorm's 1 + w and the embedding times
  sqrt(hidden). TP=1.
* Gemma2: tied head (vLLM has no `lm_head`: its logits read the embedding), four norms per layer
  (GemmaRMSNorm's 1 + w), attention and final logit soft-capping. TP=1.
* Gemma3 (text, Gemma3ForCausalLM): Gemma2's four norms per layer and per-head q/k norms of
  head_dim, tied head; both layers local (sliding window 4096, wider than the engine's
  max_model_len). TP=1.
* DeepSeek (V3 naming): multi-head latent attention (q_proj, kv_a_proj_with_mqa, kv_a_layernorm,
  kv_b_proj; vLLM derives the attention layer's W_UK_T and W_UV from kv_b_proj after loading,
  and the commit derives them again), a dense layer then an MoE layer with a shared expert and
  the router's score-correction bias; the derived tensors given storage of their own first (as
  where kv_b_proj is quantized), so a commit that did not derive them again would leave them
  stale. TP=1 and TP=2 (one head per rank); its tokens are checked against vLLM's own load only
  (vLLM-CPU's MLA differs from transformers', docs/limits.md).
* Phi-3: Llama's tensors, the checkpoint's q/k/v fused in `qkv_proj` and gate/up in
  `gate_up_proj` (vLLM's Phi3ForCausalLM is its Llama, its loader cutting each rank's rows from
  the fused tensors); untied head. TP=1 and TP=2.
* GPT-2: tied head, LayerNorm weights and biases, output biases, learned positions (`wpe`, a
  plain torch Embedding), fused `c_attn`, no gated MLP; a vocabulary of 300, which vLLM pads to
  320 rows (GPT-2's 50257 is no multiple of 64 either), so at TP=2 the second rank's 160 rows
  end in 20 padding rows the trainer does not write. TP=1 and TP=2.

One engine per family and tensor-parallel size, shared by the module. Each starts from the
checkpoint of version 2, and its parameters as vLLM's own loader made them are the oracle.
jax-amem then writes versions 1 and 2: greedy tokens equal transformers' with the same weights
at each (DeepSeek: version 1's differ from the oracle's), and after version 2 every parameter
of every rank is bit-identical to the oracle's. The tied models' embeddings are small
(vllm_models.embedding_scale), so their greedy tokens are not the prompt's last token repeated.

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

# KV heads per family (GPT-2 has no grouped KV heads: one per query head)
KV = {"qwen2": 1, "gemma": vm.KV, "gemma2": vm.KV, "gemma3": vm.KV, "gpt2": vm.heads("gpt2"), "deepseek": vm.KV,
      "phi3": vm.KV}
# vLLM-CPU's MLA attention computes other logits than transformers' DeepSeek-V3 for the same
# checkpoint (docs/limits.md): there vLLM's own load of each version is the only oracle.
DIFFERS_FROM_TRANSFORMERS = ("deepseek",)
# TP=2 where it cuts something TP=1 does not: Qwen2's qkv bias and replicated KV head, GPT-2's
# padded vocabulary (the padding on the last rank), DeepSeek's MLA heads, the ranks' rows vLLM
# cuts from Phi-3's fused checkpoint tensors (the oracle for each rank's qkv_proj and gate_up_proj
# is that cut, not the q/k/v tensors Llama's loader reads one by one). Gemma2's and Gemma3's
# tensors are cut as tied Qwen3's (tests/test_vllm_tp.py: qkv_proj and gate_up_proj per rank, the
# per-head q/k norms and the layer norms whole), Gemma's as tied Llama's.
CASES = [("qwen2", 1), ("gemma", 1), ("gemma2", 1), ("gemma3", 1), ("gpt2", 1), ("deepseek", 1), ("phi3", 1),
         ("qwen2", 2), ("gpt2", 2), ("deepseek", 2), ("phi3", 2)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-tp{tp}" for f, tp in CASES])
def engine(request, tmp_path_factory):
    """An engine of the family at TP=tp loaded by vLLM from version 2, and the oracle: its
    parameters as loaded (per rank), its greedy tokens and top-5 logprobs."""
    family, tp = request.param
    trees = [vm.flax_tree(family, seed, kv=KV[family]) for seed in (40, 41, 42)]
    directory = tmp_path_factory.mktemp(f"{family}-tp{tp}")
    vm.checkpoint(vm.hf_model(family, trees[2]), directory / "v2")
    with loaded(directory / "v2", tp) as (llm, oracle):
        yield {"llm": llm, "family": family, "tp": tp, "trees": trees, "oracle": oracle}


DERIVED = ("W_UK_T", "W_UV")   # MLA attention's, cut from kv_b_proj after loading


def _derived_own_storage(worker):
    """MLA attention's W_UK_T and W_UV given storage of their own. On CPU vLLM cuts them as views
    of kv_b_proj's weight, so writing kv_b_proj in place updates them too; where kv_b_proj is
    quantized (fp8 DeepSeek checkpoints) they are computed from a dequantized copy and only the
    attention layer's processing makes them again."""
    count = 0
    for module in worker.model_runner.get_model().modules():
        for name in DERIVED:
            if isinstance(getattr(module, name, None), torch.nn.Parameter):
                setattr(module, name, torch.nn.Parameter(getattr(module, name).detach().clone(), requires_grad=False))
                count += 1
    return count


def test_two_versions_equal_transformers_and_vllms_own_load(engine):
    """Each rank stages its slice of every tensor vLLM loads (qkv weight and bias, gate_up, the
    vocabulary rows; norms, biases of row-parallel layers and GPT-2's positions whole). After
    version 1 some parameter differs from the oracle's; after version 2 the tokens, the top-5
    logprobs of every step (the packed linear layers keep no parameter) and every parameter of
    every rank equal the oracle's, GPT-2's vocabulary padding rows included: the staging buffer
    is shared by every group, so the commit zeroes the rows the trainer does not write (they
    held what the previous update's last groups left there)."""
    llm, family, tp, trees, oracle = (engine[k] for k in ("llm", "family", "tp", "trees", "oracle"))
    if family == "deepseek":
        assert llm.collective_rpc(_derived_own_storage) == [2 * vm.L] * tp
    amem = jv.connect(llm, as_jax(trees[1]), family=family, source="flax", timeout=120)
    assert amem.transport == ("in_process" if tp == 1 else "shared_memory") and len(amem.ranks) == tp
    staged = {t["name"]: t["shape"] for g in amem.description["groups"] for t in g}
    qkv, width = (vm.heads(family) // tp + 2 * max(1, KV[family] // tp)) * vm.HD, vm.D
    fused = {"gpt2": "attn.c_attn", "deepseek": "self_attn.kv_b_proj"}.get(family, "self_attn.qkv_proj")
    if family == "deepseek":   # the latent's up-projection: each head's no-rope key and value
        qkv, width = vm.heads(family) // tp * (vm.NOPE + vm.HD), vm.R
    assert [s for n, s in staged.items() if n.endswith(f"{fused}.weight")] == [[qkv, width]] * vm.L
    has_bias = family in ("qwen2", "gpt2")
    assert [s for n, s in staged.items() if n.endswith(f"{fused}.bias")] == [[qkv]] * (vm.L * has_bias)
    assert ("lm_head.weight" in staged) == (not vm.tied(family))
    embed = next(t for g in amem.description["groups"] for t in g
                 if t["name"].endswith(("embed_tokens.weight", "wte.weight")))
    padded = -(-vm.vocab(family) // 64) * 64    # vLLM pads the vocabulary to a multiple of 64 rows
    assert embed["loaded"] == [padded // tp, vm.D] and embed["shape"] == [min(vm.vocab(family), padded // tp), vm.D]
    theirs = oracle["params"]
    for version in (1, 2):
        report = amem.update(as_jax(trees[version]))
        assert report.version == version and report.groups == vm.L + 2
        tokens = vm.greedy(llm)
        if family not in DIFFERS_FROM_TRANSFORMERS:
            hf = vm.hf_model(family, trees[version])
            assert tokens == [vm.hf_greedy(hf, p, vm.NEW_TOKENS) for p in vm.PROMPTS], f"version {version}"
        ours = [state for _, state in ranks_params(llm)]
        if version == 1:
            assert tokens != oracle["greedy"][0]
            assert not all(torch.equal(ours[r][n], theirs[r][n]) for r in range(tp) for n in ours[r])
            derived = [n for n in ours[0] if n.endswith(DERIVED)]
            assert len(derived) == 2 * vm.L * (family == "deepseek")
            assert not any(torch.equal(ours[r][n], theirs[r][n]) for r in range(tp) for n in derived)
    assert vm.greedy(llm, logprobs=5) == oracle["greedy"]
    amem.close()
    assert_ranks_equal(ours, theirs)
    if has_bias:   # the bias is held as loaded (not packed): each rank's own q head and the KV head
        a = trees[2]["layers"]["attn"]
        for rank in range(tp):
            layer = "transformer.h.0" if family == "gpt2" else "model.layers.0"
            held = ours[rank][f"{layer}.{fused}.bias"].numpy()
            q = a["q"]["bias"][0].reshape(tp, -1)[rank]
            k, v = (a[x]["bias"][0].reshape(min(tp, KV[family]), -1)[rank * KV[family] // tp] for x in "kv")
            assert np.array_equal(held, np.concatenate([q, k, v])), rank
