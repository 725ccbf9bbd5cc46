"""Families the other tests do not use (hostile_families.py: Gemma2 from MaxText with its norm
offset, embedding normaliser, query scaling and paired layers; Gemma in bfloat16 with float64
constants; Mistral's consolidated checkpoint with the converter's rotary permutation), through
`rules.from_function` on the exporter as written and swapped into the real transformers model:
every tensor bit-identical to the model loaded with the exporter's own output (run eagerly by
JAX), and the logits equal."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem.reshard import rules

from hostile_families import FAMILIES, V, hf_model, source_tree
from reshard_oracle import shard_tree

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOKENS = np.random.default_rng(5).integers(0, V, (2, 11))   # longer than Gemma2's sliding window


def _family(name):
    family = FAMILIES[name]
    if not hasattr(transformers, family.name + "ForCausalLM"):
        pytest.skip(f"this transformers ({transformers.__version__}) has no {family.name}ForCausalLM")
    return family


def _torch_dtype(family):
    return getattr(torch, family.dtype)


def _oracle(family, tree):
    """The model loaded with what the exporter gives when JAX runs it eagerly."""
    model = hf_model(family).to(_torch_dtype(family))
    state = family.convert(jax.tree.map(jnp.asarray, tree), jnp)
    given = model.state_dict()
    for name, tensor in given.items():   # a tied head the exporter left to the embedding
        if name not in state:
            twin = next(n for n, t in given.items() if n in state and t.data_ptr() == tensor.data_ptr())
            state[name] = state[twin]
    model.load_state_dict({k: torch.from_numpy(np.array(v.astype(jnp.float32))).to(_torch_dtype(family))
                           for k, v in state.items()}, strict=True)
    return model


def _bits(tensor):
    t = tensor.detach().contiguous()
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def _logits(model):
    with torch.no_grad():
        return model(torch.as_tensor(TOKENS)).logits.float().numpy()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_an_exporter_with_constants_swaps_bit_identical_to_loading_its_output(name):
    family = _family(name)
    model = hf_model(family).to(_torch_dtype(family))
    dst = model.state_dict()
    for seed in (0, 1):   # a second version through the cached plan
        tree = source_tree(family, seed)
        traced = rules.from_function(lambda p: family.convert(p, jnp), tree)
        report = jax_amem.swap(shard_tree(tree), dst, rules=traced, verify=True)
        assert report.verified
        oracle = _oracle(family, tree)
        want = oracle.state_dict()
        assert sorted(want) == sorted(dst)
        for key, tensor in want.items():
            assert torch.equal(_bits(dst[key]), _bits(tensor)), key
        np.testing.assert_array_equal(_logits(model), _logits(oracle))
