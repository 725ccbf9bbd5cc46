"""The demo's two models: the Flax policy and the transformers rollout built from the same config
give the same logits once jax_amem.swap has written the trainer's (FSDP-sharded) weights into the
rollout's own tensors; a weight the swap did not write, or a wrong one, shows."""

import dataclasses
import functools

import numpy as np
import pytest

import jax

import jax_amem

pytest.importorskip("flax")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from jax_amem import reshard  # noqa: E402
from jax_amem.demo import PolicyConfig, loop, policy, rollout, sharding, weights  # noqa: E402
from jax_amem.demo.loop import LOGITS_TOLERANCE  # noqa: E402

pytestmark = pytest.mark.usefixtures("never_left_paused")

CONFIGS = {
    "gqa": PolicyConfig(),
    "mha-1-layer": PolicyConfig(num_layers=1, num_kv_heads=4, rope_theta=500.0),
    "mqa-3-layers": PolicyConfig(num_layers=3, num_heads=4, num_kv_heads=1, head_dim=8,
                                 hidden_size=48, intermediate_size=96, rms_norm_eps=1e-5),
}


@functools.lru_cache(maxsize=None)
def trainer_side(name: str):
    """(config, FSDP-sharded params): built once per config (compiling the init takes seconds)."""
    mesh = sharding.trainer_mesh()
    # A larger init than the demo's, so the logits differ clearly from token to token.
    config = dataclasses.replace(CONFIGS[name], init_std=0.2)
    return config, policy.init_params(config, 0, lambda tree: sharding.fsdp_shardings(tree, mesh))


def both_models(name: str):
    """(config, params, a fresh NaN-filled rollout model)."""
    config, params = trainer_side(name)
    return config, params, rollout.build_rollout_model(config)


def tokens(config, batch=3, length=11, seed=1):
    return np.random.default_rng(seed).integers(0, config.vocab_size, (batch, length)).astype(np.int32)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_equal_after_the_swap(name):
    config, params, model = both_models(name)
    report = weights.swap_weights(params, rollout.rollout_tensors(model), weights.swap_rules(config))
    assert report.bytes == sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
    x = tokens(config)
    expected = np.asarray(policy.exact_logits_fn(config)(params, x))
    got = rollout.logits(model, x)
    assert expected.shape == got.shape == (3, 11, config.vocab_size)
    assert np.abs(expected).max() > 0.5  # logits of real size, not all near zero
    assert np.abs(expected - got).max() <= LOGITS_TOLERANCE * np.abs(expected).max()


def test_parameters_are_fsdp_sharded_over_every_device():
    config, params, _ = both_models("gqa")
    q = params["layers"]["attn"]["q"]["kernel"]
    assert q.shape == (config.num_layers, config.hidden_size, config.num_heads * config.head_dim)
    assert len(q.sharding.device_set) == len(jax.devices())
    assert q.addressable_shards[0].data.shape[1] == config.hidden_size // len(jax.devices())


def test_every_rollout_weight_comes_from_the_swap():
    config, params, model = both_models("gqa")
    tensors = rollout.rollout_tensors(model)
    assert all(torch.isnan(t).all() for t in tensors.values())  # built NaN: nothing of its own
    names = {r.dst for r in weights.swap_rules(config)}
    assert names == set(tensors)
    weights.swap_weights(params, tensors, weights.swap_rules(config))
    assert not any(torch.isnan(t).any() for t in tensors.values())


def test_the_swap_writes_in_place():
    config, params, model = both_models("gqa")
    tensors = rollout.rollout_tensors(model)
    pointers = {n: t.data_ptr() for n, t in tensors.items()}
    weights.swap_weights(params, tensors, weights.swap_rules(config))
    assert {n: t.data_ptr() for n, t in model.named_parameters()} == pointers
    np.testing.assert_array_equal(tensors["model.layers.1.self_attn.q_proj.weight"].detach().cpu().numpy(),
                                  np.asarray(params["layers"]["attn"]["q"]["kernel"])[1].T)


def test_the_logits_check_fails_on_a_wrong_weight():
    config, params, model = both_models("gqa")
    tensors = rollout.rollout_tensors(model)
    weights.swap_weights(params, tensors, weights.swap_rules(config))

    class Side:  # what check_logits reads from the trainer and the rollout
        pass

    trainer, roll = Side(), Side()
    trainer.logits = lambda t: np.asarray(policy.exact_logits_fn(config)(params, t))
    roll.model = model
    assert loop.check_logits(trainer, roll, tokens(config), 0).ok
    with torch.no_grad():
        tensors["model.layers.0.mlp.up_proj.weight"][3, 5] += 0.05
    bad = loop.check_logits(trainer, roll, tokens(config), 7)
    assert not bad.ok and bad.iteration == 7 and bad.relative > LOGITS_TOLERANCE


def test_baselines_write_what_the_swap_writes():
    config, params, model = both_models("mqa-3-layers")
    rules = weights.swap_rules(config)
    tensors = rollout.rollout_tensors(model)
    weights.swap_weights(params, tensors, rules)
    expected = {n: t.detach().clone() for n, t in tensors.items()}
    for baseline in (weights.per_tensor_copy, weights.device_put_copy):
        with torch.no_grad():
            for t in tensors.values():
                t.fill_(float("nan"))
        baseline(params, tensors, rules)
        for name, t in tensors.items():
            assert torch.equal(t, expected[name]), (baseline.__name__, name)


def test_baselines_refuse_fused_rules():
    config, params, model = both_models("gqa")
    fused = reshard.rules.hf_llama(config.num_layers, fused_qkv=True)
    with pytest.raises(ValueError, match="concatenates 3"):
        weights.per_tensor_copy(params, {}, fused)


def test_config_errors_name_the_setting():
    with pytest.raises(ValueError, match=r"num_heads \(6\) must be a multiple of num_kv_heads \(4\)"):
        PolicyConfig(num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match=r"head_dim \(7\) must be even"):
        PolicyConfig(head_dim=7)


def test_llama_config_matches_the_policy():
    config = CONFIGS["mqa-3-layers"]
    llama = config.to_llama_config()
    assert (llama.hidden_size, llama.num_hidden_layers, llama.num_attention_heads, llama.num_key_value_heads,
            llama.head_dim, llama.intermediate_size, llama.rms_norm_eps) == (48, 3, 4, 1, 8, 96, 1e-5)
    assert llama.tie_word_embeddings is False and llama.hidden_act == "silu"


def test_generation_is_seeded_and_keeps_the_prompt():
    config, params, model = both_models("gqa")
    weights.swap_weights(params, rollout.rollout_tensors(model), weights.swap_rules(config))
    prompts = tokens(config, batch=4, length=5)
    a = rollout.generate(model, prompts, 6, seed=3)
    b = rollout.generate(model, prompts, 6, seed=3)
    c = rollout.generate(model, prompts, 6, seed=4)
    assert a.shape == (4, 11) and a.dtype == np.int32
    np.testing.assert_array_equal(a[:, :5], prompts)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
