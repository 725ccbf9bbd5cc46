"""Constant elementwise steps on the way to a destination: multiply, divide, add or subtract
by a constant (a scalar, or a vector along one source axis), each rounded as JAX rounds it.

An exporter's `q * head_dim ** -0.5`, `1 + w` or `embedding * normalizer` is data, like a
transpose: an `Affine` is the chain of such steps a source's elements go through, in order.
Each `Step` runs in a dtype: its input is first rounded to that dtype (a cast before it),
the constant holds values of that dtype, and its result is rounded to it. This is what JAX
does when it evaluates the exporter eagerly, one operation at a time, so running the chain
reproduces the exporter's values bit for bit. The steps are computed in float32 (float64
when the source or the destination is float64): every value of the narrower dtypes is exact there,
and a single operation computed in float32 and rounded once to bfloat16 or float16 equals
the correctly rounded narrow operation (float32 has at least 2p + 2 bits for their p), which
is also true of float32 operations computed in float64.

Vector constants are stored in source coordinates: a step's `values[k]` multiplies (adds
to...) every element whose coordinate along source axis `axis` is `start + k`, so the step
survives the slices, transposes and reshapes that follow it unchanged.

The copy kernel (src/copy/affine.h) runs the chain while it copies, from the source's own
dtype to the destination's (no temporary, no extra pass); `apply_numpy` is the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import AffineError  # one family: jax_amem/errors.py

OPS = ("mul", "div", "add", "sub", "rsub")   # rsub: constant - value
FLOATS = ("float64", "float32", "bfloat16", "float16")
MAX_STEPS = 8   # the copy kernel's program holds this many steps (src/copy/affine.h)


def _check_dtype(dtype: str) -> None:
    """AffineError unless a step can run in `dtype` (a floating one), saying why not."""
    if dtype not in FLOATS:
        why = ("complex arithmetic has no place in a weight copy; give real values" if "complex" in dtype
               else "integer arithmetic wraps and truncates; apply it in the rollout after the swap")
        raise AffineError(f"a constant step runs in a floating dtype ({', '.join(FLOATS)}), not {dtype}: {why}")


@dataclass(frozen=True)
class Step:
    op: str                       # one of OPS
    dtype: str                    # the dtype the step runs in (input and result rounded to it)
    values: tuple[float, ...]     # the constant: one value (a scalar), or one per coordinate (exact in
                                  # `dtype`, or float32 for a bfloat16 division's reciprocal)
    axis: int = -1                # the source axis a vector runs along (-1: a scalar)
    start: int = 0                # the source coordinate of values[0]

    def __post_init__(self):
        if self.op not in OPS:
            raise AffineError(f"step {self.op!r} is not one of {OPS}")
        _check_dtype(self.dtype)
        if any(math.isnan(v) for v in self.values):
            raise AffineError("a constant step with a NaN constant writes NaN: give finite constants")
        if not self.values or (self.axis < 0 and len(self.values) != 1):
            raise AffineError(f"step {self.op}: a scalar holds one value, a vector names its axis")

    @property
    def is_scalar(self) -> bool:
        return self.axis < 0

    def table(self, box_start, box_size) -> np.ndarray:
        """float64 values for a shard whose box on the source is `box_start` + [0, `box_size`):
        one value (a scalar), or one per coordinate of the shard along `axis` (0 where the
        step has none: elements the plan never reads from this view)."""
        values = np.asarray(self.values, np.float64)
        if self.is_scalar:
            return values
        out = np.zeros(int(box_size[self.axis]), np.float64)
        first = int(box_start[self.axis]) - self.start
        lo, hi = max(first, 0), min(first + len(out), len(values))
        if hi > lo:
            out[lo - first:hi - first] = values[lo:hi]
        return out

    def shifted(self, k: int) -> "Step":
        return self if self.is_scalar else Step(self.op, self.dtype, self.values, self.axis + k, self.start)

    def __str__(self):
        constant = (f"{self.values[0]:g}" if self.is_scalar else
                    f"vector[{len(self.values)}] along source axis {self.axis} from {self.start}")
        return {"mul": "x * {}", "div": "x / {}", "add": "x + {}", "sub": "x - {}",
                "rsub": "{} - x"}[self.op].format(constant) + f" in {self.dtype}"


@dataclass(frozen=True)
class Affine:
    steps: tuple[Step, ...]

    def __post_init__(self):
        if not self.steps:
            raise AffineError("an Affine holds at least one step")
        if len(self.steps) > MAX_STEPS:
            raise AffineError(f"{len(self.steps)} constant steps on one source: the copy runs at most {MAX_STEPS}; "
                              "fold constants together in the exporter (x * (a * b), not x * a * b)")

    def then(self, step: Step) -> "Affine":
        return Affine(self.steps + (step,))

    def shifted(self, k: int) -> "Affine":
        """The same steps on a source with `k` more leading axes (a stacked layer source)."""
        return Affine(tuple(s.shifted(k) for s in self.steps))

    @property
    def dtype(self) -> str:
        """The dtype of the chain's result (before any cast after it)."""
        return self.steps[-1].dtype

    def compute_dtype(self, source: str, final: str) -> np.dtype:
        """float64 when the source or the final dtype is, else float32."""
        wide = "float64" in (np.dtype(source).name, np.dtype(final).name)
        return np.dtype("float64" if wide else "float32")

    def check(self, source: str, final: str, where: str) -> None:
        """AffineError (naming `where`) unless the source and the final dtype are floating, and a
        float64 step has a float64 end (the kernel computes in float64 only then)."""
        for role, dtype in (("source", source), ("destination", final)):
            if np.dtype(dtype).name not in FLOATS:
                raise AffineError(f"{where}: constant steps ({self}) need a floating {role} dtype "
                                  f"({', '.join(FLOATS)}), not {np.dtype(dtype).name}")
        if self.compute_dtype(source, final) != np.float64 and any(s.dtype == "float64" for s in self.steps):
            raise AffineError(f"{where}: a float64 step ({self}) between a {np.dtype(source).name} source and a "
                              f"{np.dtype(final).name} destination: compute in float32, or send float64")

    def apply_numpy(self, view: np.ndarray, final, box_start=None, perm=None) -> np.ndarray:
        """The chain run on `view` (a source shard, transposed by `perm`, in the source's dtype),
        whose box on the source starts at `box_start`; the result in dtype `final`. The
        reference the copy kernel is tested against."""
        view = np.asarray(view)
        perm = tuple(range(view.ndim)) if perm is None else tuple(perm)
        box_start = (0,) * view.ndim if box_start is None else tuple(box_start)
        box_size = [0] * view.ndim
        for j, a in enumerate(perm):
            box_size[a] = view.shape[j]
        compute = self.compute_dtype(view.dtype, final)
        v = view.astype(compute)
        for step in self.steps:
            v = _rounded(v, step.dtype, compute)
            c = step.table(box_start, box_size).astype(compute)
            if not step.is_scalar:
                shape = [1] * view.ndim
                shape[perm.index(step.axis)] = len(c)
                c = c.reshape(shape)
            with np.errstate(all="ignore"):
                v = {"mul": np.multiply, "div": np.divide, "add": np.add, "sub": np.subtract,
                     "rsub": lambda a, b: np.subtract(b, a)}[step.op](v, c).astype(compute)
            v = _rounded(v, step.dtype, compute)
        with np.errstate(all="ignore"):
            return v.astype(np.dtype(final))

    def __str__(self):
        return "; ".join(map(str, self.steps))


def _rounded(v: np.ndarray, dtype: str, compute: np.dtype) -> np.ndarray:
    if np.dtype(dtype) == compute:
        return v
    with np.errstate(all="ignore"):
        return v.astype(np.dtype(dtype)).astype(compute)


def step_for(op: str, dtype: str, constant: np.ndarray, axis: int = -1, start: int = 0) -> Step:
    """A step from a numpy constant: its values as exact Python floats of `dtype`.

    A division by a constant is the multiplication by its reciprocal, rounded as XLA rounds it
    when it rewrites `x / c` (its algebraic simplifier; measured on XLA:CPU, every element
    equal): to the dtype of the multiply, float32 for bfloat16 (XLA computes bfloat16 in
    float32), the step's own dtype otherwise. It differs from a correctly rounded division by
    at most one unit in the last place (docs/reshard.md)."""
    _check_dtype(np.dtype(dtype).name)   # before the constant is read as floats
    if op == "div":
        wide = "float32" if np.dtype(dtype).name == "bfloat16" else np.dtype(dtype).name
        exact = np.asarray(constant).astype(np.dtype(dtype)).astype(np.dtype(wide))
        with np.errstate(all="ignore"):
            reciprocal = (np.asarray(1, np.dtype(wide)) / exact).astype(np.float64).reshape(-1)
        if axis >= 0 and len(reciprocal) > 0 and (reciprocal == reciprocal[0]).all():
            reciprocal, axis, start = reciprocal[:1], -1, 0
        return Step("mul", np.dtype(dtype).name, tuple(float(v) for v in reciprocal), axis, start)
    values = np.asarray(constant).astype(np.dtype(dtype)).astype(np.float64).reshape(-1)
    if axis >= 0 and len(values) > 0 and (values == values[0]).all():
        values, axis, start = values[:1], -1, 0
    return Step(op, np.dtype(dtype).name, tuple(float(v) for v in values), axis, start)


def final_dtype(affine: Affine | None, cast: str | None, source: str) -> str:
    """The dtype a chain (and a cast after it) sends."""
    if cast is not None:
        return np.dtype(cast).name
    return affine.dtype if affine is not None else np.dtype(source).name
