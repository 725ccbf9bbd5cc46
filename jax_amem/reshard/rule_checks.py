"""The field checks of hand-written rules (`Part`, `Rule`) and of the options that name a
dtype (`cast=`), in one place: a field of the wrong kind is refused where the rule is made,
naming the rule, the field and the value, instead of failing later inside the planner with
a bare TypeError, or being read as something else (a string read as a number, a 2-D array
flattened into a vector, a bool taken for 1, a float index truncated).

Each check returns the value in the one form the planner reads (tuples of Python ints,
floats), so a rule stays hashable and equal to the same rule written another way.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import AffineError, RuleError

# dtype kinds a weight can be cast to: bool, ints, unsigned, floats (complex and
# strings, bytes, objects and datetimes are not weights)
_CAST_KINDS = "biuf"


def is_int(value) -> bool:
    """An integer that is not a bool (numpy's integers included)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def int_tuple(value, where: str, field: str, what: str) -> tuple[int, ...]:
    """`value` (a tuple, list or 1-D array of ints) as a tuple of Python ints; RuleError naming
    `where` and `field` otherwise (`what` says what the field holds)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise RuleError(f"{where}: {field}={value!r:.80} is not a tuple of ints: give {what}")
    items = tuple(value)
    bad = [v for v in items if not is_int(v)]
    if bad:
        raise RuleError(f"{where}: {field}={value!r:.80} holds {bad[0]!r:.40} ({type(bad[0]).__name__}), not an "
                        f"int: give {what}")
    return tuple(int(v) for v in items)


def checked_cast(cast, where: str, floating: bool = False, error=RuleError, field: str = "cast"):
    """`cast` (None, or anything numpy reads as a dtype of a weight) as given; `error` (a
    RuleError) naming `where` otherwise. `floating`: only floating dtypes (weights of a model)."""
    if cast is None:
        return None
    try:
        dtype = np.dtype(cast) if not isinstance(cast, (bool, numbers.Number)) else None
    except (TypeError, ValueError):
        dtype = None
    kinds = "f" if floating else _CAST_KINDS
    if dtype is None or _kind(dtype) not in kinds:
        got = f" ({dtype.name})" if dtype is not None else ""
        want = "a floating dtype ('float32', 'bfloat16', 'float16', 'float64')" if floating else \
            "a dtype name such as 'bfloat16' or 'float32'"
        raise error(f"{where}: {field}={cast!r:.60}{got} is not a dtype a weight is sent in: give {want}, or None "
                        "to send the source's dtype")
    return cast


def _kind(dtype: np.dtype) -> str:
    """numpy's kind letter, with ml_dtypes' types (bfloat16, float8_*, int4...: kind 'V') read as
    the floats and ints they are."""
    if dtype.kind != "V":
        return dtype.kind
    import jax.numpy as jnp   # JAX's dtype tree knows ml_dtypes' types

    for kind, family in (("f", jnp.floating), ("i", jnp.integer)):
        if jnp.issubdtype(dtype, family):
            return kind
    return "V"


def checked_constant(value, where: str, field: str):
    """A Part's `scale` / `offset`: None, a real number (a float), or a 1-D vector of real
    numbers (a tuple of floats). AffineError naming `where` and `field` otherwise."""
    if value is None:
        return None
    ask = "give a number, or a 1-D vector of numbers (one per coordinate of the part's axis along=)"
    if isinstance(value, (str, bytes, bool, np.bool_)):
        raise AffineError(f"{where}: {field}={value!r:.80} is a {type(value).__name__}, not a number: {ask}")
    try:
        array = np.asarray(value)
        if array.dtype.kind == "O":   # Python ints beyond int64, or a mix numpy keeps as objects
            odd = [v for v in array.reshape(-1).tolist()
                   if not isinstance(v, numbers.Real) or isinstance(v, (bool, np.bool_))]
            if odd:
                raise AffineError(f"{where}: {field}={value!r:.80} holds {odd[0]!r:.40} ({type(odd[0]).__name__}), "
                                  f"not a number: {ask}")
            array = np.asarray(value, np.float64)
    except AffineError:
        raise
    except OverflowError:
        raise AffineError(f"{where}: {field}={value!r:.80} is larger than a float64 holds: {ask}") from None
    except Exception as error:  # noqa: BLE001 - a tracer, or an object numpy cannot read
        raise AffineError(f"{where}: {field}={value!r:.80} is not a number or a vector of numbers ({error}): "
                          f"{ask}") from None
    if array.dtype.kind not in "iuf":
        kind = {"b": "bools", "c": "complex numbers", "U": "strings", "S": "bytes"}.get(array.dtype.kind,
                                                                                      f"{array.dtype} values")
        raise AffineError(f"{where}: {field}={value!r:.80} holds {kind}, not real numbers: {ask}")
    if array.ndim > 1:
        raise AffineError(f"{where}: {field} has shape {array.shape}: a constant is a number or a 1-D vector along "
                          f"one axis of the part (along=); {ask}")
    floats = array.astype(np.float64)
    if array.ndim == 0:
        return float(floats)
    return tuple(floats.tolist())


def checked_axis(value, where: str, field: str):
    """An int axis (not a bool, not a float or a string)."""
    if not is_int(value):
        raise RuleError(f"{where}: {field}={value!r:.60} ({type(value).__name__}) is not an axis: give an int")
    return int(value)


def checked_count(value, where: str, field: str, what: str) -> int:
    """An int >= 1 (not a bool)."""
    if not is_int(value) or value < 1:
        raise RuleError(f"{where} has {field}={value!r:.60}, which is not {what}: give an int >= 1")
    return int(value)


def checked_name(value, where: str, field: str) -> str:
    if not isinstance(value, str):
        raise RuleError(f"{where}: {field}={value!r:.60} ({type(value).__name__}) is not a tensor name: give a "
                        "str (the '/'-joined path of the tree, or the state-dict name)")
    return value


def in_range(axis: int, ndim: int) -> bool:
    """Whether `axis` names one of `ndim` axes (negative from the end, as numpy)."""
    return -max(ndim, 1) <= axis < max(ndim, 1)



_FLOAT_NAMES = frozenset(("float32", "bfloat16", "float16", "float64"))


def _ints(value) -> bool:
    return type(value) is tuple and all(type(v) is int for v in value)


def checked_piece(piece):
    """A Piece written by hand, its fields in the form the planner reads: the piece itself when
    they are, else a copy with tuples of ints; RuleError naming the field otherwise."""
    from dataclasses import replace

    from .affine import Affine

    p = piece
    if (type(p.dst) is str and type(p.src) is str and _ints(p.dst_start) and _ints(p.size) and _ints(p.src_start)
            and (p.perm is None or _ints(p.perm)) and (p.dtype is None or p.dtype in _FLOAT_NAMES)
            and (p.affine is None or type(p.affine) is Affine)):
        return piece
    where = f"Piece({p.dst!r:.60})"
    checked_name(p.dst, where, "dst")
    checked_name(p.src, where, "src")
    fields = {name: int_tuple(getattr(p, name), where, name, what) for name, what in (
        ("dst_start", "the destination box's first element"), ("size", "the box's extents"),
        ("src_start", "the source box's first element"))}
    if p.perm is not None:
        fields["perm"] = int_tuple(p.perm, where, "perm", "a permutation of the source's axes")
    checked_cast(p.dtype, where, field="dtype")
    if p.affine is not None and not isinstance(p.affine, Affine):
        raise RuleError(f"{where}: affine={p.affine!r:.60} is not an Affine: leave it None, or write the constant "
                        "with Part(scale=, offset=) or from_function")
    return replace(piece, **fields)


def checked_rules(rules):
    """`rules` with every hand-written Piece's fields checked (checked_piece), before anything
    reads their names; Rules check theirs where they are made. A Piece a builder made (a preset,
    from_function, a Rule's lowering: its `origin` names it) is built from checked inputs and
    passes as it is, so a preset's hundred thousand pieces cost one test each. Other values are
    left for the planner to name."""
    if rules is None or isinstance(rules, (str, bytes, dict)) or not hasattr(rules, "__iter__"):
        return rules
    from .rule_types import Piece

    return [checked_piece(r) if type(r) is Piece and not r.origin else r for r in rules]
