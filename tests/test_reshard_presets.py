"""Every preset (family x source naming x rollout layout) swaps bit-exact into its model.

The oracle is built independently (preset_models.py: numpy, and `load_state_dict(strict=True)`
into the transformers model or the emulated vLLM module). Sources are sharded over 8 CPU
devices on a 2-D mesh; destinations are fp32 and bf16 torch models. Where transformers has
the family, the swapped model's logits equal the oracle-loaded model's. The same oracle, run
under `rules.from_function`, must give the same bytes (a traced plan equals running the function).
"""

import functools

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem import rules

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


CASES = [(f, s, l) for f in M.FAMILIES for s in ("flax", "maxtext") for l in ("hf", "vllm")]


@pytest.mark.parametrize("family,source,layout", CASES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_preset_swaps_bit_exact(family, source, layout, dtype):
    tree, want = _state(family, layout, source)
    arrays = shard_tree(tree)
    model = _destination(family, layout, want, dtype)
    rule_list = rules.preset(family, arrays, source=source, layout=layout, tp=TP,
                             cast=None if dtype == "float32" else dtype)
    jax_amem.swap(arrays, _tensors(model, want), rules=rule_list)
    _check_params(model, want, dtype)
    if layout == "hf":
        _check_logits(family, model, want, dtype)


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
    """A maxtext tree on one device into HF and vLLM-style bf16 models on `torch_device`."""
    for layout in ("hf", "vllm"):
        tree, want = _state(family, layout, "maxtext")
        arrays = jax.device_put(tree, jax_device)
        model = _destination(family, layout, want, "bfloat16").to(torch_device)
        jax_amem.swap(arrays, _tensors(model, want),
                      rules=rules.preset(family, arrays, source="maxtext", layout=layout, tp=TP, cast="bfloat16"))
        _check_params(model.cpu(), want, "bfloat16")


def test_single_device_swap_body_on_cpu():
    """The GPU test's body, run here on one CPU device (so the GPU run meets no surprise)."""
    _swap_on("qwen3_moe", jax.devices("cpu")[0], "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("family", M.FAMILIES)
def test_preset_swaps_into_cuda_models(family):
    """On a GPU: maxtext tree on the GPU, HF and vLLM-style models on CUDA, bf16, bit-exact."""
    _swap_on(family, jax.devices("gpu")[0], "cuda")
