"""Generated hostile input for the public verbs (hypothesis, derandomized, bounded): trees, names,
rules and layouts as a careless user or a hostile caller would give them. Registered as cases of
tests/hostile/cases.py, so each runs in a child process where a crash is a failing test.

Each case holds one promise for every input: the verb either does exactly what an oracle says, or
raises a member of jax-amem's error family (JaxAmemError) and leaves every input as it was.
"""

from __future__ import annotations

import os

import numpy as np

GENERATED = {}
# Small enough to take seconds each on a 2-core CPU machine, large enough to cross every branch
# of the refusals below; derandomized, so a failure repeats.
EXAMPLES = {"swap": 40, "plan": 150, "to_torch": 40, "pause": 30}


def _generated(function):
    GENERATED[function.__name__] = function
    return function


def _settings(examples: int):
    from hypothesis import HealthCheck, settings

    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def _outcome(call):
    try:
        return call(), None
    except Exception as error:  # noqa: BLE001 - judged below
        return None, error


class _Tally:
    """How many examples a verb accepted and refused: a generated case must see both, or its
    strategies no longer reach one of the branches it claims to test."""

    def __init__(self, verb: str):
        self.verb, self.accepted, self.refused = verb, 0, 0

    def __call__(self, error) -> None:
        if error is None:
            self.accepted += 1
        else:
            self.refused += 1
            if os.environ.get("HOSTILE_TRACE"):
                print(f"{self.verb} refused: {type(error).__name__}: {str(error)[:300]}", flush=True)

    def check(self) -> None:
        if os.environ.get("HOSTILE_TRACE"):
            print(f"{self.verb}: {self.accepted} accepted, {self.refused} refused", flush=True)
        assert self.accepted and self.refused, (f"{self.verb}: {self.accepted} accepted, {self.refused} refused: "
                                                "the generated inputs no longer cross both branches")


def _in_family(error, verb: str, inputs) -> None:
    import jax_amem

    assert isinstance(error, jax_amem.JaxAmemError), (
        f"{verb} raised {type(error).__module__}.{type(error).__qualname__} outside jax-amem's error family: "
        f"{error!r} for {inputs!r:.600}")


# ----------------------------------------------------------------------------- strategies

def _strategies():
    from hypothesis import strategies as st

    # Names that collide once joined with '/', empty names, dots, digits that read as indices.
    name = st.sampled_from(["w", "a", "b", "a/b", "", "0", "x.y", "é", "w "])
    key = st.one_of(name, st.integers(0, 2))
    dtype = st.sampled_from(["float32", "bfloat16", "float16", "int8", "int32"])
    shape = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
    return st, name, key, dtype, shape


def _array(spec):
    """A jax.Array of small integer values (exact in every dtype used) from (shape, dtype, seed)."""
    import jax.numpy as jnp

    shape, dtype, seed = spec
    values = (np.arange(int(np.prod(shape)), dtype=np.int64) + seed) % 7 - 3
    return jnp.asarray(values.reshape(shape)).astype(dtype)


def _tree_of(st, key, leaf, depth=2):
    """Dicts (keys mixed in type: 0 beside '0'), lists and tuples of `leaf`, nested."""
    return st.recursive(leaf, lambda inner: st.one_of(
        st.dictionaries(key, inner, max_size=3), st.lists(inner, max_size=3), st.tuples(inner)),
        max_leaves=5)


def _garbage(st):
    return st.sampled_from(["a string", 3, 2.5, None, b"bytes", np.zeros(2, np.float32), object()])


# ----------------------------------------------------------------------------- swap into torch tensors

@_generated
def generated_swap_into_torch():
    """Sources named by a tree (colliding, empty, mixed-type keys), destinations a dict of torch
    tensors with one thing wrong or none (a name missing or extra, shape, dtype, strides, a
    non-tensor, requires_grad), rules None or not rules. A success writes exactly the sources'
    values (cast to the destination's dtype); a refusal is a JaxAmemError with every
    destination's bytes as they were."""
    import jax_amem
    import torch
    from hypothesis import given

    from jax_amem.reshard import tree_names

    st, name, key, dtype, shape = _strategies()
    spec = st.tuples(shape, dtype, st.integers(0, 5))
    sources = st.dictionaries(key, st.one_of(spec, st.dictionaries(name, spec, max_size=2)), min_size=1, max_size=3)
    flaw = st.sampled_from([None, None, "missing", "extra", "shape", "dtype", "transposed", "not a tensor",
                            "requires_grad", "zero-size storage"])
    rules = st.one_of(st.none(), st.none(), st.lists(st.sampled_from(["w", 0, None]), max_size=2), st.just("w"))

    def build(tree):
        if isinstance(tree, dict):
            return {k: build(v) for k, v in tree.items()}
        return _array(tree)

    tally = _Tally('swap')

    @_settings(EXAMPLES["swap"])
    @given(sources, flaw, rules, st.sampled_from(["float32", "bfloat16", "int32"]))
    def check(spec_tree, flaw, rules, wrong_dtype):
        src = build(spec_tree)
        named, error = _outcome(lambda: tree_names(src))
        if error is not None:  # keys that do not sort, names that collide: the swap must refuse them too
            named = {}
        dst = {n: torch.zeros(tuple(a.shape), dtype=getattr(torch, str(a.dtype))) for n, a in named.items()}
        if flaw and dst:
            victim = sorted(dst)[0]
            t = dst[victim]
            if flaw == "missing":
                del dst[victim]
            elif flaw == "extra":
                dst[victim + "_extra"] = torch.zeros(2)
            elif flaw == "shape":
                dst[victim] = torch.zeros(t.numel() + 1)
            elif flaw == "dtype":
                dst[victim] = torch.zeros(t.shape, dtype=getattr(torch, wrong_dtype))
            elif flaw == "transposed" and t.ndim >= 2:
                dst[victim] = torch.zeros(tuple(reversed(t.shape)), dtype=t.dtype).transpose(0, -1)
            elif flaw == "not a tensor":
                dst[victim] = np.zeros(t.shape)
            elif flaw == "requires_grad" and t.is_floating_point():
                dst[victim] = t.requires_grad_(True)
            elif flaw == "zero-size storage":
                t.untyped_storage().resize_(0)
        before = {n: t.detach().clone() for n, t in dst.items()
                  if torch.is_tensor(t) and t.untyped_storage().nbytes() >= t.numel() * t.element_size()}
        inputs = (spec_tree, flaw, rules)
        _, error = _outcome(lambda: jax_amem.swap(src, dst, rules=rules) if rules is not None
                            else jax_amem.swap(src, dst))
        tally(error)
        if error is not None:
            _in_family(error, "swap", inputs)
            for n, old in before.items():
                assert torch.equal(dst[n].detach(), old), f"refused ({error}), yet {n!r} was written: {inputs!r}"
            return
        for n, array in named.items():
            got = dst[n].detach()
            want = np.asarray(array.astype("float32")).astype(np.float32)
            assert np.array_equal(got.float().numpy(), want), f"{n!r} holds other values after the swap: {inputs!r}"

    check()
    tally.check()
    return None


# ----------------------------------------------------------------------------- plan over layouts

class _Refused:
    """A generated Part / Rule / Piece its constructor refused (the error, judged by the check)."""

    def __init__(self, error):
        self.error = error

    def __repr__(self):
        return f"<refused: {self.error!r:.100}>"


def _made(cls):
    """`cls(*args)`, or the _Refused of its error (or of a part's, for a Rule of refused parts)."""
    def make(*args):
        for arg in args:
            inner = arg if isinstance(arg, tuple) else (arg,)
            refused = next((a for a in inner if isinstance(a, _Refused)), None)
            if refused is not None:
                return refused
        try:
            return cls(*args)
        except Exception as error:  # noqa: BLE001 - judged by the check
            return _Refused(error)
    return make


@_generated
def generated_plan():
    """Layouts from every public constructor with hostile arguments (negative, zero and huge
    extents, splits that do not divide, owners repeated, unknown dtypes), names that differ,
    rules that are not rules, and Rules, Parts and Pieces with hostile fields (indices out of
    range, permutations of the wrong rank, unknown casts, reshapes that do not fit, axis and
    groups of 0 or below). Construction refuses with LayoutError (a layout) or RuleError (a rule's
    field of the wrong kind); a plan that is made passes its own check and moves exactly the
    source's elements (the numpy executor)."""
    import jax_amem
    from hypothesis import given

    from jax_amem import reshard
    from jax_amem.reshard import Layout, Owner

    st, name, key, dtype, shape = _strategies()
    owner = st.tuples(st.integers(-1, 1), st.integers(-1, 3))
    extents = st.lists(st.integers(-1, 5), min_size=0, max_size=3).map(tuple)
    layout_dtype = st.one_of(dtype, st.sampled_from(["complex64", "not-a-dtype", None]))
    constructor = st.one_of(
        st.tuples(st.just("single"), extents, layout_dtype, owner),
        st.tuples(st.just("replicated"), extents, layout_dtype, st.lists(owner, min_size=0, max_size=3)),
        st.tuples(st.just("tensor_parallel"), extents, layout_dtype, st.integers(-1, 3), st.integers(-1, 4),
                  st.lists(owner, min_size=0, max_size=4)),
        st.tuples(st.just("from_boxes"), extents, layout_dtype,
                  st.dictionaries(owner, st.tuples(extents, extents), max_size=3)),
    )
    small = st.integers(-2, 4)
    axes = st.one_of(st.none(), st.lists(st.integers(-1, 3), max_size=3).map(tuple))
    part = st.builds(_made(reshard.Part), name, st.lists(small, max_size=2).map(tuple), axes,
                     st.sampled_from([None, None, "float32", "bfloat16", "int8", "not-a-dtype"]), axes)
    rule = st.builds(_made(reshard.Rule), name, st.lists(part, min_size=0, max_size=3).map(tuple), small, small)
    box = st.lists(small, max_size=2).map(tuple)
    piece = st.builds(_made(reshard.Piece), name, box, box, name, box, axes,
                      st.sampled_from([None, "float32", "not-a-dtype"]))
    rules = st.one_of(st.none(), st.none(), st.lists(st.sampled_from(["hello", 3, None]), max_size=2),
                      st.builds(lambda d, s: [reshard.Rule.copy(d, s)], name, name),
                      st.lists(st.one_of(rule, piece), min_size=1, max_size=3))

    def make(args):
        kind, *rest = args
        return getattr(Layout, kind)(*rest)

    tally = _Tally('plan')

    @_settings(EXAMPLES["plan"])
    @given(st.dictionaries(name, constructor, min_size=1, max_size=2), st.booleans(), rules)
    def check(specs, same, rules):
        layouts, errors = {}, []
        for n, args in specs.items():
            if os.environ.get("HOSTILE_TRACE"):
                print("layout", args, flush=True)
            layout, error = _outcome(lambda: make(args))
            if error is not None:
                _in_family(error, f"Layout.{args[0]}", args)
                errors.append(error)
            else:
                layouts[n] = layout
        if not layouts:
            return
        # Destinations: the same layouts (a plan must exist when rules are None), or each on owner (0, 0).
        dst = dict(layouts) if same else {n: _outcome(lambda: Layout.single(l.shape, l.dtype, Owner(0, 0)))[0]
                                          for n, l in layouts.items()}
        dst = {n: l for n, l in dst.items() if l is not None}
        inputs = (specs, same, rules)
        refused = [r for r in rules if isinstance(r, _Refused)] if isinstance(rules, list) else []
        for r in refused:   # a rule refused where it was made
            tally(r.error)
            _in_family(r.error, "Part / Rule / Piece", inputs)
        if refused:
            return
        if os.environ.get("HOSTILE_TRACE"):
            print("plan", inputs, flush=True)
        plan, error = _outcome(lambda: jax_amem.plan(layouts, dst, rules, check=True))
        tally(error)
        if error is not None:
            _in_family(error, "plan", inputs)
            return
        plan.check()
        if rules is None and all(l.nbytes < 1 << 16 for l in layouts.values()):
            from jax_amem.reshard.numpy_exec import execute

            full = {n: (np.arange(int(np.prod(l.shape))) % 100).astype(l.dtype).reshape(l.shape)
                    for n, l in layouts.items()}
            shards = {(n, o): full[n][l.shard_slices(o)] for n, l in layouts.items() for o in l.owners}
            written = execute(plan, shards)
            for (n, o), got in written.items():
                want = full[n][dst[n].shard_slices(o)]
                assert np.array_equal(got, want), f"{n!r} on {o}: the plan moved other elements: {inputs!r}"

    check()
    tally.check()
    return None


# ----------------------------------------------------------------------------- to_torch


class _Leaf:
    """A generated array leaf (a class of its own: a tuple would read as a pytree node)."""

    def __init__(self, deleted, shape, dtype, seed):
        self.deleted, self.shape, self.dtype, self.seed = deleted, shape, dtype, seed

    def __repr__(self):
        return f"{'deleted ' if self.deleted else ''}{self.dtype}{list(self.shape)}"

@_generated
def generated_to_torch():
    """Trees of jax.Arrays (colliding names, keys 0 and '0'), non-arrays and deleted arrays among
    them: views equal to the arrays, every write into them refused with the arrays unchanged; or
    a SwapError."""
    import jax_amem
    from hypothesis import given

    from jax_amem.swapping import SwapError

    st, name, key, dtype, shape = _strategies()
    leaf = st.one_of(st.builds(_Leaf, st.booleans(), shape, dtype, st.integers(0, 5)), _garbage(st))

    def build(tree):
        if isinstance(tree, dict):
            return {k: build(v) for k, v in tree.items()}
        if isinstance(tree, (list, tuple)):
            return type(tree)(build(v) for v in tree)
        if isinstance(tree, _Leaf):
            array = _array((tree.shape, tree.dtype, tree.seed)) + 0
            if tree.deleted:
                array.delete()
            return array
        return tree

    tally = _Tally('to_torch')

    @_settings(EXAMPLES["to_torch"])
    @given(_tree_of(st, key, leaf))
    def check(spec):
        params = build(spec)
        views, error = _outcome(lambda: jax_amem.to_torch(params))
        tally(error)
        if error is not None:
            _in_family(error, "to_torch", spec)
            assert isinstance(error, SwapError), f"to_torch raised {type(error).__name__}, not SwapError: {error}"
            return
        from jax_amem.reshard import tree_names

        for n, array in tree_names(params).items():
            want = np.asarray(array)
            for shard in views[n]:
                view = shard.tensor
                got = view.float().numpy() if str(view.dtype) == "torch.bfloat16" else view.numpy()
                assert np.array_equal(got, want[shard.index].astype(got.dtype)), f"view of {n!r} differs"
                if view.numel():
                    refused = _outcome(lambda: view.fill_(1))[1]
                    assert type(refused).__name__ == "ReadOnlyViewError", f"a write into {n!r}: {refused!r}"
            assert np.array_equal(np.asarray(array), want), f"{n!r} changed"

    check()
    tally.check()
    return None


# ----------------------------------------------------------------------------- pause / resume arguments

@_generated
def generated_pause_arguments():
    """keep= and drop= trees holding arrays, non-arrays, deleted arrays, one array in both or twice,
    keys 0 and '0'; nccl= of any type; reserve() first with the same trees. A refusal is a
    PauseError with nothing paused and no array deleted; a pause resumes with `keep` bit-identical
    and `drop` zeroed, in the same structure."""
    import jax
    import jax_amem
    from hypothesis import given

    st, name, key, dtype, shape = _strategies()
    slot = st.one_of(st.integers(0, 3), st.sampled_from(["deleted", "garbage"]))  # arrays by number: shared

    def build(tree, arrays):
        if isinstance(tree, dict):
            return {k: build(v, arrays) for k, v in tree.items()}
        if isinstance(tree, (list, tuple)):
            return type(tree)(build(v, arrays) for v in tree)
        if tree == "deleted":
            dead = _array(((2,), "float32", 0)) + 0
            dead.delete()
            return dead
        if tree == "garbage":
            return "not an array"
        return arrays[tree]

    tally = _Tally('pause')

    tree = st.one_of(_tree_of(st, key, slot), st.builds(lambda a, b: {0: a, "0": b}, slot, slot))

    @_settings(EXAMPLES["pause"])
    @given(tree, tree, st.sampled_from([True, False, "no", 0, 1, None]))
    def check(keep_spec, drop_spec, nccl):
        arrays = [_array(((i + 1, 2), "float32", i)) + 0 for i in range(4)]
        keep, drop = build(keep_spec, arrays), build(drop_spec, arrays)
        values = [np.asarray(a) for a in arrays]
        inputs = (keep_spec, drop_spec, nccl)
        # reserve() takes the same trees: it refuses what pause refuses (nccl= aside), and reads only.
        reservation, refused = _outcome(lambda: jax_amem.reserve(keep=keep, drop=drop, wait=True))
        if refused is not None:
            _in_family(refused, "reserve", inputs)
            assert isinstance(refused, jax_amem.PauseError), f"reserve raised {type(refused).__name__}: {refused}"
        assert not any(a.is_deleted() for a in arrays), f"reserve deleted an array: {inputs!r}"
        info, error = _outcome(lambda: jax_amem.pause(keep=keep, drop=drop, nccl=nccl))
        tally(error)
        if error is not None:
            _in_family(error, "pause", inputs)
            assert isinstance(error, jax_amem.PauseError), f"pause raised {type(error).__name__}: {error}"
            assert not jax_amem.is_paused(), f"refused, yet paused: {inputs!r}"
            assert not any(a.is_deleted() for a in arrays), f"refused, yet an array was deleted: {inputs!r}"
            return
        restored = jax_amem.resume()
        assert not jax_amem.is_paused()
        assert jax.tree_util.tree_structure(restored.keep) == jax.tree_util.tree_structure(keep)
        for old, new in zip(jax.tree_util.tree_leaves(keep), jax.tree_util.tree_leaves(restored.keep)):
            number = next(i for i, a in enumerate(arrays) if a is old)
            assert np.array_equal(np.asarray(new), values[number]), f"keep came back changed: {inputs!r}"
        for new in jax.tree_util.tree_leaves(restored.drop):
            assert not np.asarray(new).any(), f"drop came back non-zero: {inputs!r}"
        resumed_again = _outcome(jax_amem.resume)[1]
        assert isinstance(resumed_again, jax_amem.PauseError), resumed_again

    check()
    tally.check()
    return None


# ----------------------------------------------------------------------------- the fused scale

EXAMPLES.update({"scale_rule": 60, "scale_function": 60})


def _swap_into_torch(src: dict, rules):
    """{name: numpy float64 values} the swap wrote into fresh PyTorch tensors of the destination
    shapes and dtypes `rules` lower to, or the error it (or the planning) raised."""
    import jax_amem
    import torch

    destinations = _rule_destinations(rules, src)
    dst = {n: torch.full(tuple(l.shape), 7, dtype=getattr(torch, str(l.dtype))) for n, l in destinations.items()}
    jax_amem.swap(src, dst, rules=rules)
    return {n: t.double().numpy() for n, t in dst.items()}


def _rule_destinations(rules, src):
    """The destination layout of each one-part copy rule: the part's view of its source, cast."""
    import jax.numpy as jnp

    from jax_amem.reshard import Layout, Owner

    out = {}
    for rule in rules:
        part = rule.parts[0]
        view = jnp.zeros(src[part.src].shape, src[part.src].dtype)
        dtype = part.cast or view.dtype
        out[rule.dst] = Layout.single(view.shape, dtype, Owner(0, 0))
    return out


def _same(got, want) -> bool:
    return got.shape == want.shape and np.array_equal(got, want, equal_nan=True)


@_generated
def generated_scale_rule():
    """Rule.copy(scale=, offset=, along=) over float and integer sources: scalars and vectors
    (lengths that fit the axis or not, NaN and infinite values, strings), axes in range or out.
    Each swap writes exactly what JAX computes eagerly (`x * scale + offset` in the source's
    dtype, the vector along `along`, then the cast), or the rule is refused with a family error
    naming the tensor, with the destination untouched."""
    import jax.numpy as jnp
    from hypothesis import given
    from hypothesis import strategies as st

    from jax_amem.reshard import Rule

    number = st.one_of(st.sampled_from([0.5, -2.0, 3.0, 0.0, 1e-3, float("nan"), float("inf"), -float("inf")]),
                       st.floats(-8, 8, allow_nan=False, width=32))
    vector = st.lists(st.sampled_from([0.5, -1.0, 2.0, 0.25, float("nan")]), min_size=0, max_size=5)
    constant = st.one_of(st.none(), st.none(), number, vector, st.sampled_from(["two", [1.0, "x"]]))
    shape = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
    tally = _Tally("Rule.copy(scale=)")

    @_settings(EXAMPLES["scale_rule"])
    @given(shape, st.sampled_from(["float32", "bfloat16", "float16", "int32"]), constant, constant,
           st.integers(-4, 3), st.sampled_from([None, None, "float32", "bfloat16"]))
    def check(shape, dtype, scale, offset, along, cast):
        x = _array((shape, dtype, 1)) * (jnp.asarray(0.5, dtype) if dtype != "int32" else 1)
        src = {"w": x}
        inputs = (shape, dtype, scale, offset, along, cast)
        rule, error = _outcome(lambda: [Rule.copy("v", "w", scale=scale, offset=offset, along=along, cast=cast)])
        written = None
        if error is None:
            written, error = _outcome(lambda: _swap_into_torch(src, rule))
        tally(error)
        if error is not None:
            _in_family(error, "Rule.copy(scale=) and swap", inputs)
            assert "'w'" in str(error) or "'v'" in str(error), f"the refusal names no tensor: {error}"
            return
        want = x
        for constant, op in ((scale, jnp.multiply), (offset, jnp.add)):
            if constant is None:
                continue
            c = jnp.asarray(constant, x.dtype)
            if c.ndim:
                c = c.reshape((-1,) + (1,) * (x.ndim - 1 - along % x.ndim))
            want = op(want, c)
        want = np.asarray(want.astype(cast) if cast else want).astype(np.float64)
        assert _same(written["v"], want), f"the swap wrote other values than JAX computes: {inputs!r}"

    check()
    tally.check()
    return None


def _convert(op: str, constant):
    """A conversion function: one operation of `w` with `constant` (or with itself, or another
    source), as a user writes it in JAX."""
    import jax.numpy as jnp

    ops = {
        "mul": lambda w, c: w * c, "div": lambda w, c: w / c, "add": lambda w, c: w + c, "sub": lambda w, c: w - c,
        "rsub": lambda w, c: c - w, "mul_then_add": lambda w, c: w * c + 1.0,
        "rdiv": lambda w, c: c / w,                      # not affine in w
        "square": lambda w, c: w * w,                    # data-dependent
        "by_its_max": lambda w, c: w * jnp.max(w),       # a data-dependent constant
        "exp": lambda w, c: jnp.exp(w) * c,
        "by_another_source": lambda w, c: w * c,         # c is the source 'u' (below)
    }
    return ops[op]


@_generated
def generated_scale_function():
    """rules.from_function over conversions that multiply, divide, add or subtract a constant
    (scalars, one-axis vectors of fitting and unfitting lengths, NaN, inf), or do what the copy
    cannot (non-affine, data-dependent, a product of sources), on float and integer sources.
    Each ends in values equal to JAX's own `jit(convert)(params)` (for a division at most one
    unit in the last place from numpy's, as documented), in a family error, or, where JAX
    itself cannot evaluate the function, in the user's own error with a note."""
    import jax
    import jax.numpy as jnp
    from hypothesis import given
    from hypothesis import strategies as st

    import jax_amem

    ops = st.sampled_from(["mul", "div", "add", "sub", "rsub", "mul_then_add", "mul", "div",
                           "rdiv", "square", "by_its_max", "exp", "by_another_source"])
    scalar = st.one_of(st.sampled_from([2.0, 0.125, -3.0, 0.0, float("nan"), float("inf")]),
                       st.floats(-4, 4, allow_nan=False, width=32))
    # a vector along one axis: (n,) runs along the last axis, (n, 1) along the first
    vector = st.tuples(st.lists(st.sampled_from([2.0, -0.5, 4.0, float("nan")]), min_size=1, max_size=4),
                       st.booleans())
    constant = st.one_of(scalar, scalar, vector)
    tally = _Tally("from_function(scale)")

    @_settings(EXAMPLES["scale_function"])
    @given(ops, constant, st.sampled_from(["float32", "bfloat16", "int32"]), st.integers(1, 4), st.integers(1, 4))
    def check(op, constant, dtype, m, n):
        w = _array(((m, n), dtype, 2))
        params = {"w": w, "u": _array(((m, n), dtype, 3))}
        if isinstance(constant, tuple):
            values, first_axis = constant
            c = np.asarray(values, np.float32).reshape((-1, 1) if first_axis else (-1,))
        else:
            c = constant
        function = _convert(op, c)

        def convert(p):
            other = p["u"] if op == "by_another_source" else c
            return {"v": function(p["w"], other)}

        inputs = (op, constant, dtype, m, n)
        oracle, jax_failed = _outcome(lambda: jax.jit(convert)(params))
        rules, error = _outcome(lambda: jax_amem.rules.from_function(convert, params))
        written = None
        if error is None:
            import torch

            v = oracle["v"]
            dst = {"v": torch.full(v.shape, 7, dtype=getattr(torch, str(v.dtype)))}
            written, error = _outcome(lambda: jax_amem.swap(params, dst, rules=rules) and dst)
        tally(error)
        if error is not None:
            theirs = any("from_function traced it" in note for note in getattr(error, "__notes__", ()))
            if jax_failed is not None and theirs:
                return  # the function fails in JAX too: the user's own error, passed on with a note
            _in_family(error, "from_function and swap", inputs)
            assert "'w'" in str(error) or "'v'" in str(error), f"the refusal names no tensor: {error}"
            if os.environ.get("HOSTILE_TRACE"):
                print("inputs", inputs, flush=True)
            return
        assert jax_failed is None, f"from_function and the swap accepted what JAX refuses ({jax_failed}): {inputs!r}"
        got = written["v"].double().numpy()
        want = np.asarray(oracle["v"]).astype(np.float64)
        assert _same(got, want), f"the swap wrote other values than jit(convert) computes: {inputs!r}"
        if op != "div" and dtype == "float32":  # numpy agrees exactly but for XLA's reciprocal
            with np.errstate(all="ignore"):
                numpy_value = np.asarray(convert({k: np.asarray(a) for k, a in params.items()})["v"], np.float32)
            assert _same(got, numpy_value.astype(np.float64)), f"differs from numpy: {inputs!r}"

    check()
    tally.check()
    return None


# ----------------------------------------------------------------------------- the vLLM backend's trainer half

EXAMPLES["vllm_layout"] = 6


class _EngineWorker:
    """What the trainer's half reads of a vLLM worker (jax_amem_vllm.engine.WorkerEngine): its
    description, the worker package's own wire form (jax_amem_vllm.layout), and each group's
    tensors as views of one staging buffer. No engine runs: the checks under test are the
    trainer's own."""

    def __init__(self, groups, tp):
        import torch
        from jax_amem_vllm.layout import Describe, Tensor, staged_bytes

        offset, described = 0, []
        for group in groups:
            described.append([])
            for name, shape, dtype in group:
                described[-1].append(Tensor(name, tuple(shape), dtype, offset, processed=False))
                offset += staged_bytes(shape, dtype)
        self.layout, self.tp, self.committed = Describe(described, offset), tp, None
        self.staging = torch.zeros(offset, dtype=torch.uint8)
        self.views_made = 0

    def write_in_place(self):
        """A CPU worker stages every parameter (jax_amem_vllm/in_place.py writes a GPU's in place)."""
        return False

    def description(self):
        return {"tp_size": self.tp, "tp_rank": 0, "device": "cpu", "groups": self.layout.wire(),
                "staging_bytes": self.layout.staging_bytes}

    def staged(self, group):
        import torch

        out = {}
        for t in self.layout.groups[group]:
            dtype = getattr(torch, t.dtype)
            nbytes = torch.Size(t.shape).numel() * torch.empty((), dtype=dtype).element_size()
            out[t.name] = self.staging[t.offset:t.offset + nbytes].view(dtype).view(t.shape)
        return out


def _planned_engine(worker, params, rules=None):
    """What connect builds once it has reached the worker: the engine handle that plans `params`
    into the worker's layout (`rules`, or the preset 'llama' from the 'flax' naming), with its checks."""
    from jax_amem.vllm.trainer import VllmEngine

    from jax_amem.vllm.transports import InProcess

    options = dict(family="llama" if rules is None else None, source="flax", rules=rules, cast=None)
    return VllmEngine(None, [InProcess(worker, worker.description())], params, timeout=60.0, **options)


@_generated
def generated_vllm_layout():
    """The trainer's half of the vLLM backend (jax_amem.vllm.trainer) against generated engine
    layouts: a Llama in vLLM's names (one in-process worker, tp 1), its tensors in generated layer
    groups, then one thing wrong or none: a tensor missing (lm_head.weight missing: a tied model,
    planned so) or extra, one held a module deeper (vLLM's MoE naming: matched), a shape or a
    dtype changed, a trainer leaf missing or reshaped, rules fused for tp 2; then update()'s
    check of a changed tree. A good pair plans every group; a bad one raises VllmPlanError
    naming the tensor (or the tp) at connect, never anything else."""
    import jax.numpy as jnp
    from hypothesis import given
    from hypothesis import strategies as st

    sys_path_tests()
    import preset_models

    from jax_amem.reshard import names_tree, tree_names
    from jax_amem.reshard.rules import preset
    from jax_amem.vllm import VllmPlanError

    weights = preset_models.logical("llama", np.random.default_rng(0))
    flaws = [None, "engine_missing", "engine_extra", "engine_deeper", "engine_shape", "engine_dtype",
             "tree_missing", "tree_shape", "rules_tp"]  # each example tries every one
    tally = _Tally("vllm connect")

    @_settings(EXAMPLES["vllm_layout"])
    @given(st.just(1), st.integers(0, 10**6), st.integers(1, 3),
           st.sampled_from(["float32", "bfloat16"]), st.sampled_from([None, "leaf_shape", "leaf_dtype"]))
    def check(tp, victim, group_count, dtype, changed):
        for flaw in flaws:
            one(tp, flaw, victim, group_count, dtype, changed)

    def one(tp, flaw, victim, group_count, dtype, changed):
        tree = preset_models.source_tree("llama", "flax", weights)
        params = names_tree({n: jnp.asarray(a, dtype) for n, a in tree_names(tree).items()})
        state = preset_models.oracle("llama", "vllm", weights, np, tp=tp)
        reads = preset("llama", params, layout="vllm", tp=tp)
        tensors = sorted((n, tuple(a.shape), dtype) for n, a in state.items())
        named = None  # what a refusal must name; None: connect must accept
        rules = None
        if flaw == "rules_tp":  # fused qkv / gate_up cut for 2 ranks, into an engine of 1
            rules = preset("llama", params, layout="vllm", tp=2, head_dim=preset_models.HD)
            named = "tensor_parallel_size=1"
        index = victim % len(tensors)
        name, shape, kind = tensors[index]
        if flaw == "engine_missing":
            del tensors[index]
            # an engine without lm_head.weight is a tied model: the tree's own lm_head/kernel would go
            # unserved, and connect refuses naming it
            named = "lm_head/kernel" if name == "lm_head.weight" else name
        elif flaw == "engine_extra":
            named = "model.layers.0.mlp.extra_proj.weight"
            tensors.append((named, (2, 2), dtype))
        elif flaw == "engine_deeper":
            head, _, last = name.rpartition(".")
            tensors[index] = (f"{head}.inner.{last}", shape, kind)
            # without lm_head.weight the engine reads as tied, and its deeper head is one no rule writes
            named = f"{head}.inner.{last}" if name == "lm_head.weight" else None
        elif flaw == "engine_shape":
            tensors[index] = (name, (shape[0] + 1,) + shape[1:], kind)
            named = name
        elif flaw == "engine_dtype":
            tensors[index] = (name, shape, "float16")
        flat = dict(tree_names(params))
        leaf = sorted(flat)[victim % len(flat)]
        if flaw == "tree_missing":
            del flat[leaf]
            named = leaf
        elif flaw == "tree_shape":
            flat[leaf] = jnp.zeros(flat[leaf].shape[:-1] + (flat[leaf].shape[-1] + 1,), flat[leaf].dtype)
            # refused naming the leaf or an engine tensor made from it (the plan of a fused tensor
            # names the destination); the embedding sets the model's width: the preset names the
            # tensors that disagree with it
            made = {r.dst for r in reads if any(p.src == leaf for p in r.parts)}
            named = (leaf, *made) if leaf != "embed/embedding" else ("preset 'llama'",)
        groups = [[t for i, t in enumerate(tensors) if (i * 7 + victim) % group_count == g] for g in range(group_count)]
        groups = [g for g in groups if g]
        inputs = (tp, flaw, victim, group_count, dtype)
        engine, error = _outcome(lambda: _planned_engine(_EngineWorker(groups, tp), names_tree(flat), rules))
        tally(error)
        if error is not None:
            assert isinstance(error, VllmPlanError), f"connect raised {type(error).__name__}: {error} for {inputs}"
            if named is not None:
                names = named if isinstance(named, tuple) else (named,)
                assert any(n in str(error) for n in names), f"the refusal names none of {names}: {error}"
            assert named is not None or flaw == "engine_dtype", f"a good engine layout was refused: {error} for {inputs}"
            return
        assert named is None, f"connect accepted a {flaw} ({named!r}) for {inputs}"
        assert engine.bytes == sum(int(np.prod(s)) * np.dtype(d if d != "bfloat16" else "float16").itemsize
                                   for group in groups for _, s, d in group), "the plans do not write every byte"
        if changed:  # update() checks the tree against the one planned, before anything is written
            leaf = sorted(flat)[victim % len(flat)]
            wrong = dict(flat)
            wrong[leaf] = (jnp.zeros(flat[leaf].shape + (1,), flat[leaf].dtype) if changed == "leaf_shape"
                           else flat[leaf].astype("float16"))
            refused = _outcome(lambda: engine._check_source(names_tree(wrong)))[1]
            assert isinstance(refused, VllmPlanError) and leaf in str(refused), f"update's check: {refused!r}"

    check()
    tally.check()
    return None


def sys_path_tests():
    """tests/ on the path (preset_models: tiny models built independently of the presets)."""
    import sys

    folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if folder not in sys.path:
        sys.path.insert(0, folder)
