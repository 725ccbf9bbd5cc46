"""Rules traced from users' own exporters for fourteen more transformers families
(more_families.py), swapped into the real models: every tensor bit-identical to the oracle
(`load_state_dict` of the same exporter run under numpy), and the logits equal. Sources are
sharded over 8 CPU devices; tied heads are written once through the embedding."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem.reshard import rules

from more_families import FAMILIES, V, Ops, hf_model, source_tree
from reshard_oracle import shard_tree

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOKENS = np.random.default_rng(3).integers(0, V, (2, 9))


def _family(name):
    family = FAMILIES[name]
    if not hasattr(transformers, family.name + "ForCausalLM"):
        pytest.skip(f"this transformers ({transformers.__version__}) has no {family.name}ForCausalLM")
    return family


def _rules_for(family, tree, cast=None):
    ops = Ops(jnp)
    if family.layer_convert is None:
        return rules.from_function(lambda p: family.convert(p, ops), tree, cast=cast)
    layer = lambda one: {k: v for k, v in family.layer_convert(one, ops).items()}
    return (rules.from_function(lambda p: family.convert(p, ops), tree, cast=cast)
            + rules.from_layer_function(layer, tree, "layers", family.prefix, cast=cast))


def _numpy_state(family, tree):
    """The exporter under numpy: the state dict the oracle loads."""
    ops = Ops(np)
    out = dict(family.convert(tree, ops))
    if family.layer_convert is not None:
        count = jax.tree_util.tree_leaves(tree["layers"])[0].shape[0]
        for i in range(count):
            one = jax.tree_util.tree_map(lambda x: x[i], tree["layers"])
            out.update({family.prefix.format(i) + k: v for k, v in family.layer_convert(one, ops).items()})
    return out


def _oracle(family, tree, dtype, device="cpu"):
    model = hf_model(family).to(dtype)
    state = _numpy_state(family, tree)
    given = model.state_dict()
    for name, tensor in given.items():  # a tied head the exporter left to the embedding
        if name not in state:
            twin = next(n for n, t in given.items() if n in state and t.data_ptr() == tensor.data_ptr())
            state[name] = state[twin]
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, strict=True)
    return model.to(device)


def _bits(tensor):
    return tensor.detach().float().contiguous().view(torch.int32) if tensor.dtype != torch.bfloat16 else \
        tensor.detach().contiguous().view(torch.int16)


def _logits(model):
    device = next(model.parameters()).device
    with torch.no_grad():
        return model(torch.as_tensor(TOKENS, device=device)).logits.float().cpu().numpy()


def _swap_and_compare(family, dtype=torch.float32, cast=None, seeds=(0,), device="cpu"):
    """`device` "cpu": sources sharded over the 8 CPU devices; "cuda": the model on the GPU and
    the sources on JAX's first GPU (the swap writes the CUDA tensors by address)."""
    model = hf_model(family, nan=True).to(dtype).to(device)
    dst = model.state_dict()
    place = shard_tree if device == "cpu" else (lambda tree: jax.device_put(tree, jax.devices("gpu")[0]))
    for seed in seeds:  # a second seed: the next version through the cached plan and program
        tree = source_tree(family, seed)
        oracle = _oracle(family, tree, dtype, device)
        report = jax_amem.swap(place(tree), dst, rules=_rules_for(family, tree, cast), verify=True)
        assert report.verified
        want = oracle.state_dict()
        assert sorted(want) == sorted(dst)
        for name, tensor in want.items():
            assert torch.equal(_bits(dst[name]), _bits(tensor)), name
        np.testing.assert_array_equal(_logits(model), _logits(oracle))
    unique = {t.data_ptr() for t in dst.values()}
    assert report.buffers == len(unique)  # each tied pair written once


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_traced_rules_swap_a_family_bit_identical_to_load_state_dict(name):
    _swap_and_compare(_family(name))


def test_a_family_in_bfloat16_with_the_cast_on_the_sender_and_a_second_version():
    _swap_and_compare(_family("Qwen2"), dtype=torch.bfloat16, cast="bfloat16", seeds=(0, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["OPT", "Bloom", "Gemma3", "Qwen2Moe"])
def test_a_family_into_cuda_tensors_tied_head_included(name):
    # Tied twins on CUDA: one buffer written once by address, its twin name covered.
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")
    _swap_and_compare(_family(name), dtype=torch.bfloat16, cast="bfloat16", seeds=(0, 1), device="cuda")
