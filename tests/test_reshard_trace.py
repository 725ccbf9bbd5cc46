"""Reshape in rules (`Part(shape=...)`) and rules traced from a conversion function
(`rules.from_function`), checked against numpy on sharded sources (8 CPU devices, 2-D mesh)."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jax_amem import reshard
from jax_amem.reshard import Part, Rule, rules

from reshard_oracle import plan_and_run, shard_tree

D, H, HD, KV = 8, 4, 2, 2


def test_part_shape_merges_and_splits_heads():
    rng = np.random.default_rng(0)
    tree = {"q": rng.standard_normal((D, H, HD)).astype(np.float32),      # MaxText [D, heads, head_dim]
            "o": rng.standard_normal((H, HD, D)).astype(np.float32),      # [heads, head_dim, D]
            "w": rng.standard_normal((H * HD, D)).astype(np.float32)}     # HF [H*hd, D]
    arrays = shard_tree(tree)
    want = {"q_proj": tree["q"].transpose(1, 2, 0).reshape(H * HD, D),
            "o_proj": tree["o"].transpose(2, 0, 1).reshape(D, H * HD),
            "split": tree["w"].reshape(H, HD, D),
            "flat": tree["q"].reshape(-1)}
    rule_list = [Rule.copy("q_proj", "q", transpose=(1, 2, 0), shape=(H * HD, D)),
                 Rule.copy("o_proj", "o", transpose=(2, 0, 1), shape=(D, H * HD)),
                 Rule.copy("split", "w", shape=(H, HD, D)),
                 Rule.copy("flat", "q", shape=(D * H * HD,))]
    plan_and_run(arrays, want, rule_list)


def test_part_shape_inside_a_fused_tensor_parallel_rule():
    """vLLM's qkv_proj per TP rank, from MaxText-style q, k, v kernels, heads merged."""
    rng = np.random.default_rng(1)
    tree = {n: rng.standard_normal((D, h, HD)).astype(np.float32) for n, h in (("q", H), ("k", KV), ("v", KV))}
    arrays = shard_tree(tree)
    hf = {n: tree[n].transpose(1, 2, 0).reshape(-1, D) for n in tree}
    want = {"qkv": np.concatenate([np.array_split(hf[n], 2)[r] for r in range(2) for n in "qkv"])}
    parts = [Part(n, transpose=(1, 2, 0), shape=(h * HD, D)) for n, h in (("q", H), ("k", KV), ("v", KV))]
    plan_and_run(arrays, want, [Rule.concat("qkv", parts, axis=0, groups=2)])


def test_part_shape_of_the_wrong_size_is_refused():
    src = {"a": reshard.Layout.single((4, 6), np.float32, (0, 0))}
    dst = {"b": reshard.Layout.single((5, 5), np.float32, (0, 1))}
    with pytest.raises(reshard.RuleError, match=r"'b'.*part 'a' has shape \(4, 6\).*cannot be reshaped to \(5, 5\)"):
        reshard.plan(src, dst, [Rule.copy("b", "a", shape=(5, 5))])


def _layout_zoo(p):
    """Every layout primitive from_function accepts, on a small tree."""
    x, s = p["x"], p["stack"]                 # (6, 4), (3, 2, 6)
    return {
        "t": x.T, "r": x.reshape(4, 6), "r2": x.reshape(2, 3, 4).transpose(1, 0, 2).reshape(3, 8),
        "row": x[2], "last": x[-1], "col": x[:, 1], "sl": x[1:4, 2:], "e": x[None], "e2": jnp.expand_dims(x, 1),
        "sq": jnp.squeeze(x[1:2], 0), "c": jnp.concatenate([x, x[:2]], 0), "sp": jnp.split(x, 2, axis=1)[1],
        "d": jax.lax.dynamic_slice_in_dim(x, 3, 2, 0), "st": jnp.stack([x, x.T.reshape(6, 4)]),
        "layer": s[1].T, "cast": s[2].astype(jnp.bfloat16), "m": jnp.moveaxis(s, 0, 2).reshape(2, 18),
        "jit": jax.jit(lambda y: y.reshape(-1)[3:9])(x), "cp": jnp.array(x, copy=True),
    }


def test_from_function_equals_running_the_function():
    rng = np.random.default_rng(2)
    tree = {"x": rng.standard_normal((6, 4)).astype(np.float32),
            "stack": rng.standard_normal((3, 2, 6)).astype(np.float32)}
    want = {k: np.asarray(v) for k, v in _layout_zoo(tree).items()}
    pieces = rules.from_function(_layout_zoo, tree)
    plan_and_run(shard_tree(tree), want, pieces)


def test_from_function_is_cached_per_function_and_shapes():
    tree = {"x": jax.ShapeDtypeStruct((6, 4), np.float32), "stack": jax.ShapeDtypeStruct((3, 2, 6), np.float32)}
    first = rules.from_function(_layout_zoo, tree)
    count = rules.trace_count()
    assert rules.from_function(_layout_zoo, tree) == first
    assert rules.trace_count() == count            # second call: no tracing
    bigger = {"x": jax.ShapeDtypeStruct((6, 4), np.float32), "stack": jax.ShapeDtypeStruct((3, 2, 8), np.float32)}
    with pytest.raises(Exception):
        rules.from_function(_layout_zoo, bigger)   # "m" no longer reshapes: a new trace ran and failed
    assert rules.trace_count() == count + 1


def test_from_function_cast_applies_to_uncast_outputs():
    tree = {"x": np.arange(24, dtype=np.float32).reshape(6, 4)}
    pieces = rules.from_function(lambda p: {"y": p["x"].T}, tree, cast="bfloat16")
    import ml_dtypes
    plan_and_run(shard_tree(tree), {"y": tree["x"].T.astype(ml_dtypes.bfloat16)}, pieces)
    with pytest.raises(rules.TraceError, match=r"output 'y': cast='float16'.*cast twice \(float32 -> bfloat16 -> float16\)"):
        rules.from_function(lambda p: {"y": p["x"].astype(jnp.bfloat16)}, tree, cast="float16")


def test_a_computing_primitive_is_refused_naming_it_and_its_output():
    tree = {"x": jax.ShapeDtypeStruct((6, 4), np.float32), "y": jax.ShapeDtypeStruct((6, 4), np.float32)}
    with pytest.raises(rules.TraceError, match=r"primitive 'add'.*source 'x'.*feeds output 'sum'.*layout operations"):
        rules.from_function(lambda p: {"ok": p["x"], "sum": (p["x"] + p["y"]).T}, tree)
    with pytest.raises(rules.TraceError, match=r"'argmax'.*source 'y'.*feeds output 'picked'"):
        rules.from_function(lambda p: {"picked": p["x"][jnp.argmax(p["y"][:, 0])]}, tree)
    with pytest.raises(rules.TraceError, match=r"'gather'.*index 9 outside axis 0 of size 6.*fill value.*"
                                               r"feeds output 'rows'"):
        rules.from_function(lambda p: {"rows": jnp.take(p["x"], np.array([0, 9]), axis=0)}, tree)
    with pytest.raises(rules.TraceError, match=r"output 'zeros' is a constant"):
        rules.from_function(lambda p: {"zeros": jnp.zeros((2,))}, tree)


def test_mapping_errors_name_expectation_origin_and_closest_names():
    """A MaxText-style tree given to hf_llama: the error says what it expected, who expected it,
    that hf_llama wants a Flax-style tree, and the closest names."""
    f32 = np.float32
    src = {"layers/attn/q/kernal": reshard.Layout.single((2, 8, 8), f32, (0, 0))}
    dst = {"model.layers.0.self_attn.q_proj.weight": reshard.Layout.single((8, 8), f32, (0, 1))}
    rule_list = [r for r in rules.hf_llama(1) if r.dst in dst]
    with pytest.raises(reshard.RuleError) as error:
        reshard.plan(src, dst, rule_list)
    text = str(error.value)
    for needed in ("'model.layers.0.self_attn.q_proj.weight'", "expected source 'layers/attn/q/kernel'",
                   "rules.hf_llama", "Flax-style tree", "closest source names: 'layers/attn/q/kernal'"):
        assert needed in text, (needed, text)
    with pytest.raises(reshard.RuleError, match=r"writes destination 'model.layers.0.self_attn.q_proj.weight'.*"
                                                r"closest destination names: 'model.layers.0.self_attn.q_proj.weigth'"):
        reshard.plan(src, {"model.layers.0.self_attn.q_proj.weigth": dst["model.layers.0.self_attn.q_proj.weight"]},
                     rule_list)
    with pytest.raises(reshard.RuleError, match=r"preset 'qwen3' \(source='maxtext', layout='hf'\) expects the layer "
                                                r"stack 'decoder/layers/self_attention/query/kernel'.*Flax-style"):
        rules.qwen3({"layers": {"attn": {"q": {"kernel": np.zeros((2, 8, 8), f32)}}}}, source="maxtext")
    with pytest.raises(reshard.RuleError, match=r"unknown family 'qwen'.*did you mean 'qwen3'"):
        rules.preset("qwen", {})


def test_from_layer_function_traces_one_layer_and_equals_the_whole_function():
    rng = np.random.default_rng(3)
    tree = {"decoder": {"layers": {"query": rng.standard_normal((3, D, H, HD)).astype(np.float32),
                                   "wi": rng.standard_normal((3, 2, D, 6)).astype(np.float32)}},
            "embed": rng.standard_normal((10, D)).astype(np.float32)}

    def layer(p):
        return {"q_proj.weight": p["query"].reshape(D, -1).T,
                **{f"experts.{e}.w.weight": p["wi"][e].T for e in range(2)}}

    def whole(p):
        out = {"embed": p["embed"]}
        for i in range(3):
            one = {k: v[i] for k, v in p["decoder"]["layers"].items()}
            out.update({f"model.layers.{i}.{k}": v for k, v in layer(one).items()})
        return out

    before = rules.trace_count()
    pieces = rules.from_function(lambda p: {"embed": p["embed"]}, tree) + \
        rules.from_layer_function(layer, tree, "decoder/layers", "model.layers.{}.")
    assert rules.trace_count() == before + 2       # one trace for the globals, one for a layer
    want = {k: np.asarray(v) for k, v in whole(tree).items()}
    plan_and_run(shard_tree(tree), want, pieces)
    again = rules.from_layer_function(layer, tree, "decoder/layers", "model.layers.{}.")
    assert rules.trace_count() == before + 2 and again == pieces[1:]


def test_output_names_of_a_state_dict_and_of_a_nested_tree():
    """A flat {str: array} dict keeps its keys (whatever their order); any other tree is
    named by its paths, as reshard.tree_names names it."""
    rng = np.random.default_rng(7)
    tree = {"x": rng.standard_normal((6, 4)).astype(np.float32)}
    flat = lambda p: {"z.weight": p["x"], "a.weight": p["x"].T, "m": p["x"][1:3]}
    nested = lambda p: {"z": {"weight": p["x"]}, "a": [p["x"].T, p["x"][1:3]]}
    for convert in (flat, nested):
        out = convert(tree)
        want = {k: np.asarray(v) for k, v in reshard.tree_names(out).items()}
        pieces = rules.from_function(convert, tree)
        assert sorted({p.dst for p in pieces}) == sorted(want)
        plan_and_run(shard_tree(tree), want, pieces)


def test_a_jitted_layer_converter_is_converted_once_and_reused_exactly():
    """A layer converter under jax.jit is converted once per input signature and reused for
    the other layers; a model whose one layer calls another converter (same shapes, other
    elements) still gets that layer's own plan."""
    from jax_amem.reshard import trace
    rng = np.random.default_rng(4)
    tree = {"layers": {"q": rng.standard_normal((4, D, H, HD)).astype(np.float32),
                       "wi": rng.standard_normal((4, 2, D, 6)).astype(np.float32)},
            "embed": rng.standard_normal((10, D)).astype(np.float32)}

    def layer(p):
        return {"q": p["q"].reshape(D, -1).T, "w0": p["wi"][0].T, "w1": p["wi"][1][:, 1:]}

    def other(p):  # the same output shapes from other elements
        return {"q": p["q"].reshape(D, -1).T, "w0": p["wi"][1].T, "w1": p["wi"][0][:, :5]}

    def model(converter_of):
        def convert(p):
            out = {"embed": p["embed"]}
            for i in range(4):
                one = {k: v[i] for k, v in p["layers"].items()}
                out.update({f"l.{i}.{k}": v for k, v in converter_of(i)(one).items()})
            return out
        return convert

    jit_layer, jit_other = jax.jit(layer), jax.jit(other)
    same = model(lambda i: jit_layer)
    odd = model(lambda i: jit_other if i == 2 else jit_layer)
    for convert, reused in ((same, 3), (odd, 2)):
        pieces = rules.from_function(convert, tree)
        assert trace.last_trace_phases()["calls reused"] == reused
        want = {k: np.asarray(v) for k, v in convert(tree).items()}
        plan_and_run(shard_tree(tree), want, pieces)
    fields = lambda ps: [(p.dst, p.dst_start, p.size, p.src, p.src_start, p.perm, p.dtype) for p in ps]
    assert fields(rules.from_function(same, tree)) == fields(rules.from_function(model(lambda i: layer), tree))


def test_a_jitted_call_on_two_slices_of_one_source_keeps_them_apart():
    rng = np.random.default_rng(5)
    tree = {"w": rng.standard_normal((3, 5, 4)).astype(np.float32)}   # layers on axis 1
    pair = jax.jit(lambda a, b: {"ab": jnp.concatenate([a.T, b.T], 1), "b": b[1:]})

    def convert(p):
        out = {}
        for i in range(4):
            out.update({f"{i}.{k}": v for k, v in pair(p["w"][:, i], p["w"][:, i + 1]).items()})
        return out
    want = {k: np.asarray(v) for k, v in convert(tree).items()}
    plan_and_run(shard_tree(tree), want, rules.from_function(convert, tree))


def test_nested_jitted_calls_and_an_identity_call_are_reused_exactly():
    from jax_amem.reshard import trace
    rng = np.random.default_rng(6)
    tree = {"w": rng.standard_normal((3, 4, 6)).astype(np.float32)}
    inner = jax.jit(lambda y: y.T[1:].reshape(-1, 2))
    outer = jax.jit(lambda a: {"in": inner(a), "same": a, "cast": inner(a).astype(jnp.bfloat16)})

    def convert(p):
        return {f"{i}.{k}": v for i in range(3) for k, v in outer(p["w"][i]).items()}
    pieces = rules.from_function(convert, tree)
    assert trace.last_trace_phases()["calls reused"] == 2 + 1   # outer twice, inner once inside it
    want = {k: np.asarray(v) for k, v in convert(tree).items()}
    plan_and_run(shard_tree(tree), want, pieces)


def test_a_jitted_call_refuses_and_casts_with_the_real_source_names():
    tree = {"x": jax.ShapeDtypeStruct((6, 4), np.float32)}
    add_self = jax.jit(lambda x: (x + x[::-1]).T)
    with pytest.raises(rules.TraceError, match=r"primitive 'add'.*source 'x'.*feeds output 'y'"):
        rules.from_function(lambda p: {"y": add_self(p["x"])}, tree)
    # A cast inside the call on a cast outside: the first becomes a rounding step, as JAX rounds.
    to_half = jax.jit(lambda x: x.T.astype(jnp.float16))
    pieces = rules.from_function(lambda p: {"y": to_half(p["x"].astype(jnp.bfloat16))}, tree)
    x = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    want = {"y": np.asarray(to_half(jnp.asarray(x).astype(jnp.bfloat16)))}
    plan_and_run(shard_tree({"x": x}), want, pieces)


def _random_shape(size, rng):
    """A random row-major factorisation of `size`, unit axes included."""
    factors = [p for p in (2, 3, 5) for _ in range(20) if size % p ** (_ + 1) == 0]
    rng.shuffle(factors)
    axes = [1] * int(rng.integers(1, 4))
    for f in factors:
        axes[int(rng.integers(len(axes)))] *= f
    if rng.random() < 0.3:
        axes.insert(int(rng.integers(len(axes) + 1)), 1)
    return tuple(axes)


def _random_program(rng):
    steps = []
    for _ in range(int(rng.integers(2, 6))):
        steps.append((rng.choice(["transpose", "reshape", "slice", "expand", "concat"]), int(rng.integers(1 << 30))))

    def run(p):
        x = p["x"]
        for op, seed in steps:
            r = np.random.default_rng(seed)
            if op == "transpose":
                x = x.transpose(tuple(r.permutation(x.ndim)))
            elif op == "reshape":
                x = x.reshape(_random_shape(x.size, r))
            elif op == "slice" and x.size:
                lo = [int(r.integers(n)) for n in x.shape]
                hi = [int(r.integers(a, n)) + 1 for a, n in zip(lo, x.shape)]
                x = x[tuple(slice(a, b) for a, b in zip(lo, hi))]
            elif op == "expand":
                x = jnp.expand_dims(x, int(r.integers(x.ndim + 1)))
            elif op == "concat":
                axis = int(r.integers(x.ndim))
                x = jnp.concatenate([x, x], axis=axis)
        return {"y": x}
    return run


@pytest.mark.parametrize("seed", range(12))
def test_random_layout_programs_equal_numpy(seed):
    rng = np.random.default_rng(100 + seed)
    tree = {"x": rng.standard_normal(_random_shape(120, rng)).astype(np.float32)}
    program = _random_program(rng)
    want = {"y": np.asarray(program({"x": jnp.asarray(tree["x"])})["y"])}
    plan_and_run(shard_tree(tree), want, rules.from_function(program, tree))


# -- hostile converters and bad arguments (the standard: equal to running the function, or refused
#    naming the input)

def test_hostile_jitted_converters_equal_running_them():
    """A jitted call whose closure changes between calls of one shape (JAX reuses its first trace, and
    so must the plan), one function under two static arguments, a call returning its input and its
    transpose, and a jitted identity of two different concatenations: each plan equals running
    `convert` for real, byte for byte."""
    rng = np.random.default_rng(7)
    tree = {f"w{i}": rng.standard_normal((4, 8)).astype(np.float32) for i in range(3)}
    row = [0]
    at_row = jax.jit(lambda a: a[row[0]])
    static = jax.jit(lambda a, i: a[i:], static_argnums=1)
    both = jax.jit(lambda a: (a, a.T))
    same = jax.jit(lambda a: a)

    def convert(p):
        out = {}
        for i in range(3):
            row[0] = i
            out[f"row{i}"] = at_row(p[f"w{i}"])
        out.update(s1=static(p["w0"], 1), s2=static(p["w1"], 2), s1b=static(p["w2"], 1),
                   a=both(p["w0"])[0], at=both(p["w1"])[1],
                   c01=same(jnp.concatenate([p["w0"], p["w1"]])), c10=same(jnp.concatenate([p["w1"], p["w0"]])))
        return out
    want = {k: np.asarray(v) for k, v in convert(tree).items()}
    row[0] = 0
    plan_and_run(shard_tree(tree), want, rules.from_function(convert, tree))


def test_a_tuple_output_and_integer_keys_equal_running_the_function():
    """Integer keys in params, a tuple inside the output mapping (a bare tuple is refused:
    tests/test_reshard_preset_errors.py)."""
    rng = np.random.default_rng(8)
    tree = {1: rng.standard_normal((4, 8)).astype(np.float32), 2: rng.standard_normal((2, 8)).astype(np.float32)}

    def convert(p):
        return {"t": p[1].T, "pair": (p[2][1:], p[1])}
    pieces = rules.from_function(convert, tree)
    want = {k: np.asarray(v) for k, v in reshard.tree_names(convert(tree)).items()}
    assert sorted(want) == ["pair/0", "pair/1", "t"]
    plan_and_run(shard_tree(tree), want, pieces)


def test_two_leaves_with_one_name_are_refused_in_params_and_outputs():
    """A key holding '/' beside the nested key it spells: the names no longer lined up with the
    leaves (params: a raw KeyError; outputs: a plan that wrote 'a/b' from the wrong tensor)."""
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(reshard.LayoutError, match=r"two tree leaves are both named 'a/b' \(paths \['a'\]\['b'\] "
                                                 r"and \['a/b'\]\).*rename one"):
        reshard.tree_names({"a/b": x, "a": {"b": x}})
    with pytest.raises(rules.TraceError, match=r"params: two tree leaves are both named 'a/b'"):
        rules.from_function(lambda p: {"o": p["a"]["b"]}, {"a/b": x, "a": {"b": x + 1}})
    with pytest.raises(rules.TraceError, match=r"the output of .*<lambda>: two tree leaves are both named 'a/b'"):
        rules.from_function(lambda p: {"a/b": p["x"], "a": {"b": p["y"]}}, {"x": x, "y": x + 1})


def test_bad_outputs_arguments_and_a_raising_converter_are_named():
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(rules.TraceError, match=r"is not a tree JAX can flatten .*return a dict of destination names"):
        rules.from_function(lambda p: {1: p["x"], "1": p["x"]}, {"x": x})
    with pytest.raises(rules.TraceError, match=r"params leaf 'x' is str 'hello', not an array"):
        rules.from_function(lambda p: {"o": p["x"]}, {"x": "hello"})
    with pytest.raises(rules.TraceError, match=r"cast='floaty' is not a dtype"):
        rules.from_function(lambda p: {"o": p["x"]}, {"x": x}, cast="floaty")
    with pytest.raises(rules.TraceError, match=r"the conversion function is int 3, not a function"):
        rules.from_function(3, {"x": x})

    def broken(p):
        raise RuntimeError("the user's own bug")
    with pytest.raises(RuntimeError, match="the user's own bug") as raised:
        rules.from_function(broken, {"x": x})
    assert any("from_function traced it" in note for note in raised.value.__notes__)
    assert rules.from_function(lambda p: {}, {}) == []


@pytest.mark.parametrize("stack, prefix, message", [
    ("layers", "model.layers.", r"prefix 'model.layers.' must hold one '\{\}' for the layer number"),
    ("layers", "model.{1}.", r"prefix 'model.\{1\}.' must hold one '\{\}'"),
    ("layerz", "l.{}.", r"stack 'layerz': params has no key 'layerz' \(its keys: e, layers, s\)"),
    ("layers/w/x", "l.{}.", r"stack 'layers/w/x': layers/w has no key 'x'"),
    (3, "l.{}.", r"stack and prefix are strings"),
    ("layers", None, r"stack and prefix are strings"),
    ("s", "l.{}.", r"s has no axis 0 to hold the layers"),
])
def test_from_layer_function_refuses_bad_stack_and_prefix(stack, prefix, message):
    tree = {"layers": {"w": np.zeros((3, 4, 8), np.float32)}, "e": np.zeros((4, 8), np.float32),
            "s": np.float32(1)}
    with pytest.raises(rules.TraceError, match=message):
        rules.from_layer_function(lambda layer: {"w": layer["w"].T} if isinstance(layer, dict) else {"w": layer},
                                  tree, stack, prefix)


def test_a_rematerialised_layout_function_is_inlined_like_a_jitted_one():
    """jax.checkpoint binds `remat2` in this JAX, which was refused as computing values although
    the module inlines remat / checkpoint calls."""
    rng = np.random.default_rng(9)
    tree = {"x": rng.standard_normal((4, 8)).astype(np.float32), "s": rng.standard_normal((3, 4, 8)).astype(np.float32)}
    flip = jax.checkpoint(lambda a: a.T)

    def convert(p):
        return {"o": flip(p["x"]), "q": flip(p["s"][1]), "r": jax.checkpoint(lambda a: a[1:].reshape(-1))(p["s"][2])}
    want = {k: np.asarray(v) for k, v in convert(tree).items()}
    plan_and_run(shard_tree(tree), want, rules.from_function(convert, tree))


ROWS = 2  # read by _first_rows: a global the cache must see change


def _first_rows(p):
    return {"o": p["x"][:ROWS]}


def test_a_cached_trace_is_not_reused_when_a_plain_value_the_function_reads_changed():
    """The cache was keyed by the function alone: after ROWS = 3 it still returned the plan for 2."""
    global ROWS
    tree = {"x": np.arange(32, dtype=np.float32).reshape(8, 4)}
    try:
        for rows in (2, 3, 2):
            ROWS = rows
            count = rules.trace_count()
            pieces = rules.from_function(_first_rows, tree)
            assert [p.size for p in pieces] == [(rows, 4)]
            plan_and_run(shard_tree(tree), {"o": tree["x"][:rows]}, pieces)
        assert rules.trace_count() == count  # ROWS = 2 again: the first trace, from the cache

        def cut(k):
            return lambda p: {"o": p["x"][:k]}
        closures = {k: rules.from_function(f, tree)[0].size for k, f in ((1, cut(1)), (5, cut(5)))}
        assert closures == {1: (1, 4), 5: (5, 4)}
    finally:
        ROWS = 2
