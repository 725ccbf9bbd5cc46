"""`rules.preset` for every family and source with hostile options and trees: tp of the wrong
kind or range (0, negative, a string, a float, a bool, None, one that does not divide the heads),
trees whose layers sit on another axis, lack a tensor, or disagree on the layer count. Each is
refused at preset() with a RuleError naming the preset (and the option or tensor), never with
Python's own error or rules that plan wrongly later."""

import copy

import numpy as np
import pytest

import jax_amem
from jax_amem.errors import RuleError
from jax_amem.reshard import rules

import maxtext_exporter as mx
import preset_models as pm

WEIGHTS = {family: pm.logical(family, np.random.default_rng(0)) for family in pm.FAMILIES}


def _trees():
    return [(family, "flax") for family in pm.FAMILIES] + [(family, "maxtext") for family in mx.FAMILIES]


def _tree(family, source):
    w = WEIGHTS[family]
    return pm.source_tree(family, "flax", w) if source == "flax" else mx.maxtext_tree(family, w, 1)


def _refused(family, source, tree, match, **options):
    options = {"layout": "vllm", "tp": 2, "head_dim": pm.HD, **options}
    who = rf"preset '{family}' \(source='{source}', layout='{options['layout']}'\)"
    with pytest.raises(RuleError, match=who + match):
        rules.preset(family, tree, source=source, **options)


@pytest.mark.parametrize("family,source", _trees())
@pytest.mark.parametrize("tp", [0, -1, "2", 2.0, True, None, np.float64(2)])
def test_a_tp_of_the_wrong_kind_is_refused_by_name(family, source, tp):
    _refused(family, source, _tree(family, source), rf": tp={tp!r} is not a tensor-parallel size: give an int >= 1"
             .replace("(", r"\(").replace(")", r"\)"), tp=tp)


@pytest.mark.parametrize("family,source", _trees())
def test_a_tp_that_does_not_divide_the_heads_or_is_given_to_whole_tensors(family, source):
    tree = _tree(family, source)
    with pytest.raises(RuleError, match=rf"preset '{family}' .*tp=3"):
        rules.preset(family, tree, source=source, layout="vllm", tp=3, head_dim=pm.HD)
    _refused(family, source, tree, r": tp=2 applies to the 'vllm' layout's fused tensors", layout="hf")


@pytest.mark.parametrize("family,source", _trees())
def test_a_tree_the_preset_does_not_fit_is_refused_by_name(family, source):
    tree = _tree(family, source)
    names = jax_amem.reshard.tree_names(tree)
    stacked = sorted(n for n, v in names.items() if v.ndim >= 2 and ("layers" in n or "dense" in n or "moe" in n))
    axis = 0 if source == "flax" else 1

    def edited(name, change):
        out = copy.deepcopy(tree)
        node = out
        *heads, leaf = name.split("/")
        for key in heads:
            node = node[key]
        if change is None:
            del node[leaf]
        else:
            node[leaf] = change(node[leaf])
        return out

    one_more = edited(stacked[0], lambda x: np.concatenate([x, np.take(x, [0], axis=axis)], axis=axis))
    with pytest.raises(RuleError, match=rf"preset '{family}'"):
        rules.preset(family, one_more, source=source, layout="hf")
    with pytest.raises(RuleError, match=rf"preset '{family}'") as missing:
        rules.preset(family, edited(stacked[-1], None), source=source, layout="hf")
    assert stacked[-1] in str(missing.value)
    with pytest.raises(RuleError, match=rf"preset '{family}'"):
        rules.preset(family, edited(stacked[0], lambda x: np.moveaxis(x, axis, -1)), source=source, layout="hf")
