"""`rules.from_function` with hostile constant steps: constants that JAX is still tracing (the
function called inside jax.jit, a tracer kept from one), complex constants, and the constant
kinds an exporter writes (NaN / inf, float64 into bfloat16 and float16 past their range, integer
and bool constants into floats, jax.Arrays, chains of steps, vectors of the wrong length or
axis, data-dependent steps). Each swap writes what JAX computes eagerly, bit for bit, or is
refused with a family error (the user's own broadcasting error passed on as it is)."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem.errors import JaxAmemError, TraceError
from jax_amem.reshard import rules

torch = pytest.importorskip("torch")


def _tree(dtype):
    return {"w": ((jnp.arange(6.0) - 2.5) * 0.75).astype(dtype).reshape(2, 3)}


def _swap_equals_eager(convert, dtype):
    tree = _tree(dtype)
    want = {k: np.asarray(v.astype(jnp.float32)) for k, v in convert(tree).items()}
    shapes = jax.eval_shape(convert, tree)
    dst = {k: torch.full(v.shape, -7.0, dtype=getattr(torch, str(v.dtype))) for k, v in shapes.items()}
    jax_amem.swap(tree, dst, rules=rules.from_function(convert, tree))
    for k, v in dst.items():
        np.testing.assert_array_equal(v.float().numpy(), want[k], err_msg=k)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name,convert", [
    ("inf", lambda p: {"o": p["w"] * jnp.inf}),                    # 0 * inf is NaN, as in JAX
    ("-inf offset", lambda p: {"o": p["w"] + -np.inf}),
    ("past float16's range", lambda p: {"o": p["w"] * 70000.0}),
    ("float64 into narrow", lambda p: {"o": p["w"] * np.float64(1.1)}),
    ("float64 vector", lambda p: {"o": (p["w"] * np.array([1.1, 2.2, 1e5])).astype(p["w"].dtype)}),
    ("int constant", lambda p: {"o": p["w"] * np.int32(3)}),
    ("int vector", lambda p: {"o": p["w"] * np.array([1, -2, 3], np.int64)}),
    ("bool constant", lambda p: {"o": p["w"] * True}),
    ("jax.Array vector", lambda p: {"o": p["w"] / jnp.array([1.0, 3.0, 7.0])}),
    ("jax.Array scalar", lambda p: {"o": p["w"] - jnp.asarray(0.1)}),
    ("computed constant", lambda p: {"o": p["w"] * jnp.exp(jnp.float32(0.5))}),
    ("chain", lambda p: {"o": ((p["w"] * 2.0 + 1.0) / 3.0 - 0.5) * np.array([[1.0], [2.0]])}),
    ("rsub and neg", lambda p: {"o": -(1.0 - p["w"])}),
    ("divide by zero", lambda p: {"o": p["w"] / np.array([0.0, 1.0, -0.0])}),
    ("cast around a step", lambda p: {"o": (p["w"].astype(jnp.float32) * 3.3).astype(jnp.float16)}),
])
def test_a_constant_step_writes_what_jax_computes(name, convert, dtype):
    _swap_equals_eager(convert, dtype)


def test_a_constant_traced_inside_jit_is_refused_by_name():
    """Raised TracerArrayConversionError (outside the family) from the interpreter."""
    tree, seen = _tree("float32"), {}

    def outer(s):
        try:
            rules.from_function(lambda p: {"o": p["w"] * s}, tree)
        except Exception as error:  # noqa: BLE001 - judged below, outside jit
            seen["error"] = error
        return s

    jax.jit(outer)(jnp.float32(2))
    assert isinstance(seen["error"], TraceError)
    assert ("closes over a constant of shape () and dtype float32 whose value JAX is still tracing "
            "(from_function called inside jax.jit" in str(seen["error"]))


def test_a_tracer_kept_from_jit_is_refused_by_name():
    kept = {}
    jax.jit(lambda s: kept.setdefault("t", s * 1))(jnp.ones(3))
    with pytest.raises(TraceError, match=r"closes over a constant of shape \(3,\) .* Call from_function outside jit"):
        rules.from_function(lambda p: {"o": p["w"] * kept["t"]}, _tree("float32"))


@pytest.mark.parametrize("constant", [1 + 2j, np.complex64(2)])
def test_a_complex_step_says_why(constant):
    """The refusal said 'integer arithmetic wraps and truncates' for a complex step."""
    with pytest.raises(TraceError, match=r"not complex64: complex arithmetic has no place in a weight copy"):
        rules.from_function(lambda p: {"o": p["w"] * constant}, _tree("float32"))


@pytest.mark.parametrize("convert,error,match", [
    (lambda p: {"o": p["w"] * np.nan}, TraceError, r"a NaN constant writes NaN"),
    (lambda p: {"o": p["w"] * p["w"]}, TraceError, r"primitive 'mul' computes values from a source tensor"),
    (lambda p: {"o": p["w"] / jnp.max(p["w"])}, TraceError, r"primitive 'reduce_max' computes values"),
    (lambda p: {"o": 1.0 / p["w"]}, TraceError, r"divides a constant by a source tensor"),
    (lambda p: {"o": p["w"] * np.arange(6.0).reshape(2, 3)}, TraceError, r"a constant that varies along 2 axes"),
    (lambda p: {"o": p["w"].astype(jnp.int32) * 2}, TraceError, r"not int32: integer arithmetic wraps"),
    (lambda p: {"o": p["w"] * np.array([1.0, 2.0])}, ValueError, r"Incompatible shapes for broadcasting"),
    (lambda p: {"o": p["w"] * np.array([1.0, 2.0])[None, :]}, TypeError, r"incompatible shapes"),
])
def test_what_a_copy_cannot_do_is_refused(convert, error, match):
    """The last two are the exporter's own errors (a vector of the wrong length, or along the
    wrong axis), passed on."""
    with pytest.raises(error, match=match) as raised:
        rules.from_function(convert, _tree("float32"))
    if error is TraceError:
        assert isinstance(raised.value, JaxAmemError)
