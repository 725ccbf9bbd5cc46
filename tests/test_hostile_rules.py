"""Hand-written rules with hostile fields (`Part`, `Rule`: names, indices, transposes, shapes,
casts, scale / offset, along, replicas, axis, groups) and the options of the rule builders that
name a dtype (`preset(cast=)`, `from_function(cast=)`) or a flag (`preset(tie_embeddings=)`).

Each is refused where the rule is made or planned, with a family error naming the field and
what to give, and the destination untouched; the values that were read as something else
before (a string as a number, a 2-D constant flattened, a bool as 1, a float index truncated,
an axis past the rank wrapped around) are among them. The good forms still swap exactly."""

import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem.errors import AffineError, RuleError, SwapError, TraceError
from jax_amem.reshard import rules
from jax_amem.reshard.rules import Part, Rule

torch = pytest.importorskip("torch")

SRC = {"w": jnp.arange(24.0, dtype=jnp.float32).reshape(2, 3, 4)}


def _refused_untouched(make, shape, error, match):
    """`make()` (rules) refused, at once or by the swap, with `error` matching `match`; the
    destination keeps its bytes."""
    dst = {"w": torch.full(shape, -7.0)}
    with pytest.raises(error, match=match):
        jax_amem.swap(SRC, dst, rules=make())
    assert torch.equal(dst["w"], torch.full(shape, -7.0))


@pytest.mark.parametrize("field,value,match", [
    ("index", ("0",), r"part 'w': index=\('0',\) holds '0' \(str\), not an int: give the leading indices"),
    ("index", (0.0,), r"index=\(0.0,\) holds 0.0 \(float\), not an int"),
    ("index", (True,), r"index=\(True,\) holds True \(bool\), not an int"),
    ("transpose", "10", r"part 'w': transpose='10' is not a tuple of ints: give a permutation"),
    ("transpose", (1.0, 0), r"transpose=\(1.0, 0\) holds 1.0 \(float\)"),
    ("shape", (3.0, 4), r"part 'w': shape=\(3.0, 4\) holds 3.0 \(float\), not an int: give the row-major shape"),
    ("cast", "nope", r"part 'w': cast='nope' is not a dtype a weight is sent in: give a dtype name"),
    ("cast", "complex64", r"cast='complex64' \(complex64\) is not a dtype a weight is sent in"),
    ("cast", object(), r"cast=<object object .*> is not a dtype"),
    ("along", "0", r"part 'w': along='0' \(str\) is not an axis: give an int"),
    ("along", 0.0, r"along=0.0 \(float\) is not an axis"),
    ("along", True, r"along=True \(bool\) is not an axis"),
])
def test_a_part_field_of_the_wrong_kind_is_refused_by_name(field, value, match):
    fields = {"index": (0,), "scale": (1.0, 2.0, 3.0, 4.0) if field == "along" else None, field: value}
    with pytest.raises(RuleError, match=match):
        Part("w", **fields)
    _refused_untouched(lambda: [Rule.copy("w", **fields)], (3, 4), RuleError, match)


@pytest.mark.parametrize("value,match", [
    ("2", r"part 'w': scale='2' is a str, not a number: give a number, or a 1-D vector"),
    (b"2", r"scale=b'2' is a bytes, not a number"),
    (True, r"scale=True is a bool, not a number"),
    (["1", "2", "3", "4"], r"scale=\['1', '2', '3', '4'\] holds strings, not real numbers"),
    (1 + 2j, r"scale=\(1\+2j\) holds complex numbers"),
    (np.complex64(2), r"holds complex numbers"),           # was: its real part, with a ComplexWarning
    ([[1.0, 2.0, 3.0, 4.0]], r"scale has shape \(1, 4\): a constant is a number or a 1-D vector"),  # was flattened
    (np.ones((4, 1)), r"scale has shape \(4, 1\)"),
    (10 ** 400, r"is larger than a float64 holds"),         # was: OverflowError
    ([1.0, None, 2.0, 3.0], r"holds None \(NoneType\), not a number"),   # was: read as NaN
    ({"a": 1}, r"holds \{'a': 1\} \(dict\), not a number"),
])
def test_a_constant_that_is_not_a_real_number_or_vector_is_refused(value, match):
    with pytest.raises(AffineError, match=match):
        Part("w", (0,), scale=value)
    _refused_untouched(lambda: [Rule.copy("w", index=(0,), offset=value)], (3, 4), AffineError,
                       match.replace("scale", "offset"))


@pytest.mark.parametrize("value,match", [
    (0, r"part 'w' has replicas=0, which is not a count of groups: give an int >= 1"),
    (-1, r"replicas=-1"), (2.0, r"replicas=2.0"), (True, r"replicas=True"),
])
def test_replicas_that_are_not_a_count(value, match):
    with pytest.raises(RuleError, match=match):
        Part("w", replicas=value)


@pytest.mark.parametrize("kwargs,match", [
    (dict(groups=0), r"the rule of 'w' has groups=0, which is not a group count: give an int >= 1"),
    (dict(groups=1.0), r"groups=1.0, which is not a group count"),    # was: TypeError from range()
    (dict(groups=True), r"groups=True, which is not a group count"),  # was: read as 1
    (dict(axis="0"), r"the rule of 'w': axis='0' \(str\) is not an axis: give an int"),
    (dict(axis=True), r"axis=True \(bool\) is not an axis"),
])
def test_a_rule_field_of_the_wrong_kind_is_refused_by_name(kwargs, match):
    with pytest.raises(RuleError, match=match):
        Rule.concat("w", [Part("w", (0,))], **kwargs)


@pytest.mark.parametrize("make,match", [
    (lambda: Rule.concat("w", "w"), r"the rule of 'w': parts holds 'w' \(str\), not a Part"),
    (lambda: Rule.concat("w", [("w", 0)]), r"parts holds \('w', 0\) \(tuple\), not a Part"),
    (lambda: Rule("w", Part("w")), r"the rule of 'w': parts=Part\(src='w'.* is not a sequence of Part"),
    (lambda: Rule(3, (Part("w"),)), r"the rule of 3: dst=3 \(int\) is not a tensor name: give a str"),
    (lambda: Part(None), r"part None: src=None \(NoneType\) is not a tensor name"),
])
def test_rule_parts_and_names_of_the_wrong_kind(make, match):
    with pytest.raises(RuleError, match=match):
        make()


def test_the_good_forms_are_kept_in_one_form():
    """numpy ints, lists and arrays are read as the tuples of ints and floats they hold, so the
    same rule written two ways is one rule (and one cached plan)."""
    a = Part("w", [np.int64(1)], transpose=np.array([1, 0]), shape=[4, 3], scale=np.float32(2), along=np.int32(0),
             replicas=np.int64(1))
    b = Part("w", (1,), transpose=(1, 0), shape=(4, 3), scale=2.0, along=0)
    assert a == b and hash(a) == hash(b)
    assert Part("w", offset=np.array([1, 2], np.int8)).offset == (1.0, 2.0)
    assert Rule.concat("w", [b], axis=np.int64(0), groups=np.int64(1)) == Rule.concat("w", (b,))


@pytest.mark.parametrize("axis,shape,ok", [(-1, (2, 6), True), (-2, (4, 3), True), (2, (2, 6), False),
                                           (5, (2, 6), False), (-3, (4, 3), False)])
def test_a_concat_axis_past_the_rank_is_refused_not_wrapped(axis, shape, ok):
    """axis=5 on a 2-D destination was read as axis 1 (5 % 2)."""
    src = {"a": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3), "b": 100 + jnp.arange(6.0).reshape(2, 3)}
    dst = {"w": torch.full(shape, -7.0)}
    rule = [Rule.concat("w", [Part("a"), Part("b")], axis=axis)]
    if ok:
        jax_amem.swap(src, dst, rules=rule)
        assert np.array_equal(dst["w"].numpy(), np.concatenate([np.asarray(src["a"]), np.asarray(src["b"])], axis))
        return
    with pytest.raises(SwapError, match=re.escape(f"destination 'w' of shape {shape}: axis={axis} is not one of its 2 axes")):
        jax_amem.swap(src, dst, rules=rule)
    assert torch.equal(dst["w"], torch.full(shape, -7.0))


@pytest.mark.parametrize("along,ok", [(-2, True), (1, True), (2, False), (4, False), (-3, False)])
def test_a_vector_along_an_axis_past_the_rank_is_refused_not_wrapped(along, ok):
    """along=4 on a (2, 3) part was read as axis 0 (4 % 2) and scaled its rows."""
    src = {"w": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)}
    values = (2.0, 3.0) if along % 2 == 0 else (2.0, 3.0, 4.0)
    dst = {"w": torch.full((2, 3), -7.0)}
    rule = [Rule.copy("w", scale=values, along=along)]
    if ok:
        jax_amem.swap(src, dst, rules=rule)
        axis = along % 2
        want = np.asarray(src["w"]) * np.asarray(values, np.float32).reshape((-1, 1) if axis == 0 else (1, -1))
        assert np.array_equal(dst["w"].numpy(), want)
        return
    with pytest.raises(SwapError, match=rf"part 'w': it has shape \(2, 3\); along={along} is not one of its 2 axes: "
                                        r"give an axis from -2 to 1"):
        jax_amem.swap(src, dst, rules=rule)
    assert torch.equal(dst["w"], torch.full((2, 3), -7.0))


def _flax_llama():
    import preset_models as pm

    return pm.source_tree("llama", "flax", pm.logical("llama", np.random.default_rng(0)))


@pytest.mark.parametrize("cast", ["nope", 3, True, "int8", "complex64", "U4", object()])
def test_a_preset_refuses_a_cast_that_is_not_a_floating_dtype(cast):
    """Accepted before, and then cast the weights to int8 or failed inside the planner."""
    with pytest.raises(RuleError, match=r"preset 'llama' \(source='flax', layout='hf'\): cast=.* is not a dtype a "
                                        r"weight is sent in: give a floating dtype"):
        rules.preset("llama", _flax_llama(), cast=cast)


@pytest.mark.parametrize("value", ["yes", None, 1, np.bool_(True)])
def test_a_preset_refuses_tie_embeddings_that_is_not_a_bool(value):
    """'yes' and 1 were read as True, None as False."""
    with pytest.raises(RuleError, match=r"preset 'llama' .*: tie_embeddings=.* is True or False"):
        rules.preset("llama", _flax_llama(), tie_embeddings=value)


@pytest.mark.parametrize("cast", ["complex64", "U5", "O", 3, True, "nope"])
def test_from_function_refuses_a_cast_that_is_not_a_weight_dtype(cast):
    """'complex64', 'U5' and 'O' are numpy dtypes, and were accepted."""
    with pytest.raises(TraceError, match=r"from_function: cast=.* is not a dtype a weight is sent in"):
        rules.from_function(lambda p: {"a": p["w"]}, {"w": np.zeros(3, np.float32)}, cast=cast)
    assert rules.from_function(lambda p: {"a": p["w"]}, {"w": np.zeros(3, np.float32)}, cast="bfloat16")



@pytest.mark.parametrize("flag", ["stacked", "fused_qkv", "fused_gate_up", "qkv_bias", "tie_embeddings"])
@pytest.mark.parametrize("value", ["no", None, 0, "False"])
def test_hf_llama_refuses_a_flag_that_is_not_a_bool(flag, value):
    """'no' and 'False' were read as True (fusing qkv, tying the head), None and 0 as False."""
    with pytest.raises(RuleError, match=rf"rules.hf_llama: {flag}=.* is True or False"):
        rules.hf_llama(2, **{flag: value})


def test_hf_llama_names_itself_for_a_bad_cast():
    """The refusal named the first Part it made ('layers/attn/q/kernel'), not the option."""
    with pytest.raises(RuleError, match=r"rules.hf_llama: cast='nope' is not a dtype a weight is sent in"):
        rules.hf_llama(2, cast="nope")


def _piece(**fields):
    from jax_amem.reshard import Piece

    args = dict(dst="w", dst_start=(0, 0), size=(2, 3), src="w", src_start=(0, 0))
    args.update(fields)
    return Piece(**args)


@pytest.mark.parametrize("fields,match", [
    (dict(dst_start=(0.0, 0)), r"Piece\('w'\): dst_start=\(0.0, 0\) holds 0.0 \(float\), not an int"),
    (dict(size="23"), r"Piece\('w'\): size='23' is not a tuple of ints: give the box's extents"),
    (dict(size=6), r"Piece\('w'\): size=6 is not a tuple of ints"),
    (dict(size=(True, 3)), r"Piece\('w'\): size=\(True, 3\) holds True \(bool\)"),
    (dict(src_start=("0", 0)), r"Piece\('w'\): src_start=\('0', 0\) holds '0' \(str\)"),
    (dict(perm="01"), r"Piece\('w'\): perm='01' is not a tuple of ints: give a permutation"),
    (dict(dtype="nope"), r"Piece\('w'\): dtype='nope' is not a dtype a weight is sent in"),  # was: TypeError
    (dict(dtype=3), r"Piece\('w'\): dtype=3 is not a dtype"),
    (dict(src=None), r"Piece\('w'\): src=None \(NoneType\) is not a tensor name"),       # was: TypeError
    (dict(dst=3), r"Piece\(3\): dst=3 \(int\) is not a tensor name"),                      # was: TypeError
    (dict(affine="x"), r"Piece\('w'\): affine='x' is not an Affine"),                                   # was: AttributeError
])
def test_a_hand_written_piece_with_a_field_of_the_wrong_kind_is_refused(fields, match):
    src = {"w": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)}
    dst = {"w": torch.full((2, 3), -7.0)}
    with pytest.raises(SwapError, match=r"the swap cannot be planned \(nothing was written\): " + match):
        jax_amem.swap(src, dst, rules=[_piece(**fields)])
    assert torch.equal(dst["w"], torch.full((2, 3), -7.0))
    layouts = jax_amem.reshard.layouts_of(src)
    with pytest.raises(RuleError, match=match):
        jax_amem.plan(layouts, layouts, [_piece(**fields)])


def test_a_piece_with_lists_is_planned_and_refused_only_by_the_swap_cache():
    """plan() reads lists as tuples; the swap keys its cache on the rules, and says why a list
    cannot be one (was: TypeError: unhashable type: 'list')."""
    src = {"w": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)}
    layouts = jax_amem.reshard.layouts_of(src)
    listed = _piece(dst_start=[0, 0], size=[2, 3], src_start=[0, 0])
    jax_amem.plan(layouts, layouts, [listed]).check()
    with pytest.raises(SwapError, match=r"the rules cannot be told apart from another swap's \(unhashable type: "
                                        r"'list'\): give their fields as tuples"):
        jax_amem.swap(src, {"w": torch.zeros(2, 3)}, rules=[listed])
    dst = {"w": torch.zeros(2, 3)}
    jax_amem.swap(src, dst, rules=[_piece(dst_start=(np.int64(0), 0))])   # numpy ints are ints
    assert dst["w"].tolist() == np.asarray(src["w"]).tolist()
