"""connect against a model whose tensors and the trainer's tree disagree in ways a preset family's
checkpoints do (no vLLM: the engine's side is each rank's note, as in tests/test_vllm_ranks.py;
tests/test_vllm_variants.py runs the same against real engines):

* a trainer tree with weights the engine's model has no tensor for (its own head into a tied
  engine, biases into a model without them): refused by name, since the engine would serve a
  model without them;
* an engine with tensors the preset does not write (a Llama with attention_bias / mlp_bias):
  refused naming each kind of tensor once, however many layers hold it;
* family="mistral": Llama's tensors, planned as "llama" from the flax naming; from MaxText's,
  refused naming "llama".
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the staging buffers are PyTorch tensors")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_amem  # noqa: E402
from jax_amem.vllm import VllmPlanError  # noqa: E402
from jax_amem.vllm.names import match  # noqa: E402
from jax_amem.vllm.options import checked_rules  # noqa: E402
from jax_amem.vllm.trainer import VllmEngine  # noqa: E402
import vllm_models as vm  # noqa: E402
from test_vllm_ranks import Commits, Rank, expected, notes_for  # noqa: E402


def _ranks(tree, *, tie_embeddings: bool, family: str = "llama", tp: int = 1) -> list:
    """The ranks of an engine holding what the `family` preset makes of `tree`."""
    rules = jax_amem.rules.preset(family, tree, layout="vllm", tp=tp, tie_embeddings=tie_embeddings, head_dim=vm.HD)
    return [Rank(note) for note in notes_for(rules, jax_amem.reshard.layouts_of(tree), tp, vm.HD)]


def _engine(ranks, params, family="llama", source="flax"):
    return VllmEngine(Commits(ranks), ranks, params, family=family, source=source, rules=None, cast=None, timeout=60)


@pytest.mark.parametrize("tp", [1, 2])
def test_a_head_of_its_own_into_a_tied_engine_is_refused(tp):
    """A Llama 3.2-style engine ties lm_head to the embedding (no lm_head.weight); an untied
    trainer tree's lm_head/kernel would be dropped, the engine serving the embedding as its head."""
    params = jax.tree.map(jnp.asarray, vm.flax_tree("llama", 3))
    untied_tree_into_tied = _ranks({k: v for k, v in params.items() if k != "lm_head"}, tie_embeddings=True, tp=tp)
    with pytest.raises(VllmPlanError, match=r"1 weight\(s\) that the 'llama' preset.*does not read: lm_head/kernel; "
                                            r"the engine would serve a model without them.*tie_word_embeddings=True"
                                            r".*nothing was written"):
        _engine(untied_tree_into_tied, params)
    tied = {k: v for k, v in params.items() if k != "lm_head"}
    _engine(_ranks(tied, tie_embeddings=True, tp=tp), tied)   # a tied tree into it: planned


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_biases_the_engine_has_no_tensor_for_are_refused(family):
    """A tree with q/k/v biases (Qwen2-style, or a Llama trained with attention_bias) into a
    Llama engine without them: the biases would be dropped."""
    tree = vm.flax_tree("qwen2", 3)
    params = jax.tree.map(jnp.asarray, tree)
    attn = {n: {"kernel": params["layers"]["attn"][n]["kernel"]} for n in ("q", "k", "v", "o")}
    llama = {**params, "layers": {**params["layers"], "attn": attn}}    # the engine's: no biases
    with pytest.raises(VllmPlanError, match=rf"3 weight\(s\).*'llama' preset.*does not read: layers/attn/k/bias "
                                            rf"\({vm.L} layers\), layers/attn/q/bias \({vm.L} layers\), "
                                            rf"layers/attn/v/bias \({vm.L} layers\); .*attention_bias.*nothing was "
                                            r"written$"):
        _engine(_ranks(llama, tie_embeddings=False), params, family=family)


def test_biases_into_an_engine_that_holds_them_name_the_engine_tensors_first():
    """A Qwen2 engine (q/k/v biases) connected with family='llama': the engine's tensors that no
    rule of the preset writes are said first, with the family that writes them."""
    params = jax.tree.map(jnp.asarray, vm.flax_tree("qwen2", 3))
    with pytest.raises(VllmPlanError, match=rf"{vm.L} engine tensor\(s\) no rule writes: model\.layers\.\*\."
                                            rf"self_attn\.qkv_proj\.bias \({vm.L} layers\);.*family='qwen2' writes "
                                            r"q/k/v biases.*nothing was written$"):
        _engine(_ranks(params, tie_embeddings=False, family="qwen2"), params, family="llama")
    _engine(_ranks(params, tie_embeddings=False, family="qwen2"), params, family="qwen2")   # planned


def test_engine_tensors_no_rule_writes_are_named_once_per_kind():
    """A Llama engine with attention_bias and mlp_bias (qkv, o, gate_up and down biases in every
    layer): each kind named once with its layer count, whatever the model's depth."""
    rules = jax_amem.rules.preset("llama", jax.tree.map(jnp.asarray, vm.flax_tree("llama", 3)), layout="vllm")
    names = sorted({r.dst for r in rules})
    biases = [f"model.layers.{i}.{m}.bias" for i in range(vm.L)
              for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")]
    with pytest.raises(VllmPlanError) as refused:
        match(rules, names + biases)
    said = str(refused.value)
    for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        assert f"model.layers.*.{m}.bias ({vm.L} layers)" in said, said
    assert "8 engine tensor(s) no rule writes" in said and "attention_bias or mlp_bias" in said
    assert "nothing was written" in said
    with pytest.raises(VllmPlanError, match=r"no rule writes: model\.layers\.0\.mlp\.extra\.weight;"):
        match(rules, names + ["model.layers.0.mlp.extra.weight"])   # one layer's: its own name


def test_mistral_is_planned_as_llama_from_the_flax_naming():
    """Mistral's checkpoints hold Llama's tensors (vLLM's MistralForCausalLM is its Llama with the
    same names): family="mistral" writes what family="llama" writes."""
    tree = vm.flax_tree("llama", 3)
    params = jax.tree.map(jnp.asarray, tree)
    assert jax_amem.rules.preset("mistral", params, layout="vllm", tp=2, head_dim=vm.HD) == \
        jax_amem.rules.preset("llama", params, layout="vllm", tp=2, head_dim=vm.HD)
    checked_rules("mistral", "flax", None, None)
    ranks = _ranks(params, tie_embeddings=False, tp=2)
    _engine(ranks, params, family="mistral").update(params)
    for rank in ranks:
        for name, tensor in rank.held.items():
            assert np.array_equal(tensor.numpy(), expected(tree, name, rank.note["tp_rank"])), name


def test_mistral_from_maxtext_and_unknown_families_are_refused_naming_llama():
    with pytest.raises(VllmPlanError, match=r"no MaxText exporter for 'mistral': pass family='llama'.*nothing was "
                                            r"started"):
        checked_rules("mistral", "maxtext", None, None)
    with pytest.raises(jax_amem.reshard.RuleError, match=r"unknown family 'mistrall'.*'mistral' \(read as 'llama'\)"):
        jax_amem.rules.preset("mistrall", {}, layout="vllm")
    with pytest.raises(VllmPlanError, match=r"family='Mistral' is not a preset family: .*'mistral', read as 'llama'"):
        checked_rules("Mistral", "flax", None, None)
