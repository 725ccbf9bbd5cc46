"""Rules: a Flax-style Llama tree (stacked or per layer) into Hugging Face names and vLLM's fused
tensor-parallel layout, checked value by value; names and shapes checked against transformers."""

import ml_dtypes
import numpy as np
import pytest

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_amem import reshard
from jax_amem.reshard import Layout, Owner, Part, Rule, numpy_exec, rules

L, D, H, KV, HD, F, V = 2, 16, 4, 2, 4, 24, 32
TP = 2


def flax_tree(stacked: bool, rng):
    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32)
    layer = lambda *shape: w(L, *shape) if stacked else None
    per = {"attn": {"q": {"kernel": (D, H * HD), "bias": (H * HD,)}, "k": {"kernel": (D, KV * HD), "bias": (KV * HD,)},
                    "v": {"kernel": (D, KV * HD), "bias": (KV * HD,)}, "o": {"kernel": (H * HD, D)}},
           "mlp": {"gate": {"kernel": (D, F)}, "up": {"kernel": (D, F)}, "down": {"kernel": (F, D)}},
           "input_norm": {"scale": (D,)}, "post_attn_norm": {"scale": (D,)}}
    make = lambda tree, fn: {k: make(v, fn) if isinstance(v, dict) else fn(v) for k, v in tree.items()}
    layers = make(per, lambda s: layer(*s)) if stacked else {str(i): make(per, lambda s: w(*s)) for i in range(L)}
    return {"embed": {"embedding": w(V, D)}, "layers": layers, "final_norm": {"scale": w(D)},
            "lm_head": {"kernel": w(D, V)}}


def hf_expected(tree, stacked, fused):
    """The Hugging Face tensors, computed directly in numpy."""
    get = (lambda i, path: _at(tree["layers"], path)[i]) if stacked else (lambda i, path: _at(tree["layers"][str(i)], path))
    out = {"model.embed_tokens.weight": tree["embed"]["embedding"], "model.norm.weight": tree["final_norm"]["scale"],
           "lm_head.weight": tree["lm_head"]["kernel"].T}
    for i in range(L):
        p = f"model.layers.{i}."
        hf = {"self_attn.q_proj.weight": get(i, "attn/q/kernel").T, "self_attn.k_proj.weight": get(i, "attn/k/kernel").T,
              "self_attn.v_proj.weight": get(i, "attn/v/kernel").T, "self_attn.o_proj.weight": get(i, "attn/o/kernel").T,
              "self_attn.q_proj.bias": get(i, "attn/q/bias"), "self_attn.k_proj.bias": get(i, "attn/k/bias"),
              "self_attn.v_proj.bias": get(i, "attn/v/bias"),
              "mlp.gate_proj.weight": get(i, "mlp/gate/kernel").T, "mlp.up_proj.weight": get(i, "mlp/up/kernel").T,
              "mlp.down_proj.weight": get(i, "mlp/down/kernel").T,
              "input_layernorm.weight": get(i, "input_norm/scale"),
              "post_attention_layernorm.weight": get(i, "post_attn_norm/scale")}
        if fused:
            for name, members in rules.FUSED.items():
                # per tensor-parallel rank: that rank's slice of each member, in order
                chunks = {m: np.array_split(hf.pop(m), TP) for m in members}
                hf[name] = np.concatenate([chunks[m][r] for r in range(TP) for m in members])
        out.update({p + k: v for k, v in hf.items()})
    return out


def _at(tree, path):
    for key in path.split("/"):
        tree = tree[key]
    return tree


def rollout_layout(name, shape, dtype, owners):
    """vLLM-style: column-parallel split dim 0, row-parallel (o_proj, down_proj) dim 1, norms replicated."""
    if "norm" in name or "layernorm" in name:
        return Layout.replicated(shape, dtype, owners)
    dim = 1 if ("o_proj" in name or "down_proj" in name) else 0
    return Layout.tensor_parallel(shape, dtype, dim, TP, owners)


@pytest.mark.parametrize("stacked,fused,cast", [(True, True, None), (False, False, "bfloat16"), (True, False, None),
                                                (False, True, "float8_e4m3fn")])
def test_hf_llama_rules_move_the_right_values(stacked, fused, cast):
    rng = np.random.default_rng(0)
    tree = flax_tree(stacked, rng)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("fsdp", "tp"))
    spec = lambda x: P(*([None] * (x.ndim - 2) + ["fsdp", "tp"])) if x.ndim >= 2 else P("tp")
    arrays = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, spec(x))), tree)
    want = hf_expected(tree, stacked, fused)
    dtype = np.dtype(cast) if cast else np.dtype(np.float32)
    owners = [Owner(1, 8 + i) for i in range(2 * TP)]  # two rollout replicas on another host
    dst = {k: rollout_layout(k, v.shape, dtype, owners) for k, v in want.items()}
    rule_list = rules.hf_qwen2(L, tp=TP, stacked=stacked, fused_qkv=fused, fused_gate_up=fused, cast=cast)
    planner = reshard.Planner(arrays, dst, rule_list, split_bytes=64)
    plan = planner.plan(cache=False).check()
    ref = planner.plan(planner="reference", cache=False)
    np.testing.assert_array_equal(plan.blocks, ref.blocks)
    sources = {}
    for name, leaf in reshard.tree_names(arrays).items():
        sources.update(numpy_exec.shards_of(name, leaf))
    out = numpy_exec.execute(plan, sources)
    for name, full in want.items():
        for owner in owners:
            expected = np.ascontiguousarray(full.astype(dtype)[dst[name].shard_slices(owner)])
            assert np.array_equal(out[(name, owner)].view(np.uint8), expected.view(np.uint8)), (name, owner)


def test_hf_names_and_shapes_match_transformers():
    pytest.importorskip("torch")  # transformers imports without it, but builds no model
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L,
                                      num_attention_heads=H, num_key_value_heads=KV, head_dim=HD,
                                      tie_word_embeddings=False)
    model = transformers.Qwen2ForCausalLM(config)
    hf = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    ours = {k: v.shape for k, v in hf_expected(flax_tree(True, np.random.default_rng(1)), True, False).items()}
    assert ours == hf


def test_a_rule_that_misses_or_doubles_a_region_names_it():
    src = {"a": Layout.single((4, 6), np.float32, (0, 0)), "b": Layout.single((2, 6), np.float32, (0, 0))}
    dst = {"ab": Layout.single((8, 6), np.float32, (0, 1))}
    with pytest.raises(reshard.RuleError, match=r"'ab': region \[6:8, 0:6\] is not covered"):
        reshard.plan(src, dst, [Rule.concat("ab", [Part("a"), Part("b")])])
    pieces = [reshard.Piece("ab", (0, 0), (4, 6), "a", (0, 0)), reshard.Piece("ab", (3, 0), (2, 6), "b", (0, 0)),
              reshard.Piece("ab", (5, 0), (3, 6), "a", (0, 0))]
    with pytest.raises(reshard.RuleError, match=r"'ab': region \[3:4, 0:6\] is covered twice"):
        reshard.plan(src, dst, pieces)
    with pytest.raises(reshard.RuleError, match="'ab'.*part 'b' gives shape"):
        reshard.plan(src, dst, [Rule.concat("ab", [Part("a"), Part("b", transpose=(1, 0))])])
    with pytest.raises(reshard.RuleError, match="expected source 'zz'"):
        reshard.plan(src, dst, [Rule.copy("ab", "zz")])
    with pytest.raises(reshard.RuleError, match="destination 'ab'.*not covered by any rule"):
        reshard.plan(src, dst, [])


@pytest.mark.parametrize("build", [rules.hf_llama, rules.hf_qwen2])
def test_a_layer_count_whose_rules_cannot_fit_in_memory_is_refused_at_once(build):
    with pytest.raises(reshard.RuleError, match=r"num_layers=1180591620717411303424 needs .* GiB of rules, more than "
                                        r"this host's .* GiB of memory"):
        build(2**70)
    assert len(build(3)) == 3 * (9 + 3 * (build is rules.hf_qwen2)) + 3
