"""Rules from a conversion function: `rules.from_function(convert, params)`.

`convert(params) -> {destination name: array}` is the code users already have to
export a checkpoint (reshape, transpose, concatenate, split, slice, index,
squeeze, expand_dims, astype; strided and reversed slices, flip, constant-index
takes, broadcast_to, tile, repeat, unstack). It is traced with `jax.make_jaxpr`
on abstract values (no bytes move, no device memory is used) and every layout
primitive is replayed on fragments (fragments.py); the destination's fragments
become the planner's `Piece`s. A primitive that computes values (arithmetic, a
gather with data-dependent indices...) is refused, naming it, the user's line
that called it, the outputs it feeds, and what to write instead (`ADVICE`).

Scalars computed from constants only (the index arithmetic `x[-1]` leaves in a
jaxpr) are evaluated, so constant indices work whatever form they take.

Traced rules are cached per (function, the plain values it reads: `_plain_state`,
tree structure, shapes, dtypes, cast): a second swap of the same model does no
tracing (`trace_count()` says how many traces ran).

Speed (docs/benchmarks.md, "Rules from a traced conversion function"): JAX's own tracing of the user's Python costs
45 to 65 us per array operation, so a whole 70k-tensor model traced op by op (209k
operations) costs several times the hand-written rules before any of this module runs.
A function JAX traces once and calls many times (a layer converter under `jax.jit`)
is converted once per input signature and reused: the later calls only rename
sources (`fragments.substitute`), and their destinations go to pieces through one
template per output (`fragments.piece_template`). The garbage collector is paused
while a trace runs (the jaxpr and the fragments are hundreds of thousands of young
objects; its passes cost a quarter of the time).
"""

from __future__ import annotations

import gc
import math
import time
from contextlib import contextmanager

import numpy as np

from . import fragments as F
from .from_jax import tree_names
from .layout import LayoutError
from ..errors import TraceError
from .affine import AffineError
from .rule_checks import checked_cast
from .rule_types import Piece

# Primitives that only move elements; anything else touching a source is refused.
LAYOUT_PRIMITIVES = ("reshape", "transpose", "concatenate", "split", "slice (any strides)", "rev (flip)",
                     "dynamic_slice", "gather (constant indices along one axis: x[idx], jnp.take)", "squeeze",
                     "expand_dims", "broadcast_in_dim (broadcast_to, repeat)", "tile", "unstack",
                     "convert_element_type", "copy", "stack", "stop_gradient", "optimization_barrier",
                     "sharding_constraint", "device_put", "pjit / jit / closed_call (inlined)",
                     "mul / div / add / sub / neg by a constant (a scalar or a vector along one axis; floating dtypes)")

# What to write instead of a refused primitive: the swap copies bytes, so anything that
# computes new values belongs before the swap (in the trainer's tree) or after it.
_ARITHMETIC = ("arithmetic makes new values, which a copy cannot: keep the weights as they are stored and "
               "apply it in the trainer before the swap or in the rollout after (a multiply, divide, add or "
               "subtract by a constant, a scalar or a vector along one axis, is accepted: the copy applies it)")
ADVICE = {
    **dict.fromkeys(("add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "rsqrt", "pow", "integer_pow",
                     "max", "min", "abs", "sign", "tanh", "logistic"), _ARITHMETIC),
    **dict.fromkeys(("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin", "cumsum"),
                    "a reduction makes new values: slice the elements you want instead (x[i], x[a:b])"),
    **dict.fromkeys(("gt", "lt", "ge", "le", "eq", "ne", "and", "or", "not"),
                    "a comparison reads the weights' values: pick elements with constant indices (numpy arrays, "
                    "slices) and jnp.concatenate them"),
    "dot_general": "a matrix product makes new values: for a transpose write x.T or jnp.transpose(x, axes)",
    "gather": ("index one axis at a time with constant indices: x[np.array([...])], x[:, np.array([...])] or "
               "jnp.take(x, np.array([...]), axis=k), each in range (compute a permutation with numpy, "
               "not from the weights)"),
    **dict.fromkeys(("scatter", "scatter-add", "scatter_add", "dynamic_update_slice"),
                    "x.at[...].set(...) writes into an array: build the output from slices with "
                    "jnp.concatenate / jnp.stack instead"),
    "concatenate": ("a constant (zeros, padding) joined to a source is in no source: give the rollout a "
                    "tensor of the sources' size, or put the constant in the trainer's tree as a source"),
    "dynamic_slice": "index with Python ints or numpy constants, not values read from the weights",
    "select_n": "jnp.where chooses per element: slice the parts you want and jnp.concatenate them",
    "pad": ("padding writes values no source holds: give the rollout a tensor of the source's size, or "
            "pad the trainer's tree before the swap"),
    "iota": "jnp.arange makes values: index with constant numpy arrays instead",
    **dict.fromkeys(("sort", "argsort"), "sorting depends on values: compute the order once with numpy on the "
                                         "host and index with that constant"),
    "bitcast_convert_type": ("a bitcast reinterprets bytes: the swap's casts convert values (astype); give "
                             "the rollout tensor in the dtype you want, or bitcast it after the swap"),
    **dict.fromkeys(("scan", "while", "cond"), "lax.scan / fori_loop / cond over layers: write a Python loop "
                                               "(for i in range(n): w[i]) or use rules.from_layer_function"),
    **dict.fromkeys(("random_bits", "random_wrap", "random_seed", "threefry2x32"),
                    "random values come from no source tensor: initialise them in the rollout instead"),
}
GATHER_ELEMENTS = 1 << 24  # the largest operand of a gather traced element by element (64 MiB of int32)
_CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "remat", "remat2", "checkpoint")


class _Sym:
    """A traced value made of source fragments.

    The output of a reused call (see `_Interpreter._reuse`) keeps its fragments as the call's
    conversion on placeholders plus the real fragments bound to them, and renames them only
    when they are read: an output that is a destination goes to pieces by `piece_template`.
    """
    __slots__ = ("_frags", "shape", "dtype", "template", "bindings")

    def __init__(self, frags, shape, dtype, template=None, bindings=None):
        self._frags, self.shape, self.dtype = frags, shape, dtype
        self.template, self.bindings = template, bindings

    @property
    def frags(self) -> list:
        if self._frags is None:
            self._frags = F.substitute(self.template.frags, self.bindings)
        return self._frags


_cache: dict = {}
_traces = 0
_phases: dict = {}


def trace_count() -> int:
    """How many times a function was traced (cache hits do not count)."""
    return _traces


def clear_cache() -> None:
    _cache.clear()


def last_trace_phases() -> dict:
    """CPU seconds of the last trace, per phase: 'make_jaxpr' (JAX runs the function),
    'walk' (layout primitives replayed on fragments), 'pieces' (fragments to `Piece`s),
    and 'calls reused' (how many call equations were answered by an earlier conversion)."""
    return dict(_phases)


@contextmanager
def _gc_paused():
    """No cyclic garbage collection inside: a trace makes hundreds of thousands of young
    objects that live until it ends, and collecting them repeatedly finds nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _abstract(leaf):
    import jax
    return jax.ShapeDtypeStruct(tuple(int(n) for n in leaf.shape), np.dtype(leaf.dtype))


def from_function(convert, params, *, cast: str | None = None) -> list[Piece]:
    """Rules (as `Piece`s) equal to running `convert(params)` and copying its outputs.

    `params`: the trainer's tree (jax.Arrays, numpy arrays, ShapeDtypeStructs or Layouts:
    only shapes and dtypes are read). Source names are `tree_names(params)`; destination
    names are `tree_names(convert(params))` (a flat dict of state-dict names keeps its keys).
    `cast`: a dtype every output is sent in when `convert` leaves it uncast.
    Cached per function and the plain values it reads (`_plain_state`): a function that reads
    state held in a mutable object must be a new function each time it changes, or call
    `rules.clear_trace_cache()` (jitted calls inside `convert` reuse JAX's own trace, as they do
    when `convert` runs, so the plan still equals running it).
    """
    import jax

    _check_arguments(convert, cast, "from_function")
    names = _names(params, "params")
    for name, leaf in names.items():
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            raise TraceError(f"params leaf {name!r} is {type(leaf).__name__} {leaf!r:.60}, not an array: give "
                             "jax.Arrays, numpy arrays, ShapeDtypeStructs or Layouts")
    leaves, treedef = jax.tree_util.tree_flatten(params)
    shapes = tuple((tuple(int(n) for n in leaf.shape), np.dtype(leaf.dtype).name) for leaf in leaves)
    key = (convert, _plain_state(convert), treedef, shapes, cast)
    try:
        hit = _cache.get(key)
    except TypeError:  # an unhashable function: trace every time
        key, hit = None, None
    if hit is not None:
        return list(hit)
    pieces = _trace(convert, params, names, cast)
    if key is not None:
        _cache[key] = tuple(pieces)
    return pieces


def from_layer_function(convert_layer, params, stack: str, prefix: str, *,
                        cast: str | None = None) -> list[Piece]:
    """Rules for a scanned layer stack, tracing one layer only.

    `params[stack]` (a '/'-separated key path) holds every layer stacked on axis 0;
    `convert_layer(layer) -> {name: array}` converts one layer (the tree with axis 0
    removed). Layer i's outputs are named `prefix.format(i) + name`. The trace runs once
    and is replicated over the layers, so planning a 60-layer model costs one layer's trace.
    Cached like `from_function`; combine with `from_function` for the tensors outside the stack.
    """
    import jax

    _check_arguments(convert_layer, cast, "from_layer_function")
    if not isinstance(stack, str) or not isinstance(prefix, str):
        raise TraceError(f"from_layer_function: stack and prefix are strings ('layers', 'model.layers.{{}}.'), "
                         f"got {type(stack).__name__} and {type(prefix).__name__}")
    try:
        named = {prefix.format(0), prefix.format(1)}
    except (IndexError, KeyError, ValueError) as error:
        named = error
    if not isinstance(named, set) or len(named) != 2:
        raise TraceError(f"from_layer_function: prefix {prefix!r} must hold one '{{}}' for the layer number "
                         "(e.g. 'model.layers.{}.'): each layer's outputs need names of their own")
    layers = params
    for depth, key in enumerate(stack.split("/")):
        try:
            layers = layers[key]
        except (KeyError, IndexError, TypeError):
            where = "/".join(stack.split("/")[:depth]) or "params"
            keys = sorted(map(str, layers.keys())) if hasattr(layers, "keys") else []
            raise TraceError(f"from_layer_function: stack {stack!r}: {where} has no key {key!r} "
                             f"(its keys: {', '.join(keys[:8]) or 'none, it is a ' + type(layers).__name__})") from None
    scalars = ["/".join(filter(None, (stack, n))) for n, x in tree_names(layers).items()
               if len(getattr(x, "shape", ())) == 0]
    if scalars:
        raise TraceError(f"from_layer_function: {scalars[0]} has no axis 0 to hold the layers "
                         "(a scalar): stack holds every layer's tensors stacked on axis 0")
    one = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(tuple(x.shape[1:]), np.dtype(x.dtype)), layers)
    counts = {int(x.shape[0]) for x in jax.tree_util.tree_leaves(layers)}
    if len(counts) != 1:
        raise TraceError(f"from_layer_function: the leaves under {stack!r} do not share one layer count on "
                         f"axis 0 (found {sorted(counts)})")
    count = counts.pop()
    leaves, treedef = jax.tree_util.tree_flatten(one)
    key = ("layers", convert_layer, _plain_state(convert_layer), treedef, tuple((x.shape, x.dtype.name) for x in leaves), stack, prefix, count,
           cast)
    try:
        hit = _cache.get(key)
    except TypeError:
        key, hit = None, None
    if hit is not None:
        return list(hit)
    pieces = []
    for p in from_function(convert_layer, one, cast=cast):
        perm = None if p.perm is None else (0,) + tuple(a + 1 for a in p.perm)
        for i in range(count):
            pieces.append(Piece(prefix.format(i) + p.dst, p.dst_start, p.size, f"{stack}/{p.src}",
                                (i,) + p.src_start, perm, p.dtype, p.origin,
                                None if p.affine is None else p.affine.shifted(1)))
    if key is not None:
        _cache[key] = tuple(pieces)
    return pieces


_PLAIN = (int, float, complex, str, bytes, bool, type(None))


def _plain(value) -> bool:
    """Numbers, strings, tuples of them, and NumPy scalars (a scale like np.float32(8 ** 0.5))."""
    plain = _PLAIN + (np.generic,)
    return isinstance(value, plain) or (type(value) is tuple and all(isinstance(v, plain) for v in value))


def _plain_state(convert) -> tuple:
    """The plain values (numbers, strings, tuples of them) `convert` reads besides its argument:
    the globals its code names, its closure's cells, its defaults. Part of the cache key, so
    `N = 3` after a trace made with `N = 2` traces again instead of returning the old plan.
    State held in mutable objects (a list, a config object) is not seen: a function that
    reads it must be a new function, or call `clear_trace_cache()`, as with `jax.jit`."""
    function = getattr(convert, "__func__", convert)  # a bound method: its function
    code = getattr(function, "__code__", None)
    if code is None:
        return ()
    namespace = getattr(function, "__globals__", {})
    state = [(name, namespace[name]) for name in code.co_names if name in namespace and _plain(namespace[name])]
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        state.append(value if _plain(value) else None)
    defaults = (getattr(function, "__defaults__", None) or ()) + tuple((getattr(function, "__kwdefaults__", None)
                                                                         or {}).items())
    state.extend(v for v in defaults if _plain(v))
    return tuple(state)


def _check_arguments(convert, cast, verb: str) -> None:
    if not callable(convert):
        raise TraceError(f"{verb}: the conversion function is {type(convert).__name__} {convert!r:.60}, "
                         "not a function")
    checked_cast(cast, verb, error=TraceError)


def _trace(convert, params, names, cast) -> list[Piece]:
    with _gc_paused():
        return _trace_phases(convert, params, names, cast)


def _trace_phases(convert, params, names, cast) -> list[Piece]:
    import jax
    global _traces
    _traces += 1
    _phases.clear()
    clock = time.process_time()
    abstract = jax.tree_util.tree_map(_abstract, params)
    closed, out_names = _jaxpr_and_output_names(convert, abstract)
    _phases["make_jaxpr"], clock = time.process_time() - clock, time.process_time()
    src_names = list(names)
    ranks = {n: len(leaf.shape) for n, leaf in names.items()}
    dtypes = {n: np.dtype(leaf.dtype).name for n, leaf in names.items()}
    inputs = [_Sym([F.whole(n, names[n].shape)], tuple(names[n].shape), dtypes[n]) for n in src_names]
    interpreter = _Interpreter(dtypes, out_names)
    outs = interpreter.run(closed.jaxpr, closed.consts, inputs, top=True)
    _phases["walk"], clock = time.process_time() - clock, time.process_time()
    _phases["calls reused"] = interpreter.reused
    origin = f"from_function({_label(convert)})"
    pieces, templates = [], _Templates(ranks)
    for name, value in zip(out_names, outs):
        if not isinstance(value, _Sym):
            raise TraceError(f"output {name!r} is a constant, not made from any source tensor: "
                             "from_function maps sources to destinations only")
        if value.template is not None and value._frags is None and cast is None:
            pieces.extend(templates.pieces(name, value, origin))
            continue
        frags = value.frags
        if cast is not None and np.dtype(value.dtype) != np.dtype(cast):
            try:
                frags = F.cast(frags, np.dtype(cast).name, dtypes)
            except ValueError as error:
                raise TraceError(f"output {name!r}: cast={cast!r} on top of the function's own cast: {error}") from None
        pieces.extend(F.to_pieces(name, frags, ranks, origin))
    _phases["pieces"] = time.process_time() - clock
    return pieces


class _Templates:
    """Pieces of the outputs of reused calls, through one template per (call output, call
    signature: the sources, axes and casts bound to the call's arguments)."""

    def __init__(self, ranks):
        self.ranks = ranks
        self.number_of = {}      # id(bindings) -> signature number (one bindings dict per call)
        self.numbers = {}        # signature -> its number
        self.zeroed = []         # per signature number: fragments.zeroed(...)
        self.rows = {}           # (id(call output), signature number) -> fragments.piece_template(...)

    def pieces(self, name, value, origin) -> list[Piece]:
        bindings = value.bindings
        number = self.number_of.get(id(bindings))
        if number is None:
            signature = tuple((k, g.src, g.axis_of, g.dtype, g.affine) for k, g in bindings.items())
            number = self.numbers.get(signature)
            if number is None:
                number = self.numbers[signature] = len(self.zeroed)
                self.zeroed.append(F.zeroed(bindings, self.ranks))
            self.number_of[id(bindings)] = number
        key = (id(value.template), number)
        rows = self.rows.get(key)
        if rows is None:
            rows = self.rows[key] = F.piece_template(value.template.frags, self.zeroed[number])
        return F.from_template(name, rows, bindings, origin)


def _jaxpr_and_output_names(convert, abstract):
    """The jaxpr of `convert` and its outputs' names.

    The function is traced returning its outputs as a flat list, its output tree kept aside:
    JAX names every result by its key path (debug information), and for 70k dict keys that
    cost a third of the trace; list positions are cheap. (`make_jaxpr(return_shape=True)`
    would also build a ShapeDtypeStruct per output.)"""
    import collections.abc

    import jax
    found = []

    def flat(params):
        out = convert(params)
        if not isinstance(out, collections.abc.Mapping):  # a bare array would be named '', a list '0', '1'...
            raise TraceError(f"{_label(convert)} returned {type(out).__name__}, not a mapping of destination "
                             "names to arrays: return {'model.embed_tokens.weight': ..., ...}")
        try:
            leaves, tree = jax.tree_util.tree_flatten(out)
        except Exception as error:  # e.g. a dict with keys 1 and "1": JAX cannot sort them
            raise TraceError(f"the output of {_label(convert)} is not a tree JAX can flatten ({error}): "
                             "return a dict of destination names (strings)") from None
        found.append((tree, _state_dict_names(out, leaves)))
        return leaves
    try:
        closed = jax.make_jaxpr(flat)(abstract)
    except TraceError:
        raise
    except Exception as error:  # the user's own error: theirs to read, with where it came from
        error.add_note(f"(raised by {_label(convert)} while jax_amem.rules.from_function traced it on "
                       "abstract values: no bytes, only shapes and dtypes)")
        raise
    tree, names = found[-1]
    if names is None:
        names = list(_names(jax.tree_util.tree_unflatten(tree, range(tree.num_leaves)), f"the output of {_label(convert)}"))
    return closed, names


def _label(convert) -> str:
    return getattr(convert, "__qualname__", type(convert).__name__)


def _names(tree, what: str) -> dict:
    """`tree_names(tree)`, a name shared by two leaves refused as a TraceError naming `what`."""
    try:
        return tree_names(tree)
    except LayoutError as error:
        raise TraceError(f"{what}: {error}") from None


def _state_dict_names(out, leaves) -> list[str] | None:
    """The keys of a flat `{str: array}` dict (a state dict: the usual output), in the order
    JAX flattened it, or None for any other tree. `tree_names` would give the same names;
    it walks key paths, 0.3 s for 70k outputs. Each key is checked against its leaf."""
    if type(out) is not dict or len(out) != len(leaves) or not all(type(k) is str for k in out):
        return None
    keys = sorted(out)
    if any(out[k] is not leaf for k, leaf in zip(keys, leaves)):
        return None
    return keys


def _concrete(constant) -> np.ndarray:
    """A constant the function closes over, as numpy; TraceError when it is a value JAX is still
    tracing (from_function called inside jax.jit, or a tracer that escaped one)."""
    import jax

    try:
        return np.asarray(constant)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        raise TraceError(f"the function closes over a constant of shape {tuple(constant.shape)} and dtype "
                         f"{constant.dtype} whose value JAX is still tracing (from_function called inside jax.jit, or "
                         "a tracer kept from one): a constant step needs its value. Call from_function outside "
                         "jit, with the constant as a concrete array (or a NumPy value)") from None


class _Interpreter:
    def __init__(self, source_dtypes, out_names):
        self.source_dtypes = dict(source_dtypes)   # placeholders (see _call) are added
        self.out_names = out_names
        self.converted = {}                        # (id(call jaxpr), inputs' shapes and dtypes) -> (jaxpr, outputs)
        self.reused = 0

    def run(self, jaxpr, consts, args, top=False):
        """The values of `jaxpr`'s outputs; a refused equation raises `_Refused` (a `TraceError`
        at the top, naming the outputs it feeds)."""
        env = {}

        def read(v):
            if type(v).__name__ == "Literal":
                return np.asarray(v.val)
            return env[v]

        for v, c in zip(jaxpr.constvars, consts):
            env[v] = _concrete(c)
        for v, a in zip(jaxpr.invars, args):
            env[v] = a
        for position, eqn in enumerate(jaxpr.eqns):
            values = [read(v) for v in eqn.invars]
            try:
                results = self.apply(eqn, values)
            except _Refused as refused:
                if refused.line is None:  # the innermost equation's: jnp's own calls are skipped
                    refused.line = _user_line(eqn)
                if top:
                    raise TraceError(self._refusal(refused, jaxpr, position)) from None
                raise
            for v, r in zip(eqn.outvars, results):
                env[v] = r
        return [read(v) for v in jaxpr.outvars]

    def _refusal(self, refused, jaxpr, position) -> str:
        """Names the user's line, the outputs that depend on the refused equation, and what to
        write instead."""
        tainted = set(map(id, jaxpr.eqns[position].outvars))
        for eqn in jaxpr.eqns[position + 1:]:
            if any(id(v) in tainted for v in eqn.invars):
                tainted.update(map(id, eqn.outvars))
        fed = [n for n, v in zip(self.out_names, jaxpr.outvars) if id(v) in tainted]
        feeds = (f"it feeds output {fed[0]!r}" + (f" and {len(fed) - 1} more" if len(fed) > 1 else "")
                 if fed else "it feeds no output")
        where = f", at {refused.line}" if refused.line else ""
        advice = f". Instead: {ADVICE[refused.primitive]}" if refused.primitive in ADVICE else ""
        return (f"{refused.why}{where}; {feeds}{advice}. from_function accepts layout operations only: "
                f"{', '.join(LAYOUT_PRIMITIVES)}")

    def apply(self, eqn, values):
        name = eqn.primitive.name
        symbolic = [isinstance(v, _Sym) for v in values]
        if not any(symbolic):  # constants only (index arithmetic): evaluate
            out = eqn.primitive.bind(*values, **eqn.params)
            return [np.asarray(o) for o in out] if eqn.primitive.multiple_results else [np.asarray(out)]
        handler = getattr(self, "_" + name, None)
        if handler is None and name in _CALLS:
            handler = self._call
        if handler is None:
            raise _Refused(f"primitive {name!r} computes values from a source tensor "
                           f"({self._source_of(values)}), which a weight swap cannot do", name)
        return handler(eqn, values, **eqn.params)

    @staticmethod
    def _source_of(values) -> str:
        for v in values:
            if isinstance(v, _Sym) and v.frags:
                return f"source {v.frags[0].src!r}"
        return "a source"

    # -- layout primitives ------------------------------------------------------------------

    def _call(self, eqn, values, **params):
        inner = params.get("jaxpr", params.get("call_jaxpr"))
        jaxpr, consts = (inner.jaxpr, inner.consts) if hasattr(inner, "consts") else (inner, ())
        if all(isinstance(v, _Sym) and F.covers(v.frags, v.shape) for v in values):
            reused = self._reuse(inner, jaxpr, consts, values)
            if reused is not None:
                return reused
        return self.run(jaxpr, consts, values)

    def _reuse(self, inner, jaxpr, consts, values):
        """The call's outputs from its conversion on placeholder sources, renamed onto the
        real ones: a jitted layer converter called for 60 layers is converted once.
        None where that does not apply (the caller then runs the call itself, so a refusal
        names the real sources)."""
        key = (id(inner), tuple((v.shape, v.dtype) for v in values))
        entry = self.converted.get(key)
        if entry is None:
            placeholders = []
            for k, v in enumerate(values):
                name = _placeholder(inner, k)
                self.source_dtypes[name] = v.dtype
                placeholders.append(_Sym([F.whole(name, v.shape)], v.shape, v.dtype))
            try:
                outs = self.run(jaxpr, consts, placeholders)
            except _Refused:
                outs = None
            frags = [f for o in outs if isinstance(o, _Sym) for f in o.frags] if outs is not None else []
            casts = any(map(_transformed, frags))
            if any(map(_vector_steps, frags)):
                outs = None  # vectors are in source coordinates: run the call on the real sources
            entry = self.converted[key] = (inner, outs, casts)  # holding `inner` keeps its id unique
        else:
            self.reused += 1
        outs, casts = entry[1], entry[2]
        if outs is None or ((casts or any(_vector_steps(v.frags[0]) for v in values))
                            and any(_transformed(v.frags[0]) for v in values)):
            return None  # a cast on a cast, constants on either side: run the call with the real names
        bindings = {_placeholder(inner, k): v.frags[0] for k, v in enumerate(values)}
        return [_Sym(None, out.shape, out.dtype, out, bindings) if isinstance(out, _Sym) else out for out in outs]

    def _transpose(self, eqn, values, permutation, **_):
        (x,) = values
        return [_Sym(F.transpose(x.frags, permutation), tuple(x.shape[a] for a in permutation), x.dtype)]

    def _reshape(self, eqn, values, new_sizes, dimensions=None, **_):
        x = values[0]
        if dimensions is not None:
            raise _Refused("primitive 'reshape' with dimensions= (a transposing reshape): write the transpose")
        new = tuple(int(n) for n in new_sizes)
        return [_Sym(F.reshape(x.frags, x.shape, new), new, x.dtype)]

    def _squeeze(self, eqn, values, dimensions, **_):
        (x,) = values
        dims = [d % len(x.shape) for d in dimensions]
        return [_Sym(F.squeeze(x.frags, dims), tuple(n for i, n in enumerate(x.shape) if i not in dims), x.dtype)]

    def _expand_dims(self, eqn, values, dimensions, **_):
        (x,) = values
        rank = len(x.shape) + len(dimensions)
        dims = {d % rank for d in dimensions}
        kept = [i for i in range(rank) if i not in dims]
        shape = [1] * rank
        for i, n in zip(kept, x.shape):
            shape[i] = n
        return [_Sym(F.expand(x.frags, rank, kept), tuple(shape), x.dtype)]

    def _broadcast_in_dim(self, eqn, values, shape, broadcast_dimensions, **_):
        """New axes and unit axes stretched to n: each output row along them is row 0
        (broadcast_to, and jnp.repeat's broadcast before its reshape)."""
        x = values[0]
        shape = tuple(int(n) for n in shape)
        kept = list(broadcast_dimensions)
        frags = F.expand(x.frags, len(shape), kept)
        grown = [1] * len(shape)
        for j, n in zip(kept, x.shape):
            grown[j] = n
        for j, (have, want) in enumerate(zip(grown, shape)):
            if have != want:
                frags = F.pick(frags, j, [0] * want)
        return [_Sym(frags, shape, x.dtype)]

    def _tile(self, eqn, values, reps, **_):
        (x,) = values
        frags, shape = x.frags, list(x.shape)
        for axis, r in enumerate(reps):
            if r != 1:
                frags = F.pick(frags, axis, list(range(shape[axis])) * int(r))
                shape[axis] *= int(r)
        return [_Sym(frags, tuple(shape), x.dtype)]

    def _rev(self, eqn, values, dimensions, **_):
        (x,) = values
        frags = x.frags
        for axis in dimensions:
            frags = F.pick(frags, axis, range(x.shape[axis] - 1, -1, -1))
        return [_Sym(frags, x.shape, x.dtype)]

    def _gather(self, eqn, values, dimension_numbers, slice_sizes, mode, **_):
        """A gather with constant indices that vary along one axis (x[idx], x[:, idx, 1:],
        jnp.take) is a slice of the other axes and a pick of rows; other gathers are refused
        with `ADVICE['gather']`."""
        x, indices = values
        if isinstance(indices, _Sym):
            raise _Refused(f"primitive 'gather' with indices computed from a source tensor "
                           f"({self._source_of([indices])})", "gather")
        taken = _rows_gather(dimension_numbers, tuple(slice_sizes), x.shape, np.asarray(indices),
                             "FILL" in str(mode).upper())
        if isinstance(taken, str):
            return self._gather_elements(eqn, x, indices, taken)
        axis, rows, start, limit, batch, collapsed, out_axes = taken
        frags = F.pick(F.slice_box(x.frags, start, limit), axis, rows.tolist())
        # the picked rows first, split into the index's shape; the operand's other kept axes after
        others = [j for j in range(len(x.shape)) if j != axis]
        frags = F.transpose(frags, [axis] + others)
        kept = [j for j in range(len(x.shape)) if j not in collapsed]
        shape = tuple(batch) + tuple(limit[j] - start[j] for j in kept)
        frags = F.reshape(frags, (len(rows),) + tuple(limit[j] - start[j] for j in others), shape)
        perm = sorted(range(len(out_axes)), key=out_axes.__getitem__)
        return [_Sym(F.transpose(frags, perm), tuple(shape[a] for a in perm), x.dtype)]

    def _gather_elements(self, eqn, x, indices, why):
        """Any other gather with constant indices (x[i, :, ::2] with i an array, pairs of
        indices): the gather run on the value's element numbers says which element each
        output element is; runs of consecutive numbers become fragments. Costs an int32 per
        element of the operand, so only up to `GATHER_ELEMENTS`."""
        size = math.prod(x.shape)
        if size > GATHER_ELEMENTS:
            raise _Refused(f"primitive 'gather' ({why}; operand of {size} elements, more than the "
                           f"{GATHER_ELEMENTS} an element-wise gather is traced for; {self._source_of([x])})", "gather")
        params = dict(eqn.params, fill_value=-1)
        numbers = np.arange(size, dtype=np.int32).reshape(x.shape)
        taken = np.asarray(eqn.primitive.bind(numbers, np.asarray(indices), **params))
        if (taken < 0).any():
            raise _Refused(f"primitive 'gather': an index is out of range ({why}), which reads a fill value, "
                           f"not a source ({self._source_of([x])})", "gather")
        flat = F.pick(F.reshape(x.frags, x.shape, (size,)), 0, taken.reshape(-1).tolist())
        return [_Sym(F.reshape(flat, (taken.size,), taken.shape), tuple(taken.shape), x.dtype)]

    def _unstack(self, eqn, values, axis, **_):
        (x,) = values
        axis %= len(x.shape)
        out = []
        for i in range(x.shape[axis]):
            start = [0] * len(x.shape)
            limit = list(x.shape)
            start[axis], limit[axis] = i, i + 1
            out.append(_Sym(F.squeeze(F.slice_box(x.frags, start, limit), [axis]),
                            x.shape[:axis] + x.shape[axis + 1:], x.dtype))
        return out

    def _slice(self, eqn, values, start_indices, limit_indices, strides=None, **_):
        (x,) = values
        start, limit = tuple(start_indices), tuple(limit_indices)
        frags = F.slice_box(x.frags, start, limit)
        shape = [b - a for a, b in zip(start, limit)]
        for axis, step in enumerate(strides or ()):
            if step != 1:  # x[::2]: every step-th row of the box, one fragment per row
                rows = range(0, shape[axis], step)
                frags, shape[axis] = F.pick(frags, axis, rows), len(rows)
        return [_Sym(frags, tuple(shape), x.dtype)]

    def _dynamic_slice(self, eqn, values, slice_sizes, **_):
        x, *indices = values
        if any(isinstance(i, _Sym) for i in indices):
            raise _Refused("primitive 'dynamic_slice' with an index computed from a source tensor", "dynamic_slice")
        # JAX clamps starts so the slice fits
        start = tuple(int(min(max(int(i), 0), n - s)) for i, n, s in zip(indices, x.shape, slice_sizes))
        limit = tuple(a + s for a, s in zip(start, slice_sizes))
        return [_Sym(F.slice_box(x.frags, start, limit), tuple(slice_sizes), x.dtype)]

    def _concatenate(self, eqn, values, dimension, **_):
        frags, offset = [], 0
        for v in values:
            if not isinstance(v, _Sym):
                raise _Refused("primitive 'concatenate' joins a constant to a source tensor", "concatenate")
            frags += F.shift(v.frags, dimension, offset)
            offset += v.shape[dimension]
        shape = list(values[0].shape)
        shape[dimension] = offset
        return [_Sym(frags, tuple(shape), _common_dtype(values, "concatenate"))]

    def _stack(self, eqn, values, axis, **_):
        rank = len(values[0].shape) + 1
        axis %= rank
        kept = [i for i in range(rank) if i != axis]
        frags = []
        for i, v in enumerate(values):
            if not isinstance(v, _Sym):
                raise _Refused("primitive 'stack' joins a constant to a source tensor", "concatenate")
            frags += F.shift(F.expand(v.frags, rank, kept), axis, i)
        shape = list(values[0].shape)
        shape.insert(axis, len(values))
        return [_Sym(frags, tuple(shape), _common_dtype(values, "stack"))]

    def _split(self, eqn, values, sizes, axis, **_):
        (x,) = values
        out, offset = [], 0
        for n in sizes:
            start = [0] * len(x.shape)
            limit = list(x.shape)
            start[axis], limit[axis] = offset, offset + int(n)
            shape = list(x.shape)
            shape[axis] = int(n)
            out.append(_Sym(F.slice_box(x.frags, start, limit), tuple(shape), x.dtype))
            offset += int(n)
        return out

    def _convert_element_type(self, eqn, values, new_dtype, **_):
        (x,) = values
        dtype = np.dtype(new_dtype).name
        try:
            frags = F.cast(x.frags, dtype, self.source_dtypes, round_between=True)
        except ValueError as error:
            raise _Refused(str(error)) from None
        return [_Sym(frags, x.shape, dtype)]

    def _constant_step(self, eqn, values, op):
        """`value op constant` (or `constant op value`): a constant step the copy runs
        (reshard/affine.py). Both operands from sources, or a constant that varies along more
        than one axis, computes new values: refused as before."""
        a, b = values
        name = eqn.primitive.name
        if isinstance(a, _Sym) == isinstance(b, _Sym):
            raise _Refused(f"primitive {name!r} computes values from a source tensor "
                           f"({self._source_of(values)}), which a weight swap cannot do", name)
        x, constant = (a, b) if isinstance(a, _Sym) else (b, a)
        x = _stretched(x, tuple(int(n) for n in eqn.outvars[0].aval.shape))
        if not isinstance(a, _Sym):
            if op == "div":
                raise _Refused(f"primitive 'div' divides a constant by a source tensor "
                               f"({self._source_of(values)}), which a weight swap cannot do", name)
            op = "rsub" if op == "sub" else op
        constant = np.asarray(constant)
        axis = _constant_axis(constant, x.shape)
        if isinstance(axis, str):
            raise _Refused(f"primitive {name!r} with a constant that {axis} ({self._source_of(values)})", name)
        vector = None if axis is None else np.broadcast_to(constant, x.shape)[
            tuple(slice(None) if j == axis else 0 for j in range(len(x.shape)))]
        try:
            frags = F.affine(x.frags, op, np.dtype(x.dtype).name, constant if axis is None else vector, axis)
        except AffineError as error:
            raise _Refused(f"primitive {name!r} on {self._source_of(values)}: {error}", name) from None
        return [_Sym(frags, x.shape, x.dtype)]

    def _mul(self, eqn, values, **_):
        return self._constant_step(eqn, values, "mul")

    def _div(self, eqn, values, **_):
        return self._constant_step(eqn, values, "div")

    def _add(self, eqn, values, **_):
        return self._constant_step(eqn, values, "add")

    def _sub(self, eqn, values, **_):
        return self._constant_step(eqn, values, "sub")

    def _neg(self, eqn, values, **_):
        return self._constant_step(eqn, [values[0], np.asarray(-1, values[0].dtype)], "mul")

    def _copy(self, eqn, values, **_):
        """Primitives that return their inputs as they are (a copy, a gradient or scheduling
        marker, a sharding placement: where the bytes live is the plan's business)."""
        return list(values)

    _copy_p = _stop_gradient = _optimization_barrier = _sharding_constraint = _device_put = _copy


def _transformed(f) -> bool:
    """Whether a fragment is cast or has constant steps."""
    return f.dtype is not None or f.affine is not None


def _vector_steps(f) -> bool:
    return f.affine is not None and any(not step.is_scalar for step in f.affine.steps)


def _placeholder(call, k: int) -> str:
    """The source name standing for argument k of a call while it is converted once (a NUL
    first: no tree name has one)."""
    return f"\0call {id(call)} argument {k}"


def _constant_axis(constant: np.ndarray, shape) -> int | None | str:
    """The one axis of `shape` a constant (broadcastable to it) varies along, None for one
    value everywhere, or why it is neither (a str)."""
    if constant.ndim > len(shape):
        return f"has more axes than the value ({constant.shape} against {tuple(shape)})"
    full = (1,) * (len(shape) - constant.ndim) + constant.shape
    constant = constant.reshape(full)
    if constant.size == 0:
        return "is empty"
    varying = []
    for j, n in enumerate(full):
        if n > 1 and not (constant == constant.take([0], axis=j)).all():
            varying.append(j)
    if not varying:
        return None
    if len(varying) > 1:
        return f"varies along {len(varying)} axes {varying} (one axis at most: a scalar or a vector)"
    return varying[0]


def _common_dtype(values, what):
    dtypes = {v.dtype for v in values}
    if len(dtypes) > 1:
        raise _Refused(f"primitive {what!r} joins dtypes {sorted(dtypes)}")
    return dtypes.pop()


def _rows_gather(numbers, slice_sizes, shape, indices, fills):
    """A gather whose indices vary along one operand axis only, each a whole row there, and
    are constant window starts on the others: (that axis, its rows (flat), the window's start
    and limit on every axis (the row axis whole), the index's batch shape, the collapsed axes,
    each value axis's output position: batch axes first, then the operand's kept axes); or
    why it is not one (a str). `fills`: an index out of range reads a fill value (refused);
    otherwise it is clamped, as XLA does."""
    if getattr(numbers, "operand_batching_dims", ()) or getattr(numbers, "start_indices_batching_dims", ()):
        return "batched indices"
    mapped = list(numbers.start_index_map)
    if indices.ndim == 0 or indices.shape[-1] != len(mapped):
        return f"indices of shape {indices.shape} for {len(mapped)} axes"
    starts = indices.reshape(-1, len(mapped)).astype(np.int64)
    varying = [k for k in range(len(mapped)) if (starts[:, k] != starts[0, k]).any()]
    single = [k for k in range(len(mapped)) if slice_sizes[mapped[k]] == 1]
    if len(varying) > 1 or not single or (varying and varying[0] not in single):
        return f"indices that vary along {len(varying)} axes (axes {[mapped[k] for k in varying]}), windows {slice_sizes}"
    row = varying[0] if varying else single[0]
    axis = mapped[row]
    start, limit = [0] * len(shape), list(shape)
    for k, j in enumerate(mapped):
        if k == row:
            continue
        first, last = int(starts[0, k]), int(starts[0, k]) + slice_sizes[j]
        if fills and (first < 0 or last > shape[j]):
            return f"window [{first}, {last}) outside axis {j} of size {shape[j]}, which reads a fill value"
        first = min(max(first, 0), shape[j] - slice_sizes[j])
        start[j], limit[j] = first, first + slice_sizes[j]
    for j, size in enumerate(slice_sizes):
        if j not in mapped and size != shape[j]:
            start[j], limit[j] = 0, size
    rows = starts[:, row]
    outside = (rows < 0) | (rows >= shape[axis])
    if outside.any():
        if fills:  # jnp.take's default: an index out of range reads the fill value, no source
            return f"index {int(rows[outside][0])} outside axis {axis} of size {shape[axis]}, which reads a fill value"
        rows = np.clip(rows, 0, shape[axis] - 1)
    collapsed = set(numbers.collapsed_slice_dims)
    batch = indices.shape[:-1]
    offsets = list(numbers.offset_dims)
    rank = len(batch) + len(offsets)
    batch_axes = [j for j in range(rank) if j not in set(offsets)]
    return axis, rows, start, limit, batch, collapsed, batch_axes + offsets


def _user_line(eqn) -> str | None:
    """'file:line (function)' of the user's code that made `eqn` (JAX's own frames skipped)."""
    from .. import _jax_compat

    return _jax_compat.user_line(eqn)


class _Refused(Exception):
    def __init__(self, why, primitive=None):
        super().__init__(why)
        self.why, self.primitive, self.line = why, primitive, None


def _stretched(x: "_Sym", shape: tuple[int, ...]) -> "_Sym":
    """`x` with its unit axes stretched to `shape`, as lax stretches an operand's unit axes
    against the other's (`w` of shape (1, 1) times a constant of shape (1, 2)): each output row
    along them is row 0."""
    if tuple(x.shape) == shape or len(x.shape) != len(shape):
        return x
    frags = x.frags
    for axis, (have, want) in enumerate(zip(x.shape, shape)):
        if have != want:
            frags = F.pick(frags, axis, [0] * want)
    return _Sym(frags, shape, x.dtype)
