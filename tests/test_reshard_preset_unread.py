"""`rules.preset` refuses a tree holding a weight its rules would not read (a head of its own with
tie_embeddings=True, q/k/v biases into a family whose preset writes none, another family's
norms), at preset() time, naming each path once with its layer count, the preset and what to
do; leaves the presets do not know as weights (optimizer state, a value head) are left alone,
and every family's own tree plans as before."""

import numpy as np
import pytest

from jax_amem import reshard, rules
from jax_amem.reshard.unread import UnreadWeightsError

import maxtext_exporter as mx
import preset_models as pm

HEAD_ADVICE = (r"'{head}' is a head of its own, and tie_embeddings=True writes the embedding as the rollout's head: "
               r"pass tie_embeddings=False into a rollout model with a head of its own \(lm_head\.weight, "
               r"tie_word_embeddings=False\), or leave the head out of the tree if the trainer ties it")


def _tree(family, source="flax", scan_axis=1):
    weights = pm.logical(family, np.random.default_rng(0))
    return pm.source_tree(family, "flax", weights) if source == "flax" else mx.maxtext_tree(family, weights, scan_axis)


def _who(family, source, layout):
    return rf"preset '{family}' \(source='{source}', layout='{layout}'\): "


@pytest.mark.parametrize("layout", ["hf", "vllm"])
@pytest.mark.parametrize("source,head", [("flax", "lm_head/kernel"), ("maxtext", "decoder/logits_dense/kernel")])
def test_a_head_of_its_own_with_tie_embeddings_is_refused(layout, source, head):
    """An untied trainer's head with tie_embeddings=True: the rules would write the embedding as the
    rollout's head and drop the trainer's own."""
    tree = _tree("llama", source)
    with pytest.raises(UnreadWeightsError, match=_who("llama", source, layout)
                       + rf"the tree holds 1 weight\(s\) that the rules would not read: {head}; the rollout would "
                         r"serve a model without them, not the trainer's: " + HEAD_ADVICE.format(head=head) + "$"):
        rules.preset("llama", tree, source=source, layout=layout, tie_embeddings=True)
    untied = rules.preset("llama", tree, source=source, layout=layout)   # what to do: planned, the head read
    assert "lm_head.weight" in {r.dst for r in untied}
    tied = {k: v for k, v in tree.items() if k != "lm_head"} if source == "flax" else \
        {**tree, "decoder": {k: v for k, v in tree["decoder"].items() if k != "logits_dense"}}
    assert "lm_head.weight" not in {r.dst for r in rules.preset("llama", tied, source=source, layout=layout,
                                                                   tie_embeddings=True)}


@pytest.mark.parametrize("layout", ["hf", "vllm"])
@pytest.mark.parametrize("family,named", [("llama", "llama"), ("mistral", "llama"), ("phi3", "phi3")])
def test_qkv_biases_into_a_family_without_them_name_qwen2(layout, family, named):
    """Phi-3 fuses q/k/v without biases (its qkv_proj has none): Qwen2 alone writes them."""
    tree = _tree("qwen2")
    with pytest.raises(UnreadWeightsError, match=_who(named, "flax", layout)
                       + rf"the tree holds 3 weight\(s\) that the rules would not read: layers/attn/k/bias "
                         rf"\({pm.L} layers\), layers/attn/q/bias \({pm.L} layers\), layers/attn/v/bias \({pm.L} "
                         rf"layers\); the rollout would serve a model without them, not the trainer's: the '{named}' "
                         r"preset writes no k_bias, q_bias, v_bias: family='qwen2' writes them, if the tree is that "
                         r"family's; or write the rules with rules\.from_function$") as refused:
        rules.preset(family, tree, layout=layout)
    assert isinstance(refused.value, reshard.RuleError)   # a RuleError, as every preset refusal
    assert refused.value.weights == {"layers/attn/k/bias": "k_bias", "layers/attn/q/bias": "q_bias",
                                     "layers/attn/v/bias": "v_bias"}
    rules.preset("qwen2", tree, layout=layout)   # what to do: planned


def test_a_maxtext_tree_with_a_bias_no_maxtext_preset_writes_names_from_function():
    tree = _tree("llama", "maxtext")
    tree["decoder"]["layers"]["self_attention"]["query"]["bias"] = np.zeros((pm.H, pm.L, pm.HD), np.float32)
    with pytest.raises(UnreadWeightsError, match=_who("llama", "maxtext", "vllm")
                       + rf"the tree holds 1 weight\(s\) that the rules would not read: decoder/layers/self_attention/"
                         rf"query/bias \({pm.L} layers\); .*the 'llama' preset writes no q_bias: no preset from the "
                         r"'maxtext' naming writes them with the rest of 'llama''s weights: check that family= is the "
                         r"tree's, or write the rules with rules\.from_function$"):
        rules.preset("llama", tree, source="maxtext", layout="vllm", tp=2)


def test_another_familys_norms_and_a_head_gpt2_ties_are_refused():
    with pytest.raises(UnreadWeightsError, match=r"layers/attn/k_norm/scale \(2 layers\), layers/attn/q_norm/scale "
                                                 r"\(2 layers\); .*the 'llama' preset writes no k_norm, q_norm: "
                                                 r"family='qwen3' writes them"):
        rules.preset("llama", _tree("qwen3"))
    gpt2 = {**_tree("gpt2"), "lm_head": {"kernel": np.zeros((pm.D, pm.V), np.float32)}}
    with pytest.raises(UnreadWeightsError, match=r"would not read: lm_head/kernel; .*the 'gpt2' preset writes no head "
                                                 r"of its own \(the model ties it to the embedding\): leave "
                                                 r"'lm_head/kernel' out of the tree if the trainer ties it"):
        rules.gpt2(gpt2)


@pytest.mark.parametrize("family,tree_of,named,extra", [
    ("llama", "qwen3", "qwen3", "k_norm, q_norm"),            # not gemma3, which also writes two more norms
    ("gemma", "gemma2", "gemma2", "post_ffw_norm, pre_ffw_norm"),
    ("gemma2", "gemma3", "gemma3", "k_norm, q_norm"),
    ("phi3", "qwen3", "qwen3", "k_norm, q_norm")])
def test_the_closest_family_that_writes_the_unread_norms_is_named(family, tree_of, named, extra):
    """The advice names the family that writes the tree's weights and the fewest others: a family
    writing more (Gemma3 beside Qwen3) would expect weights the tree has not."""
    with pytest.raises(UnreadWeightsError, match=rf"the '{family}' preset writes no {extra}: family='{named}' "
                                                 r"writes them, if the tree is that family's"):
        rules.preset(family, _tree(tree_of))
    rules.preset(named, _tree(tree_of))   # what to do: planned


def test_every_unread_kind_is_named_once_and_a_long_list_is_cut():
    """DeepSeek's stacks hold 1 layer each: a path of a one-layer stack is said without a count."""
    tree = _tree("deepseek")
    for stack in ("dense_layers", "moe_layers"):
        tree[stack]["attn"]["q_norm"] = {"scale": np.zeros((1, pm.HD), np.float32)}
    tree["final_norm"]["bias"] = np.zeros(pm.D, np.float32)
    tree["pos_embed"] = {"embedding": np.zeros((8, pm.D), np.float32)}
    for name in ("q", "k", "v", "o"):
        attn = tree["moe_layers"]["attn"]
        attn[name] = {**attn.get(name, {}), "bias": np.zeros((1, pm.D), np.float32)}
    with pytest.raises(UnreadWeightsError, match=r"the tree holds 8 weight\(s\) that the rules would not read: "
                                                 r"dense_layers/attn/q_norm/scale, final_norm/bias, moe_layers/attn/"
                                                 r"k/bias, moe_layers/attn/o/bias, moe_layers/attn/q/bias, moe_layers/"
                                                 r"attn/q_norm/scale \.\.\.; .*the 'deepseek' preset writes no q_norm, "
                                                 r"final_norm_bias, k_bias, o_bias, q_bias, v_bias, pos_embed: no "
                                                 r"preset from the 'flax' naming writes them"):
        rules.deepseek(tree)


def test_leaves_that_are_not_known_weights_are_left_alone():
    """Optimizer state and a value head under names of their own are not weights the presets know."""
    tree = _tree("llama")
    extra = {**tree, "opt_state": {"mu": np.zeros(3, np.float32)}, "value_head": {"kernel": np.zeros((pm.D, 1))}}
    assert rules.preset("llama", extra, layout="vllm", tp=2, head_dim=pm.HD) == \
        rules.preset("llama", tree, layout="vllm", tp=2, head_dim=pm.HD)


def _families():
    return [(f, "flax", 0) for f in pm.FAMILIES] + [(f, "maxtext", a) for f in mx.FAMILIES for a in (0, 1)]


@pytest.mark.parametrize("layout", ["hf", "vllm"])
@pytest.mark.parametrize("family,source,scan_axis", _families())
def test_every_familys_own_tree_plans_untied_and_tied(family, source, scan_axis, layout):
    """Each family's tree as the preset tests build it, untied; without its head, tied."""
    tree = _tree(family, source, scan_axis)
    rules.preset(family, tree, source=source, layout=layout)
    head = "lm_head" if source == "flax" else "logits_dense"
    holder = tree if source == "flax" else tree["decoder"]
    tied_holder = {k: v for k, v in holder.items() if k != head}
    tied = tied_holder if source == "flax" else {**tree, "decoder": tied_holder}
    rules.preset(family, tied, source=source, layout=layout, tie_embeddings=True)
