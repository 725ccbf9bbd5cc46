"""Tied weights in a PyTorch state dict: `lm_head.weight` and the embedding are one tensor
under two names (OPT, Bloom, Gemma, Falcon... tie them by default). The swap writes such twins
once, whichever of the names the rules write; different values for one buffer, views that
overlap only in part, and a plan writing both names are refused before a byte moves."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem import reshard
from jax_amem.reshard import rules
from jax_amem.swapping import SwapError

torch = pytest.importorskip("torch")

V, D = 12, 8


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(V, D)
        self.norm = torch.nn.LayerNorm(D)
        self.lm_head = torch.nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.embed.weight  # what tie_word_embeddings does


def tied_state_dict():
    model = Tied()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["embed.weight"].data_ptr()
    return model, state


def params(seed=0):
    rng = np.random.default_rng(seed)
    return {"embed": jnp.asarray(rng.standard_normal((V, D)), jnp.float32),
            "scale": jnp.asarray(rng.standard_normal(D), jnp.float32),
            "bias": jnp.asarray(rng.standard_normal(D), jnp.float32),
            "other": jnp.asarray(rng.standard_normal((V, D)), jnp.float32)}


def convert(with_head: str | None):
    def f(p):
        out = {"embed.weight": p["embed"], "norm.weight": p["scale"], "norm.bias": p["bias"]}
        if with_head == "same":
            out["lm_head.weight"] = p["embed"]
        elif with_head == "other":
            out["lm_head.weight"] = p["other"]
        return out
    return f


def assert_holds(state, p):
    np.testing.assert_array_equal(state["embed.weight"].numpy(), np.asarray(p["embed"]))
    np.testing.assert_array_equal(state["lm_head.weight"].numpy(), np.asarray(p["embed"]))
    np.testing.assert_array_equal(state["norm.weight"].numpy(), np.asarray(p["scale"]))
    np.testing.assert_array_equal(state["norm.bias"].numpy(), np.asarray(p["bias"]))


def test_twins_written_alike_are_one_buffer_written_once():
    _, state = tied_state_dict()
    p = params()
    report = jax_amem.swap(p, state, rules=rules.from_function(convert("same"), p), verify=True)
    assert report.verified
    assert report.buffers == 3                      # embed (= lm_head), norm.weight, norm.bias
    assert report.bytes == (V * D + 2 * D) * 4      # the tied matrix counted once
    assert_holds(state, p)


@pytest.mark.parametrize("written", ["embed.weight", "lm_head.weight"])
def test_either_twin_alone_writes_both_names(written):
    _, state = tied_state_dict()
    p = params(1)
    out = convert(None)
    if written == "lm_head.weight":
        out = lambda q: {**{k: v for k, v in convert(None)(q).items() if k != "embed.weight"},
                         "lm_head.weight": q["embed"]}
    report = jax_amem.swap(p, state, rules=rules.from_function(out, p))
    assert report.buffers == 3
    assert_holds(state, p)
    second = params(2)  # the next version through the cached plan and program
    jax_amem.swap(second, state, rules=rules.from_function(out, second))
    assert_holds(state, second)


def test_same_names_rules_none_write_a_tied_twin_once():
    _, state = tied_state_dict()
    p = params(3)
    src = {"embed.weight": p["embed"], "norm.weight": p["scale"], "norm.bias": p["bias"]}
    report = jax_amem.swap(src, state)
    assert report.buffers == 3
    assert_holds(state, p)


def test_twins_written_with_different_values_are_refused_untouched():
    _, state = tied_state_dict()
    p = params(4)
    with pytest.raises(SwapError, match=r"destinations 'embed.weight' and 'lm_head.weight' share memory: they are "
                                        r"one tensor \(tied weights.*write different values.*drop the other's rule"):
        jax_amem.swap(p, state, rules=rules.from_function(convert("other"), p))
    assert all(torch.isnan(t).all() for t in state.values())


def test_untying_after_a_swap_is_seen_not_served_from_the_cache():
    """The tie is part of the destination's signature: once the head is a tensor of its own,
    rules that write only the embedding leave it unwritten, which is refused by name."""
    model, state = tied_state_dict()
    p = params(5)
    only_embed = rules.from_function(convert(None), p)
    jax_amem.swap(p, state, rules=only_embed)
    untied = dict(state, **{"lm_head.weight": torch.full((V, D), 7.0)})
    with pytest.raises(SwapError, match=r"1 destination\(s\) that nothing writes.*'lm_head.weight'"):
        jax_amem.swap(params(6), untied, rules=only_embed)
    assert torch.equal(untied["lm_head.weight"], torch.full((V, D), 7.0))
    assert_holds(state, p)


@pytest.mark.parametrize("views", ["overlap", "reshaped", "offset"])
def test_views_that_are_not_twins_are_still_refused(views):
    """Only the same tensor twice is a twin: partly overlapping views, one storage seen with
    another shape, or at another offset keep the overlap error, and nothing is written."""
    base = torch.full((V * D,), 7.0)
    src = {"a": jnp.arange(32, dtype=jnp.float32), "b": jnp.arange(32, dtype=jnp.float32) + 100}
    dst = {"overlap": {"a": base[0:32], "b": base[16:48]},
           "reshaped": {"a": base[0:32], "b": base[0:32].view(4, 8)},
           "offset": {"a": base[0:32], "b": base[1:33]}}[views]
    if views == "reshaped":
        src["b"] = src["b"].reshape(4, 8)
    with pytest.raises(SwapError, match=r"destinations '(a|b)' and '(a|b)' share memory \(tied weights, or views"):
        jax_amem.swap(src, dst)
    assert torch.equal(base, torch.full((V * D,), 7.0))


def test_a_plan_that_writes_both_twins_is_refused():
    _, state = tied_state_dict()
    p = params(7)
    from jax_amem.swapping.destinations import TorchDestination
    layouts = TorchDestination(state).layouts()  # every name, twins included
    plan = reshard.plan(reshard.layouts_of(p), layouts, rules.from_function(convert("same"), p))
    with pytest.raises(SwapError, match=r"the plan writes 'embed.weight' and 'lm_head.weight', which are one tensor"):
        jax_amem.swap(p, state, plan=plan)
    assert all(torch.isnan(t).all() for t in state.values())


def test_nested_output_names_get_a_flattening_hint():
    """A conversion returning {'norm': {'weight': ...}} names its outputs 'norm/weight'; the
    missing-names error says so and how to flatten."""
    _, state = tied_state_dict()
    p = params(8)
    nested = lambda q: {"embed": {"weight": q["embed"]}, "norm": {"weight": q["scale"], "bias": q["bias"]}}
    with pytest.raises(SwapError, match=r"missing 3 destination\(s\).*'embed/weight'.*The rules name 'embed/weight' "
                                        r"where the destination is 'embed.weight'.*nested tree.*tree_names\(out\)"):
        jax_amem.swap(p, state, rules=rules.from_function(nested, p))
    layouts = {n: reshard.Layout.single((V, D) if n == "embed.weight" else (D,), np.float32, (0, 0))
               for n in ("embed.weight", "norm.weight", "norm.bias")}
    with pytest.raises(reshard.RuleError, match=r"writes destination 'embed/weight'.*The rules name 'embed/weight' "
                                                r"where the destination is 'embed.weight'.*tree_names\(out\)"):
        reshard.plan(reshard.layouts_of(p), layouts, rules.from_function(nested, p))  # the planner says it too
    flat = lambda q: {k.replace("/", "."): v for k, v in reshard.tree_names(nested(q)).items()}
    jax_amem.swap(p, state, rules=rules.from_function(flat, p))
    assert_holds(state, p)


def test_one_array_under_both_twin_names_with_rules_none_is_written_once():
    """The trainer's tree gives the tied matrix under both state-dict names (one jax.Array):
    the same values, so one buffer written once, not refused as 'different values'."""
    _, state = tied_state_dict()
    p = params(9)
    src = {"embed.weight": p["embed"], "lm_head.weight": p["embed"], "norm.weight": p["scale"],
           "norm.bias": p["bias"]}
    report = jax_amem.swap(src, state)
    assert report.buffers == 3 and report.bytes == (V * D + 2 * D) * 4
    assert_holds(state, p)


def test_a_twin_written_as_a_concatenation_of_its_halves_is_the_same_values():
    _, state = tied_state_dict()
    p = params(10)
    halves = lambda q: {**convert("same")(q),
                        "lm_head.weight": jnp.concatenate([q["embed"][:V // 2], q["embed"][V // 2:]], axis=0)}
    report = jax_amem.swap(p, state, rules=rules.from_function(halves, p))
    assert report.buffers == 3
    assert_holds(state, p)


def test_two_distinct_arrays_with_equal_values_are_still_different_sources():
    """Same values means the same source elements: two arrays are two sources, whatever they hold
    now (the next version may differ), so the twins' rules are refused as different."""
    _, state = tied_state_dict()
    p = params(11)
    src = {"embed.weight": p["embed"], "lm_head.weight": p["embed"] + 0, "norm.weight": p["scale"],
           "norm.bias": p["bias"]}
    with pytest.raises(SwapError, match=r"write different values into them"):
        jax_amem.swap(src, state)
    assert all(torch.isnan(t).all() for t in state.values())
