"""Constant steps in rules (reshard/affine.py): a multiply, divide, add or subtract by a constant
traced by from_function or written in a Part, planned and run by the numpy reference executor,
bit-exact against the exporter as JAX evaluates it eagerly; the bound where XLA's jitted
evaluation may differ; refusals of what stays data-dependent."""

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_amem import reshard
from jax_amem.reshard import Layout, Owner, Part, Rule, rules
from jax_amem.reshard.affine import Affine, AffineError, Step

BF16 = ml_dtypes.bfloat16
DEVICES = jax.devices("cpu")[:8]
MESH = Mesh(np.array(DEVICES[:4]), ("x",))
OWNERS = [Owner(0, d.id) for d in DEVICES[:2]]


def weights(shape, dtype, seed):
    """Normal values over twelve binades (no zero, no subnormal), in `dtype`."""
    rng = np.random.default_rng(seed)
    value = rng.standard_normal(shape) * np.exp(rng.uniform(-4, 4, shape))
    return value.astype(np.float32).astype(dtype)


def run_plan(arrays, convert_or_rules, want, split_axis=0):
    """Plans `arrays` (sharded jax.Arrays) into destinations split over two owners, runs the
    numpy executor and returns {name: full array} (every shard checked to be written)."""
    pieces = (rules.from_function(convert_or_rules, arrays) if callable(convert_or_rules)
              else list(convert_or_rules))
    dst = {k: (Layout.tensor_parallel(v.shape, v.dtype, split_axis, 2, OWNERS) if v.ndim and v.shape[split_axis] % 2 == 0
               else Layout.replicated(v.shape, v.dtype, OWNERS)) for k, v in want.items()}
    plan = reshard.plan(arrays, dst, pieces, check=True)
    sources = {}
    for name, array in arrays.items():
        sources.update(reshard.numpy_exec.shards_of(name, array))
    out = reshard.execute_numpy(plan, sources)
    full = {}
    for name, layout in dst.items():
        value = np.zeros(layout.shape, layout.dtype)
        for owner in OWNERS:
            value[layout.shard_slices(owner)] = out[(name, owner)]
        full[name] = value
    return full, plan


def assert_bits(got, want):
    for name in want:
        g, w = np.ascontiguousarray(got[name]), np.ascontiguousarray(want[name])
        assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8)), (
            name, int((g.view(np.uint8) != w.view(np.uint8)).sum()))


def sharded(tree, spec_of=lambda name, value: P(*(["x"] + [None] * (value.ndim - 1))) if value.ndim else P()):
    return {k: jax.device_put(v, NamedSharding(MESH, spec_of(k, v))) for k, v in tree.items()}


def eager(convert, tree):
    return {k: np.asarray(v) for k, v in convert({k: jnp.asarray(v) for k, v in tree.items()}).items()}


def jitted(convert, tree):
    """The exporter as XLA compiles it: a division by a constant becomes the multiplication by
    its reciprocal (XLA's algebraic simplifier), which is what the plan's step computes. Eagerly,
    jax 0.10 gives the same; jax 0.12.1 divides exactly (the constant reaches the kernel as an
    operand), one ulp apart at most."""
    return eager(jax.jit(convert), tree)


def assert_within_one_ulp(got, want):
    for name in want:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        bits = {2: np.int16, 4: np.int32}[g.dtype.itemsize]
        apart = np.abs(g.view(bits).astype(np.int64) - w.view(bits).astype(np.int64))
        assert apart.max() <= 1, (name, int(apart.max()))


PAIRS = [(np.float32, np.float32), (np.float32, BF16), (BF16, BF16), (np.float32, np.float16), (np.float16, BF16)]
CONSTANTS = {
    "python": lambda dtype: 0.3,
    "numpy": lambda dtype: np.float32(1.7),
    "vector": lambda dtype: np.linspace(0.5, 3.0, 8, dtype=np.float32),
}
OPS = {
    "mul": lambda x, c: x * c,
    "div": lambda x, c: x / c,
    "add": lambda x, c: x + c,
    "sub": lambda x, c: x - c,
    "rsub": lambda x, c: c - x,
}


@pytest.mark.parametrize("src_dtype, dst_dtype", PAIRS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("constant", list(CONSTANTS))
def test_a_constant_step_is_bit_exact_with_the_exporters_eager_output(src_dtype, dst_dtype, op, constant):
    tree = {"w": weights((16, 6, 8), src_dtype, 1)}
    c = CONSTANTS[constant](src_dtype)

    def convert(p):
        w = p["w"]
        return {"plain": OPS[op](w[:, 1], c).astype(dst_dtype),                       # one source view
                "t": OPS[op](w[:, 2:4].reshape(16, 16), np.float32(2.5)).T.astype(dst_dtype),  # transposed
                "cast_first": OPS[op](w[3].astype(dst_dtype), c).astype(dst_dtype)}   # rounded, then the step

    want = (jitted if op == "div" else eager)(convert, tree)
    got, plan = run_plan(sharded(tree), convert, want)
    assert plan.affines and any(a is not None for a in plan.affines)
    assert_bits(got, want)
    if op == "div":   # eagerly, a division may be correctly rounded (jax >= 0.12.1): one ulp apart at most
        assert_within_one_ulp(got, eager(convert, tree))


def test_chains_casts_between_steps_and_negation_round_as_jax_does():
    tree = {"w": weights((8, 12), np.float32, 2), "b": weights((12,), BF16, 3)}
    def convert(p):
        w, b = p["w"], p["b"]
        return {"chain": ((w * 0.7 + 1.25) / 3.0 - 0.5).astype(BF16),
                "round_trip": (w.astype(BF16).astype(np.float32) * np.float32(1.1)),
                "norm": (1.0 + b),                          # Gemma's norm offset
                "neg": -(b.astype(np.float32) * 2.0),
                "embed": w * jnp.asarray(np.sqrt(12.0), np.float32)}   # an embedding normaliser
    want = eager(convert, tree)
    got, _ = run_plan(sharded(tree), convert, want)
    assert_bits(got, want)


def test_vectors_follow_their_source_axis_through_sharding_slices_and_transposes():
    tree = {"w": weights((8, 6, 12), np.float32, 4)}
    per_head = np.linspace(0.25, 2.0, 6, dtype=np.float32)
    per_col = np.arange(1, 13, dtype=np.float32) / 7
    def convert(p):
        w = p["w"]
        return {"heads": (w * per_head[None, :, None]).reshape(8, 72),      # along the middle axis
                "cols_t": (w[2:6] + per_col).transpose(2, 0, 1),             # along the last, then transposed
                "picked": (w[:, ::-1] * per_head[::-1, None])[1]}            # reversed rows, reversed vector
    want = eager(convert, tree)
    spec = lambda name, value: P(None, None, "x") if value.ndim == 3 else P()   # sharded along the vectors' axis
    for layout in (sharded(tree), sharded(tree, spec)):
        got, _ = run_plan(layout, convert, want)
        assert_bits(got, want)


def maxtext_exporter(num_layers, heads, head_dim, hidden, *, reverse):
    """An exporter written the way MaxText's to-Hugging-Face hooks are: layers stacked on axis 1
    (its default scan axis), the query kernel reshaped, RoPE's interleaved halves put back
    (`concatenate(x[..., ::2], x[..., 1::2])`), transposed, and scaled: `scale_query_layer`
    multiplies by sqrt(head_dim) in float32 and casts back to the input's dtype; the reverse
    (`reverse_scale`) multiplies by head_dim ** -0.5."""
    depth_scale = np.dtype("float32").type(np.sqrt(head_dim))

    def scale_query_layer(x):
        return (x * depth_scale).astype(x.dtype)

    def reverse_scale(x):
        return x * (head_dim ** -0.5)

    def rope_reorder(x):
        return jnp.concatenate([x[..., ::2], x[..., 1::2]], axis=-1)

    def convert(params):
        out = {}
        for i in range(num_layers):
            q = params["query"][:, i]                      # [hidden, heads, head_dim]
            q = reverse_scale(q) if reverse else scale_query_layer(q)
            q = rope_reorder(q)
            out[f"model.layers.{i}.self_attn.q_proj.weight"] = q.reshape(hidden, heads * head_dim).T
            out[f"model.layers.{i}.mlp.down_proj.weight"] = params["wo"][:, i].T
        return out

    return convert


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_maxtext_query_scaling_goes_through_from_function_unchanged(reverse, dtype):
    layers, heads, head_dim, hidden = 3, 4, 8, 16
    tree = {"query": weights((hidden, layers, heads, head_dim), dtype, 5),
            "wo": weights((32, layers, hidden), dtype, 6)}
    convert = maxtext_exporter(layers, heads, head_dim, hidden, reverse=reverse)
    want = eager(convert, tree)
    got, plan = run_plan(sharded(tree), convert, want)
    assert_bits(got, want)
    assert sum(a is not None for a in plan.affines) >= 1


def test_a_jitted_layer_converter_with_a_scale_is_converted_once_and_exact():
    from jax_amem.reshard import trace
    tree = {"w": weights((4, 8, 6), BF16, 7)}
    layer = jax.jit(lambda w: (w * 0.125).T)
    convert = lambda p: {f"l{i}": layer(p["w"][i]) for i in range(4)}
    want = eager(convert, tree)
    got, _ = run_plan(sharded(tree), convert, want)
    assert trace.last_trace_phases()["calls reused"] >= 3
    assert_bits(got, want)
    vector = np.arange(1, 7, dtype=np.float32)
    layer_v = jax.jit(lambda w: (w.astype(np.float32) * vector).astype(BF16))     # a vector: the call runs per layer
    convert_v = lambda p: {f"l{i}": layer_v(p["w"][i]) for i in range(4)}
    want = eager(convert_v, tree)
    got, _ = run_plan(sharded(tree), convert_v, want)
    assert_bits(got, want)


def test_from_layer_function_shifts_the_vectors_axis_past_the_layer_axis():
    tree = {"layers": {"w": weights((5, 8, 12), np.float32, 8)}}
    vector = np.arange(1, 13, dtype=np.float32)
    pieces = rules.from_layer_function(lambda l: {"w": (l["w"] * vector).T}, tree, "layers", "model.{}.")
    want = {f"model.{i}.w": (tree["layers"]["w"][i] * vector).T for i in range(5)}
    arrays = {"layers/w": jax.device_put(tree["layers"]["w"], NamedSharding(MESH, P(None, None, "x")))}
    got, _ = run_plan(arrays, pieces, want)
    assert_bits(got, want)


def test_hand_written_parts_take_a_scale_and_an_offset():
    tree = {"q": weights((8, 6), np.float32, 9), "k": weights((8, 6), np.float32, 10)}
    offsets = np.arange(6, dtype=np.float32) / 4
    rule_list = [Rule.concat("qk", [Part("q", scale=0.125, cast="bfloat16"), Part("k", offset=offsets, along=1,
                                                                                   cast="bfloat16")]),
                 Rule.copy("qt", "q", transpose=(1, 0), scale=2.0, offset=-1.0)]
    x = {k: jnp.asarray(v) for k, v in tree.items()}
    want = {"qk": np.asarray(jnp.concatenate([(x["q"] * 0.125).astype(BF16), (x["k"] + offsets).astype(BF16)])),
            "qt": np.asarray(x["q"].T * 2.0 + -1.0)}
    got, _ = run_plan(sharded(tree), rule_list, want)
    assert_bits(got, want)
    with pytest.raises(reshard.RuleError, match=r"destination 'qt'.*vector of 5 constants does not fit its axis"):
        run_plan(sharded(tree), [Rule.copy("qt", "q", transpose=(1, 0), scale=[1.0] * 5)], {"qt": want["qt"]})


def test_data_dependent_arithmetic_stays_refused_with_its_message():
    tree = {"x": jax.ShapeDtypeStruct((6, 4), np.float32), "y": jax.ShapeDtypeStruct((6, 4), np.float32),
            "i": jax.ShapeDtypeStruct((6, 4), np.int32)}
    cases = {
        "x * y": (lambda p: {"o": p["x"] * p["y"]}, r"primitive 'mul' computes values from a source tensor "
                                                     r"\(source 'x'\), which a weight swap cannot do.*feeds output 'o'"
                                                     r".*Instead: arithmetic makes new values"),
        "x + x.T.T": (lambda p: {"o": p["x"] + p["x"].T.T}, r"primitive 'add' computes values from a source tensor"),
        "1 / x": (lambda p: {"o": 1.0 / p["x"]}, r"primitive 'div' divides a constant by a source tensor"),
        "2d constant": (lambda p: {"o": p["x"] * np.arange(24.0).reshape(6, 4)},
                        r"primitive 'mul' with a constant that varies along 2 axes"),
        "integers": (lambda p: {"o": p["i"] * 2}, r"primitive 'mul' on source 'i': a constant step runs in a floating"),
        "exp": (lambda p: {"o": jnp.exp(p["x"])}, r"primitive 'exp' computes values from a source tensor"),
        "nan": (lambda p: {"o": p["x"] * np.nan}, r"NaN constant"),
    }
    for name, (convert, message) in cases.items():
        with pytest.raises(rules.TraceError, match=message):
            rules.from_function(convert, tree)


def test_xlas_jitted_evaluation_stays_within_the_stated_bound():
    """The swap reproduces eager evaluation. A jitted exporter lets XLA fuse: a multiply then
    an add may become one fused multiply-add, bfloat16 intermediates may stay in float32.
    The difference is at most one rounding of each intermediate result: here, half an ulp of
    the product plus one ulp of the result (docs/reshard.md)."""
    tree = {"w": weights((64, 64), np.float32, 11)}
    convert = lambda p: {"y": p["w"] * 0.3 + 1.7, "z": (p["w"].astype(BF16) * 3.0 + 1.0).astype(np.float32)}
    want = eager(convert, tree)
    got, _ = run_plan(sharded(tree), convert, want)
    assert_bits(got, want)
    jitted = {k: np.asarray(v) for k, v in jax.jit(convert)({"w": jnp.asarray(tree["w"])}).items()}
    w = tree["w"].astype(np.float64)
    for name, product, ulp_of in (("y", w * 0.3, np.float32), ("z", w.astype(BF16).astype(np.float64) * 3.0, BF16)):
        tiny = np.finfo(ulp_of).eps if ulp_of is np.float32 else 2.0 ** -7
        bound = 0.5 * np.abs(product) * tiny + np.abs(got[name].astype(np.float64)) * tiny
        assert (np.abs(jitted[name].astype(np.float64) - got[name].astype(np.float64)) <= bound).all(), name


def test_an_affine_holds_what_the_copy_kernel_can_run():
    with pytest.raises(AffineError, match="floating dtype"):
        Step("mul", "int32", (2.0,))
    with pytest.raises(AffineError, match="at most 8"):
        Affine(tuple(Step("mul", "float32", (2.0,)) for _ in range(9)))
    step = Step("add", "float32", (1.0, 2.0, 3.0), axis=1, start=2)
    assert step.table((0, 3), (4, 3)).tolist() == [2.0, 3.0, 0.0]     # the shard's coordinates 3..5
    assert str(Affine((step,))) == "x + vector[3] along source axis 1 from 2 in float32"


def test_a_changed_numpy_scale_in_a_closure_traces_again():
    tree = {"w": weights((4, 6), np.float32, 12)}

    def exporter(scale):
        return lambda p: {"y": p["w"] * scale}

    convert = exporter(np.float32(2.0))
    first = rules.from_function(convert, tree)
    convert.__closure__[0].cell_contents = np.float32(3.0)   # the same function, another constant
    second = rules.from_function(convert, tree)
    assert first[0].affine.steps[0].values == (2.0,) and second[0].affine.steps[0].values == (3.0,)
    plan = reshard.plan(sharded(tree), {"y": Layout.replicated((4, 6), np.float32, OWNERS)}, second)
    assert "views with constant steps" in str(plan)


@pytest.mark.parametrize("constant", [np.array([2.0, -0.5], np.float32), np.array([2.0, 2.0, 2.0], np.float32)],
                         ids=["varying", "uniform"])
def test_a_unit_axis_stretched_by_a_vector_constant(constant):
    """lax multiplies w of shape (1, 1) by a constant of shape (1, n) (its unit axis stretched):
    the rules read w's one element n times. This ended in numpy's bare broadcast ValueError, or
    in rules that covered only the first column."""
    w = np.asarray([[3.0]], np.float32)
    pieces = rules.from_function(lambda p: {"v": p["w"] * constant}, {"w": w})
    got = reshard.execute_numpy(reshard.plan({"w": Layout.single((1, 1), "float32", Owner(0, 0))},
                                             {"v": Layout.single((1, len(constant)), "float32", Owner(0, 0))},
                                             pieces), {("w", Owner(0, 0)): w})
    assert np.array_equal(got[("v", Owner(0, 0))], w * constant)
