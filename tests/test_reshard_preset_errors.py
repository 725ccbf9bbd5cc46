"""Each bad preset input is refused at `rules.preset()` with the preset, the parameter and the
axis named (not at plan() or at the swap); `rules.from_function` refuses an output that is not a
mapping of names where it is called."""

import numpy as np
import pytest

from jax_amem import reshard, rules

import maxtext_exporter as X
import preset_models as M

WHO = r"preset 'llama' \(source='maxtext', layout='vllm'\)"


def _maxtext(family="llama", scan_axis=1):
    return X.maxtext_tree(family, M.logical(family, np.random.default_rng(0)), scan_axis)


def _llama(tree, **options):
    return rules.preset("llama", tree, source="maxtext", **options)


@pytest.mark.parametrize("tp", [0, -2, "2", 2.0, True, None])
def test_tp_that_is_not_a_size(tp):
    with pytest.raises(rules.RuleError, match=WHO + r": tp=%s is not a tensor-parallel size: give an int >= 1"
                       % repr(tp).replace("(", r"\(").replace(".", r"\.")):
        _llama(_maxtext(), layout="vllm", tp=tp)


def test_tp_that_does_not_divide_the_query_heads():
    """4 query heads, tp=3: named with the weight, its source axis and the preset."""
    with pytest.raises(rules.RuleError, match=WHO + r": tp=3 does not divide the 4 heads of 'q' \(axis 2 of source "
                                                    r"'decoder/layers/self_attention/query/kernel', shape \(16, 2, 4, 4\)"
                                                    r"\).*vLLM needs whole heads per rank"):
        _llama(_maxtext(), layout="vllm", tp=3)


def test_tp_that_does_not_divide_a_flax_fused_tensor():
    tree = M.source_tree("qwen3", "flax", M.logical("qwen3", np.random.default_rng(0)))
    with pytest.raises(rules.RuleError, match=r"preset 'qwen3' \(source='flax', layout='vllm'\): tp=3 does not divide "
                                              r"the 4 heads \(of head_dim 4, merged\) of 'q' \(axis 2 of source "
                                              r"'layers/attn/q/kernel'"):
        rules.qwen3(tree, layout="vllm", tp=3)


def test_tp_with_the_hf_layout_is_refused_not_ignored():
    with pytest.raises(rules.RuleError, match=r"preset 'llama' \(source='maxtext', layout='hf'\): tp=3 applies to the "
                                              r"'vllm' layout's fused tensors.*pass tp=1, or layout='vllm'"):
        _llama(_maxtext(), tp=3)


def test_qwen3_on_maxtexts_default_layout_reads_the_layer_axis():
    """Layers on axis 1 (MaxText's default): the Qwen3 preset plans L layers, not d_model."""
    tree = _maxtext("qwen3", scan_axis=1)
    names = {getattr(r, "dst") for r in rules.qwen3(tree, source="maxtext")}
    assert {n.split(".")[2] for n in names if n.startswith("model.layers.")} == {str(i) for i in range(M.L)}


def test_scan_axis_that_does_not_hold_the_layers():
    with pytest.raises(rules.RuleError, match=r"preset 'qwen3' \(source='maxtext', layout='hf'\): scan_axis=0: the "
                                              r"tensors of the layer stack 'decoder/layers' do not hold their layers "
                                              r"on axis 0.*param_scan_axis \(1 by default\)"):
        rules.qwen3(_maxtext("qwen3", scan_axis=1), source="maxtext", scan_axis=0)
    for bad in (-1, "1", 1.0):
        with pytest.raises(rules.RuleError, match=r"scan_axis=.* is not an axis"):
            rules.qwen3(_maxtext("qwen3"), source="maxtext", scan_axis=bad)


def test_a_stack_with_no_layer_axis_names_the_axis():
    tree = _maxtext("qwen3", scan_axis=1)
    tree["decoder"]["layers"]["mlp"]["wo"]["kernel"] = np.zeros((M.F, 3, M.D), np.float32)  # 3 layers, not 2
    with pytest.raises(rules.RuleError, match=r"preset 'qwen3' \(source='maxtext', layout='hf'\): the layer stack "
                                              r"'decoder/layers' has no layer axis.*param_scan_axis"):
        rules.qwen3(tree, source="maxtext")


def test_a_stack_whose_layer_axis_is_ambiguous():
    """D == L: axis 0 and axis 1 both fit; the preset asks for scan_axis instead of guessing."""
    n = 4
    tree = {"decoder": {"layers": {"self_attention": {"query": {"kernel": np.zeros((n, n, 2, 2), np.float32)}},
                                   "pre_self_attention_layer_norm": {"scale": np.zeros((n, n), np.float32)}}},
            "token_embedder": {"embedding": np.zeros((8, n), np.float32)}}
    with pytest.raises(rules.RuleError, match=r"fits layers on axis 0 and on axis 1.*pass scan_axis=0 or scan_axis=1"):
        rules.qwen3(tree, source="maxtext")


def test_heads_merged_under_the_maxtext_naming():
    """A Flax-style (merged heads) kernel under MaxText's names: the head axis is named missing."""
    tree = _maxtext("qwen3", scan_axis=0)
    tree["decoder"]["layers"]["self_attention"]["query"]["kernel"] = np.zeros((M.L, M.D, M.H * M.HD), np.float32)
    with pytest.raises(rules.RuleError, match=r"source 'decoder/layers/self_attention/query/kernel' \(weight 'q'\) "
                                              r"has shape \(2, 16, 16\).*has 3 axes \(in, heads, head_dim\)"):
        rules.qwen3(tree, source="maxtext", scan_axis=0)


@pytest.mark.parametrize("family,step", [("gemma2", r"scale_rmsnorm_layer.*pad_hf_embedding_layer.*scale_query_layer"),
                                         ("gemma3", r"GEMMA3_MAXTEXT_TO_HF_PARAM_HOOK_FN.*q/k norms included "
                                                    r"\(scale_rmsnorm\).*pad_and_scale_embedding.*layers_0 \.\. "
                                                    r"layers_5"),
                                         ("gemma", r"Hugging Face \(AI-Hypercomputer/maxtext .* at a429848a0a51\) has "
                                                   r"no Gemma \(1\) hooks"),
                                         ("gpt2", r"MaxText has no GPT-2 model"),
                                         ("phi3", r"Hugging Face \(AI-Hypercomputer/maxtext .* at a429848a0a51\) has "
                                                  r"no Phi-3 hooks")])
def test_maxtext_presets_that_cannot_follow_the_exporter_refuse(family, step):
    tree = M.source_tree(family, "maxtext", M.logical(family, np.random.default_rng(0)))
    with pytest.raises(rules.RuleError, match=r"preset '%s' \(source='maxtext', layout='hf'\): refused: .*%s.*"
                                              r"rules.from_function" % (family, step)):
        rules.preset(family, tree, source="maxtext")


@pytest.mark.parametrize("family", X.SCALES_QUERIES)
def test_an_integer_query_kernel_that_the_exporter_would_scale(family):
    """The copy scales floating values only: an int32 query kernel is refused at preset(), named,
    unless unscaled_queries=True says it is copied as it is."""
    tree = _maxtext(family)
    query = tree["decoder"]["layers"]["self_attention"]["query"]
    query["kernel"] = query["kernel"].astype(np.int32)
    with pytest.raises(rules.RuleError, match=r"preset '%s' \(source='maxtext', layout='hf'\): MaxText's exporter "
                                              r"\(\w+'s scale_query_layer, .*param_mapping.py at a429848a0a51\) "
                                              r"multiplies the query kernel "
                                              r"'decoder/layers/self_attention/query/kernel' by sqrt\(head_dim\).*it "
                                              r"is int32.*unscaled_queries=True" % family):
        rules.preset(family, tree, source="maxtext")
    assert rules.preset(family, tree, source="maxtext", unscaled_queries=True)


def test_options_that_do_not_apply_are_refused():
    with pytest.raises(rules.RuleError, match=r"unscaled_queries=True applies only to trees whose exporter scales"):
        rules.qwen3(_maxtext("qwen3"), source="maxtext", unscaled_queries=True)
    with pytest.raises(rules.RuleError, match=r"unscaled_queries='yes' is True or False"):
        rules.llama(_maxtext(), source="maxtext", unscaled_queries="yes")
    with pytest.raises(rules.RuleError, match=r"vocab_size=64 is more than the 32 rows of 'token_embedder/embedding'"):
        rules.qwen3(_maxtext("qwen3"), source="maxtext", vocab_size=64)
    with pytest.raises(rules.RuleError, match=r"vocab_size=0 is not a vocabulary size"):
        rules.qwen3(_maxtext("qwen3"), source="maxtext", vocab_size=0)


@pytest.mark.parametrize("output,kind", [(lambda p: p["w"].T, "ArrayImpl|DynamicJaxprTracer"),
                                         (lambda p: [p["w"], p["w"].T], "list"),
                                         (lambda p: (p["w"],), "tuple")])
def test_from_function_output_that_is_not_a_mapping(output, kind):
    """A bare array would be named '' and a list '0', '1': refused where from_function is called."""
    with pytest.raises(rules.TraceError, match=r"returned (%s), not a mapping of destination names to arrays"
                                               % kind):
        rules.from_function(output, {"w": np.zeros((2, 3), np.float32)})


def test_from_function_accepts_nested_mappings():
    pieces = rules.from_function(lambda p: {"a": {"b": p["w"].T}}, {"w": np.zeros((2, 3), np.float32)})
    assert {p.dst for p in pieces} == {"a/b"}
    assert isinstance(pieces[0], reshard.Piece)


@pytest.mark.parametrize("options,message", [({"tp": 0}, r"tp=0 is not a tensor-parallel size"),
                                             ({"tp": "2"}, r"tp='2' is not a tensor-parallel size"),
                                             ({"num_layers": -1}, r"num_layers=-1 is not a layer count")])
def test_hf_llama_options(options, message):
    options = {"num_layers": 2, "fused_qkv": True, **options}
    with pytest.raises(rules.RuleError, match=r"rules.hf_llama: " + message):
        rules.hf_llama(options.pop("num_layers"), **options)


def test_a_piece_covered_twice_among_thousands_is_found():
    """The coverage check sweeps the pieces (a RoPE reorder makes one per row): a duplicate among
    them is still named."""
    tree = _maxtext("llama")
    made = rules.llama(tree, source="maxtext")
    q = [p for p in made if isinstance(p, reshard.Piece) and p.dst == "model.layers.1.self_attn.q_proj.weight"]
    assert len(q) == M.H * M.HD                               # one piece per rotary row
    dst = {n: reshard.Layout.single(s, "float32", reshard.Owner(0, 1)) for n, s in
           {"model.layers.1.self_attn.q_proj.weight": (M.H * M.HD, M.D)}.items()}
    src = {n: reshard.Layout.single(tuple(x.shape), "float32", reshard.Owner(0, 0))
           for n, x in reshard.tree_names(tree).items()}
    reshard.plan(src, dst, q, cache=False)
    twin = q[len(q) // 2]
    row = twin.dst_start[0]
    with pytest.raises(rules.RuleError, match=r"'model.layers.1.self_attn.q_proj.weight': region \[%d:%d, 0:16\] is "
                                              r"covered twice" % (row, row + 1)):
        reshard.plan(src, dst, q + [twin], cache=False)
