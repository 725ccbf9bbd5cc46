"""Every preset (family x source naming x rollout layout) swaps bit-exact into its model.

The 'flax' oracle is built independently (preset_models.py: numpy). The 'maxtext' oracle is
MaxText's own exporter re-expressed in numpy (maxtext_exporter.py, which cites the MaxText
file and commit it follows), on both of MaxText's layer layouts (param_scan_axis 0 and 1, its
default). Both are checked by `load_state_dict(strict=True)` into the transformers model or the
emulated vLLM module. Sources are sharded over 8 CPU devices on a 2-D mesh; destinations are
fp32 and bf16 torch models. Where transformers has the family, the swapped model's logits equal
the oracle-loaded model's. The same oracles, run under `rules.from_function`, must give the
same bytes (a traced plan equals running the function).
"""

import functools

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem import reshard, rules

import maxtext_exporter as X
import preset_models as M
from reshard_oracle import shard_tree

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TP = 2
TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _state(family, layout, source, seed=0):
    weights = M.logical(family, np.random.default_rng(seed))
    tree = M.source_tree(family, source, weights)
    want = M.oracle(family, layout, weights, np, TP)
    return tree, want


def _destination(family, layout, want, dtype):
    """The rollout model, loaded strictly with NaN (so unwritten values show)."""
    if layout == "hf":
        model = M.hf_model(family)
    else:
        model = M.vllm_module(want)
    nan = {k: torch.full(tuple(v.shape), float("nan")) for k, v in want.items()}
    nan = _with_ties(nan) if layout == "hf" else nan
    model.load_state_dict(nan, strict=True)   # the oracle's names and shapes are exactly the model's
    return model.to(TORCH[dtype])


def _with_ties(state):
    """GPT-2's lm_head is the token embedding (one tensor, two names): the swap writes it once."""
    if "transformer.wte.weight" in state:
        state = {**state, "lm_head.weight": state["transformer.wte.weight"]}
    return state


def _tensors(model, want):
    """The model's tensors the oracle names (state_dict: parameters and buffers such as
    DeepSeek's e_score_correction_bias)."""
    state = model.state_dict()
    return {k: state[k] for k in want}


def _check_params(model, want, dtype):
    got = _tensors(model, want)
    for name, value in want.items():
        expected = np.ascontiguousarray(value).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
        actual = got[name].detach().float().numpy().astype(expected.dtype)
        assert np.array_equal(actual.view(np.uint8), expected.view(np.uint8)), name


def _check_logits(family, model, want, dtype):
    reference = M.hf_model(family).to(TORCH[dtype])
    reference.load_state_dict(_with_ties({k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in want.items()}),
                              strict=True)
    tokens = torch.arange(8).reshape(1, 8) % M.V
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, reference(tokens).logits)


def _tp(layout):
    return TP if layout == "vllm" else 1


CASES = [(f, s, l) for f in M.FAMILIES for s in ("flax", "maxtext") for l in ("hf", "vllm")]


@pytest.mark.parametrize("family,layout", [(f, l) for f in M.FAMILIES for l in ("hf", "vllm")])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_flax_preset_swaps_bit_exact(family, layout, dtype):
    tree, want = _state(family, layout, "flax")
    arrays = shard_tree(tree)
    model = _destination(family, layout, want, dtype)
    rule_list = rules.preset(family, arrays, source="flax", layout=layout, tp=_tp(layout),
                             cast=None if dtype == "float32" else dtype, head_dim=M.HD)
    jax_amem.swap(arrays, _tensors(model, want), rules=rule_list)
    _check_params(model, want, dtype)
    if layout == "hf":
        _check_logits(family, model, want, dtype)


def test_the_phi3_oracle_fuses_as_transformers_reads():
    """The Phi-3 oracle's fused order (q, k then v rows; gate then up) is the one transformers'
    Phi3ForCausalLM splits: holding it, the model computes the logits of LlamaForCausalLM holding
    the same weights unfused (two matmuls where Phi-3 does one: equal to rounding)."""
    weights = M.logical("phi3", np.random.default_rng(4))
    tokens = torch.arange(8).reshape(1, 8) % M.V
    logits = []
    for family in ("phi3", "llama"):
        model = M.hf_model(family)
        model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in
                               M.oracle(family, "hf", weights, np).items()}, strict=True)
        with torch.no_grad():
            logits.append(model(tokens).logits)
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)


# transformers' own Flax -> PyTorch loader, `load_flax_weights_in_pytorch_model` in
# huggingface/transformers src/transformers/modeling_flax_pytorch_utils.py at commit
# 01080c629600d4ff3121446bb4f4a2e240c2cf41, re-expressed: a 2-D `kernel` becomes `weight`,
# transposed; `scale` and `embedding` become `weight`; anything else keeps its name and value.
def _flax_to_pytorch(flat: dict) -> dict:
    out = {}
    for key, value in flat.items():
        *path, last = key.split("/")
        if last == "kernel":
            value, last = value.T, "weight"
        elif last in ("scale", "embedding"):
            last = "weight"
        out[".".join([*path, last])] = value
    return out


def test_flax_naming_follows_transformers_flax_exporter():
    """The 'flax' oracle (which the flax presets equal, above) is what transformers' Flax loader
    makes of the same Llama written as transformers' FlaxLlamaForCausalLM tree, one subtree per
    layer: the 'flax' naming differs from that tree in names and stacking only."""
    weights = M.logical("llama", np.random.default_rng(7))
    tree = reshard.tree_names(M.source_tree("llama", "flax", weights))
    hf_flax = {"model/embed_tokens/embedding": tree["embed/embedding"], "model/norm/weight": tree["final_norm/scale"],
               "lm_head/kernel": tree["lm_head/kernel"]}
    modules = {"attn/q/kernel": "self_attn/q_proj/kernel", "attn/k/kernel": "self_attn/k_proj/kernel",
               "attn/v/kernel": "self_attn/v_proj/kernel", "attn/o/kernel": "self_attn/o_proj/kernel",
               "mlp/gate/kernel": "mlp/gate_proj/kernel", "mlp/up/kernel": "mlp/up_proj/kernel",
               "mlp/down/kernel": "mlp/down_proj/kernel", "input_norm/scale": "input_layernorm/weight",
               "post_attn_norm/scale": "post_attention_layernorm/weight"}
    for ours, theirs in modules.items():
        for i in range(M.L):
            hf_flax[f"model/layers/{i}/{theirs}"] = tree[f"layers/{ours}"][i]
    got, want = _flax_to_pytorch(hf_flax), M.oracle("llama", "hf", weights, np)
    assert sorted(got) == sorted(want)
    for name in want:
        assert np.array_equal(got[name], want[name]), name


def _maxtext_state(family, layout, scan_axis, seed=0, scale_queries=True):
    """A MaxText tree with layers on `scan_axis` and what MaxText's exporter makes of it
    (Llama's and Mixtral's query scaling included unless `scale_queries=False`)."""
    weights = M.logical(family, np.random.default_rng(seed))
    tree = X.maxtext_tree(family, weights, scan_axis)
    hf = X.to_transformers(family, X.export(family, tree, scan_axis, scale_queries=scale_queries))
    return tree, (hf if layout == "hf" else X.to_vllm(family, hf, TP))


def _maxtext_rules(family, arrays, layout, cast=None, **options):
    return rules.preset(family, arrays, source="maxtext", layout=layout, tp=_tp(layout), cast=cast, **options)


MAXTEXT_CASES = [(f, a, l) for f in X.FAMILIES for a in (0, 1) for l in ("hf", "vllm")]


@pytest.mark.parametrize("family,scan_axis,layout", MAXTEXT_CASES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_maxtext_preset_equals_maxtexts_exporter(family, scan_axis, layout, dtype):
    """source='maxtext' writes what MaxText's own to_huggingface writes (Llama's RoPE reorder and
    Llama's and Mixtral's query scaling included), with layers on axis 0 or on axis 1 (MaxText's
    default), bit for bit."""
    tree, want = _maxtext_state(family, layout, scan_axis)
    arrays = shard_tree(tree)
    model = _destination(family, layout, want, dtype)
    jax_amem.swap(arrays, _tensors(model, want),
                  rules=_maxtext_rules(family, arrays, layout, None if dtype == "float32" else dtype))
    _check_params(model, want, dtype)
    if layout == "hf":
        _check_logits(family, model, want, dtype)


@pytest.mark.parametrize("family", X.SCALES_QUERIES)
def test_unscaled_queries_copies_the_query_kernels_as_they_are(family):
    """MaxText's Llama and Mixtral exporters multiply the query kernel by sqrt(head_dim): the
    preset does too (above); unscaled_queries=True says the tree's query kernels are already
    plain and writes the exporter's output without scale_query_layer, which differs from the
    full exporter's in the q_proj tensors only."""
    tree, unscaled = _maxtext_state(family, "hf", 1, scale_queries=False)
    full = X.to_transformers(family, X.export(family, tree, 1))
    differ = sorted(n for n in full if not np.array_equal(full[n], unscaled[n]))
    assert differ == [f"model.layers.{i}.self_attn.q_proj.weight" for i in range(M.L)]
    np.testing.assert_array_equal(full[differ[0]], unscaled[differ[0]] * np.float32(np.sqrt(M.HD)))
    arrays = shard_tree(tree)
    for options, want in (({"unscaled_queries": True}, unscaled), ({}, full)):
        model = _destination(family, "hf", want, "float32")
        jax_amem.swap(arrays, _tensors(model, want), rules=_maxtext_rules(family, arrays, "hf", **options))
        _check_params(model, want, "float32")


def _heads_regrouped(family, scan_axis, dtype, head_dim):
    """A MaxText tree whose attention has head_dim `head_dim` (the same total widths as the test
    models: fewer, wider heads), in `dtype`: sqrt(head_dim) is not a power of two, so the
    scaled kernels are rounded (in float32, then to `dtype`) as the exporter rounds them."""
    weights = M.logical(family, np.random.default_rng(3))
    layers = weights["layers"]
    for logical in ("q", "k", "v"):
        count, d, heads, hd = layers[logical].shape
        layers[logical] = layers[logical].reshape(count, d, heads * hd // head_dim, head_dim)
    count, heads, hd, d = layers["o"].shape
    layers["o"] = layers["o"].reshape(count, heads * hd // head_dim, head_dim, d)
    cast = {"bfloat16": ml_dtypes.bfloat16}.get(dtype, dtype)
    weights = jax.tree.map(lambda x: np.asarray(x).astype(cast), weights)
    return X.maxtext_tree(family, weights, scan_axis)


@pytest.mark.parametrize("family", X.SCALES_QUERIES)
@pytest.mark.parametrize("scan_axis", [0, 1])
@pytest.mark.parametrize("source_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_query_scaling_rounds_as_the_exporter(family, scan_axis, source_dtype, dtype):
    """head_dim 8 (sqrt(8) is exact in none of these dtypes): the kernels times float32(sqrt(8))
    in float32, rounded back to the tree's dtype, then cast to the rollout's: every q_proj bit
    equals the exporter's."""
    head_dim = 8
    tree = _heads_regrouped(family, scan_axis, source_dtype, head_dim)
    want = X.to_transformers(family, X.export(family, tree, scan_axis, head_dim=head_dim))
    arrays = shard_tree(tree)
    model = _destination(family, "hf", want, dtype)
    jax_amem.swap(arrays, _tensors(model, want),
                  rules=_maxtext_rules(family, arrays, "hf", None if dtype == source_dtype else dtype))
    _check_params(model, want, dtype)


def _no_custom_call(*args, **kwargs):
    raise AssertionError("an XLA custom call was traced: the program did not launch directly")


@pytest.mark.parametrize("family", X.SCALES_QUERIES)
@pytest.mark.parametrize("scan_axis", [0, 1])
@pytest.mark.parametrize("source_dtype, dtype", [("float32", "float32"), ("float32", "bfloat16"),
                                                 ("bfloat16", "bfloat16"), ("float16", "float32"),
                                                 ("float16", "bfloat16")])
def test_maxtext_query_scaling_launches_directly(monkeypatch, family, scan_axis, source_dtype, dtype):
    """On one device (the direct launch's case), head_dim 8: the scaled query kernel, read
    transposed, is the fused transpose copy's, its rows running the scale's program, so the
    whole preset's program launches outside XLA (no custom call traced) and writes MaxText's
    exporter's bytes. Kept on the XLA route, with the same bytes: float16 -> bfloat16 (a
    conversion the transpose copy has not), and Mixtral on scan axis 1, whose experts stacked
    (experts, layers, in, out) are read (layers, experts, out, in): two transposes at once, no
    batched 2-D transpose (fused_views.geometry), with or without the scale."""
    from jax_amem.swapping import forget
    from jax_amem.swapping.in_process import direct, routes, run

    forget()
    tree = _heads_regrouped(family, scan_axis, source_dtype, 8)
    want = X.to_transformers(family, X.export(family, tree, scan_axis, head_dim=8))
    arrays = jax.device_put(tree, jax.devices()[0])
    model = _destination(family, "hf", want, dtype)
    launches_directly = (source_dtype, dtype) != ("float16", "bfloat16") and (family, scan_axis) != ("mixtral", 1)
    with monkeypatch.context() as patch:
        if launches_directly:
            patch.setattr(routes, "affine_copy_to_addresses", _no_custom_call)
            patch.setattr(routes, "segment_copy_to_addresses", _no_custom_call)
        jax_amem.swap(arrays, _tensors(model, want),
                      rules=_maxtext_rules(family, arrays, "hf", None if dtype == source_dtype else dtype))
    (program,) = run._programs.values()
    if launches_directly:
        assert isinstance(program.direct, direct.DirectProgram)
        assert sum(c.stepped_transpose_rows for c in program.direct.copies) >= M.L  # every layer's q_proj
    else:
        assert program.direct is False
    forget()
    _check_params(model, want, dtype)
    if dtype == "float32":
        _check_logits(family, model, want, dtype)


@pytest.mark.parametrize("family", X.SCALES_QUERIES)
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
def test_query_scale_steps_are_the_exporters_arithmetic(family, dtype):
    """The steps the preset runs (checked against the copy kernel by test_reshard_affine) give
    scale_query_layer's values for every floating dtype, float64 included (Mixtral's multiply
    stays in float64 there, Llama's goes through float32)."""
    from jax_amem.reshard.presets import query_scale

    cast = {"bfloat16": ml_dtypes.bfloat16}.get(dtype, dtype)
    x = (np.random.default_rng(4).standard_normal((M.D, 2, 8)) * 3).astype(cast)
    got = query_scale(family, dtype, 8).apply_numpy(x, dtype)
    want = X.query_scaled(family, x, 8)
    assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_maxtext_vocabulary_cut_equals_the_exporters():
    """MaxText's Qwen3 exporter keeps the first rows of a padded embedding (pad_embedding_layer);
    vocab_size= does the same (and cuts an untied lm_head's output rows)."""
    from reshard_oracle import plan_and_run

    weights = M.logical("qwen3", np.random.default_rng(4))
    padded = M.V + 8
    weights["embed"] = np.random.default_rng(5).standard_normal((padded, M.D)).astype(np.float32)
    weights["lm_head"] = np.random.default_rng(6).standard_normal((M.D, padded)).astype(np.float32)
    tree = X.maxtext_tree("qwen3", weights, 1)
    exported = X.export("qwen3", {**tree, "decoder": {k: v for k, v in tree["decoder"].items()
                                                      if k != "logits_dense"}}, 1)
    want = {**exported, "lm_head.weight": weights["lm_head"][:, :M.V].T}
    assert exported["model.embed_tokens.weight"].shape == (M.V, M.D)
    plan_and_run(shard_tree(tree), want, rules.preset("qwen3", tree, source="maxtext", vocab_size=M.V))


def _exporter_as_function(family, layout, scan_axis):
    """MaxText's hooks written with jnp, the way a MaxText user's exporter reads (unstacking with
    x[:, i], RoPE by strided slices, reshape then .T, the query scaling)."""
    def convert(tree):
        hf = X.to_transformers(family, X.export(family, tree, scan_axis, xp=jnp), xp=jnp)
        return hf if layout == "hf" else X.to_vllm(family, hf, TP, xp=jnp)
    return convert


@pytest.mark.parametrize("family,layout", [("llama", "hf"), ("qwen3_moe", "vllm"), ("deepseek", "hf")])
def test_maxtexts_exporter_through_from_function_equals_the_preset(family, layout):
    """The exporter itself, traced by rules.from_function, writes the preset's bytes."""
    tree, want = _maxtext_state(family, layout, 1, seed=2)
    arrays = shard_tree(tree)
    for rule_list in (rules.from_function(_exporter_as_function(family, layout, 1), arrays),
                      _maxtext_rules(family, arrays, layout)):
        model = _destination(family, layout, want, "float32")
        jax_amem.swap(arrays, _tensors(model, want), rules=rule_list)
        _check_params(model, want, "float32")


def _converter(family, layout, source, dtype):
    def convert(tree):
        out = M.oracle_from_source(family, layout, source, tree, jnp, TP)
        return {k: v.astype(dtype) for k, v in out.items()}
    return convert


@functools.cache
def _cached_converter(family, layout, source, dtype):
    return _converter(family, layout, source, dtype)


@pytest.mark.parametrize("family,source,layout", CASES)
def test_from_function_equals_running_it(family, source, layout):
    """The traced plan writes exactly what running the conversion (numpy) gives, every preset."""
    dtype = "bfloat16" if layout == "vllm" else "float32"
    tree, _ = _state(family, layout, source, seed=1)
    run = {k: np.asarray(v).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
           for k, v in M.oracle_from_source(family, layout, source, tree, np, TP).items()}
    arrays = shard_tree(tree)
    model = _destination(family, layout, run, dtype)
    convert = _cached_converter(family, layout, source, dtype)
    rule_list = rules.from_function(convert, arrays)
    count = rules.trace_count()
    jax_amem.swap(arrays, _tensors(model, run), rules=rule_list)
    _check_params(model, run, dtype)
    assert rules.from_function(convert, arrays) == rule_list and rules.trace_count() == count  # cached


def _swap_on(family, jax_device, torch_device):
    """Trees on one device into HF and vLLM-style bf16 models on `torch_device`: the flax
    naming, and MaxText's (layers on axis 1) where MaxText has an exporter for the family."""
    for layout in ("hf", "vllm"):
        cases = [("flax", *_state(family, layout, "flax"))]
        if family in X.FAMILIES:
            cases.append(("maxtext", *_maxtext_state(family, layout, 1)))
        for source, tree, want in cases:
            arrays = jax.device_put(tree, jax_device)
            model = _destination(family, layout, want, "bfloat16").to(torch_device)
            rule_list = (_maxtext_rules(family, arrays, layout, "bfloat16") if source == "maxtext" else
                         rules.preset(family, arrays, layout=layout, tp=_tp(layout), cast="bfloat16", head_dim=M.HD))
            jax_amem.swap(arrays, _tensors(model, want), rules=rule_list)
            _check_params(model.cpu(), want, "bfloat16")


def test_single_device_swap_body_on_cpu():
    """The GPU test's body, run here on one CPU device (so the GPU run meets no surprise)."""
    _swap_on("qwen3_moe", jax.devices("cpu")[0], "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("family", M.FAMILIES)
def test_preset_swaps_into_cuda_models(family):
    """On a GPU: flax and MaxText trees on the GPU, HF and vLLM-style models on CUDA, bf16, bit-exact."""
    _swap_on(family, jax.devices("gpu")[0], "cuda")
