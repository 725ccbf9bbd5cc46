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

    def check(self) -> None:
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

@_generated
def generated_plan():
    """Layouts from every public constructor with hostile arguments (negative, zero and huge
    extents, splits that do not divide, owners repeated, unknown dtypes), names that differ,
    rules that are not rules, and Rules, Parts and Pieces with hostile fields (indices out of
    range, permutations of the wrong rank, unknown casts, reshapes that do not fit, axis and
    groups of 0 or below). Construction refuses with LayoutError; a plan that is made
    passes its own check and moves exactly the source's elements (the numpy executor)."""
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
    part = st.builds(reshard.Part, name, st.lists(small, max_size=2).map(tuple), axes,
                     st.sampled_from([None, None, "float32", "bfloat16", "int8", "not-a-dtype"]), axes)
    rule = st.builds(reshard.Rule, name, st.lists(part, min_size=0, max_size=3).map(tuple), small, small)
    box = st.lists(small, max_size=2).map(tuple)
    piece = st.builds(reshard.Piece, name, box, box, name, box, axes,
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
