"""The tracer's moves beyond boxes: strided and reversed slices, flip, constant-index gathers,
broadcast_to / repeat, tile, unstack, and the identity markers (stop_gradient,
optimization_barrier). Each is checked two ways: the plan's bytes equal running the function
with JAX (sharded sources, 8 CPU devices, numpy executor), and the pieces are the fewest
boxes the move allows (a run of consecutive rows stays one piece). Refusals name the
primitive, the user's line and what to write instead."""

import inspect

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jax_amem.reshard import fragments as F
from jax_amem.reshard import rules, trace

from reshard_oracle import plan_and_run, shard_tree

RNG = np.random.default_rng(11)
TREE = {"x": RNG.standard_normal((8, 6)).astype(np.float32),         # a kernel
        "s": RNG.standard_normal((4, 8, 6)).astype(np.float32),      # a stack of layers
        "v": RNG.standard_normal((8,)).astype(np.float32)}           # a bias

# name -> (the user's move, the fewest pieces it can be)
MOVES = {
    "every_other_row": (lambda p: p["x"][::2], 4),
    "odd_columns": (lambda p: p["x"][:, 1::2], 3),
    "strided_window": (lambda p: p["x"][1:7:3, 4:0:-2], 2 * 2),
    "reversed_rows": (lambda p: p["x"][::-1], 8),
    "negative_stride_both_axes": (lambda p: p["x"][::-3, ::-2], 3 * 3),
    "flip_columns": (lambda p: jnp.flip(p["x"], 1), 6),
    "flip_all": (lambda p: jnp.flip(p["s"]), 4 * 8 * 6),
    "take_rows": (lambda p: p["x"][jnp.array([0, 1, 2, 5, 6])], 2),
    "take_negative": (lambda p: p["x"][np.array([-1, 0])], 2),
    "take_columns": (lambda p: jnp.take(p["x"], np.array([4, 5, 0]), axis=1), 2),
    "take_2d_index": (lambda p: p["s"][np.array([[3, 1], [0, 2]])], 4),
    "take_mid_axis_with_slice": (lambda p: p["s"][:, np.array([7, 2]), 1:4], 2),
    "take_repeated": (lambda p: p["v"][np.array([3, 3, 3])], 3),
    "take_clipped": (lambda p: jnp.take(p["v"], np.array([9, 0]), mode="clip"), 2),
    "take_along_axis": (lambda p: jnp.take_along_axis(p["x"], np.array([[1], [0]] * 4), axis=1), 8),
    "two_index_arrays": (lambda p: p["s"][np.array([0, 3]), :, np.array([5, 1])], 2 * 8),
    "broadcast_row": (lambda p: jnp.broadcast_to(p["x"][:1], (5, 6)), 5),
    "broadcast_new_axis": (lambda p: jnp.broadcast_to(p["v"][:, None], (8, 3)), 8 * 3),
    "repeat_rows": (lambda p: jnp.repeat(p["x"], 2, axis=0), 16),
    "repeat_uneven": (lambda p: jnp.repeat(p["v"], np.array([1, 2, 0, 1, 1, 1, 0, 2]), total_repeat_length=8), 5),
    "tile": (lambda p: jnp.tile(p["x"], (2, 3)), 6),
    "unstack": (lambda p: jnp.unstack(p["s"], axis=1)[5], 1),
    "unstack_layers": (lambda p: jnp.concatenate([w.T for w in jnp.unstack(p["s"])]), 4),
    "python_loop_over_layers": (lambda p: jnp.stack([p["s"][i] for i in range(3, -1, -1)]), 4),
    "stop_gradient": (lambda p: jax.lax.stop_gradient(p["x"]).T, 1),
    "optimization_barrier": (lambda p: jax.lax.optimization_barrier((p["x"], p["v"]))[1], 1),
    "rotary_interleaved_to_halves": (lambda p: jnp.concatenate([p["x"][:, ::2], p["x"][:, 1::2]], 1), 6),
}


@pytest.mark.parametrize("name", sorted(MOVES))
def test_a_move_equals_running_it_with_the_fewest_pieces(name):
    move, pieces_wanted = MOVES[name]
    convert = lambda p: {"y": move(p)}
    want = {"y": np.asarray(convert(jax.tree.map(jnp.asarray, TREE))["y"])}
    pieces = rules.from_function(convert, TREE)
    assert len(pieces) == pieces_wanted, [(p.dst_start, p.size, p.src_start) for p in pieces]
    plan_and_run(shard_tree(TREE), want, pieces)


def test_numpy_gives_the_same_values_as_the_plan():
    """The oracle is not JAX's own gather: numpy's indexing gives the same arrays."""
    x, s = TREE["x"], TREE["s"]
    numpy_moves = {"a": x[1:7:3, 4:0:-2], "b": x[::-3, ::-2], "c": s[:, np.array([7, 2]), 1:4],
                   "d": np.repeat(x, 2, axis=0), "e": np.tile(x, (2, 3)), "f": s[np.array([0, 3]), :, np.array([5, 1])]}
    jax_moves = lambda p: {"a": p["x"][1:7:3, 4:0:-2], "b": p["x"][::-3, ::-2], "c": p["s"][:, np.array([7, 2]), 1:4],
                           "d": jnp.repeat(p["x"], 2, axis=0), "e": jnp.tile(p["x"], (2, 3)),
                           "f": p["s"][np.array([0, 3]), :, np.array([5, 1])]}
    plan_and_run(shard_tree(TREE), numpy_moves, rules.from_function(jax_moves, TREE))


# -- fragments.pick on its own: runs, repeats, fragments cut across, nothing picked

def _materialise(frags, shape, source):
    """The value the fragments describe, read from `source` by hand."""
    out = np.full(shape, np.nan)
    for f in frags:
        index = [slice(s, s + 1) for s in f.sstart]
        for j, a in enumerate(f.axis_of):
            if a >= 0:
                index[a] = slice(f.sstart[a], f.sstart[a] + f.vsize[j])
        box = source[tuple(index)]
        running = [a for a in f.axis_of if a >= 0]
        box = box.transpose(running + [a for a in range(source.ndim) if a not in running]).reshape(f.vsize)
        out[tuple(slice(s, s + n) for s, n in zip(f.vstart, f.vsize))] = box
    return out


@pytest.mark.parametrize("rows", [[0, 1, 2], [2, 1, 0], [5, 5, 5, 0], [], [1, 2, 3, 0, 1, 4, 5], list(range(6))[::-2]])
def test_pick_places_each_row_and_merges_runs(rows):
    source = np.arange(36.0).reshape(6, 6)
    # two fragments, split at column 3: each run is cut in two
    whole = [F.whole("w", (6, 6))]
    frags = F.slice_box(whole, (0, 0), (6, 3)) + F.shift(F.slice_box(whole, (0, 3), (6, 6)), 1, 3)
    picked = F.pick(frags, 0, rows)
    got = _materialise(picked, (len(rows), 6), source)
    np.testing.assert_array_equal(got, source[rows] if rows else np.zeros((0, 6)))
    runs = len(F.runs(rows))
    assert len(picked) == 2 * runs  # one piece per run per input fragment it crosses


# -- refusals: the primitive, the user's line, what to write instead; the swap plans nothing

def _line_of(text):
    return next(i for i, line in enumerate(inspect.getsourcelines(_refused_converters)[0],
                                           inspect.getsourcelines(_refused_converters)[1]) if text in line)


def _refused_converters():
    return {
        "pad": lambda p: {"y": jnp.pad(p["x"], ((0, 1), (0, 0)))},
        "add": lambda p: {"y": p["v"] + p["v"][::-1]},
        "where": lambda p: {"y": jnp.where(p["v"] > 0, p["v"], p["v"][::-1])},
        "scatter": lambda p: {"y": p["x"].at[0].set(p["x"][1])},
        "fill": lambda p: {"y": jnp.take(p["x"], np.array([0, 9]), axis=0)},
        "concat_zeros": lambda p: {"y": jnp.concatenate([p["v"], jnp.zeros(2)])},
    }


@pytest.mark.parametrize("name, message", [
    ("pad", r"primitive 'pad'.*at .*test_reshard_trace_moves.py:{line} .*feeds output 'y'.*Instead: padding writes"),
    ("add", r"primitive 'add'.*source 'v'.*:{line} .*Instead: arithmetic makes new values"),
    ("where", r"primitive 'gt'.*:{line} .*Instead: a comparison reads the weights' values"),
    ("scatter", r"primitive 'scatter'.*:{line} .*Instead: x.at\[...\].set\(...\) writes into an array"),
    ("fill", r"'gather'.*index 9 outside axis 0 of size 8.*fill value.*:{line} .*Instead: index one axis"),
    ("concat_zeros", r"'concatenate' joins a constant.*:{line} .*Instead: a constant \(zeros, padding\)"),
])
def test_a_refusal_names_the_primitive_the_line_and_the_advice(name, message):
    convert = _refused_converters()[name]
    line = _line_of(f'"{name}": lambda')
    with pytest.raises(rules.TraceError, match=message.format(line=line)):
        rules.from_function(convert, TREE)


def test_every_advised_primitive_is_not_also_a_layout_move():
    """ADVICE is for refused primitives: none of them has a layout handler (a stale entry
    would advise against an operation the tracer accepts)."""
    handled = {name[1:] for name in dir(trace._Interpreter) if name.startswith("_") and not name.startswith("__")}
    refusable_handlers = {"concatenate", "gather", "dynamic_slice",  # refused only for some inputs
                          "mul", "div", "add", "sub", "neg"}        # accepted with a constant only
    assert not (set(trace.ADVICE) & handled) - refusable_handlers


def test_a_gather_too_large_to_trace_by_element_is_refused_by_size(monkeypatch):
    monkeypatch.setattr(trace, "GATHER_ELEMENTS", 100)
    with pytest.raises(rules.TraceError, match=r"'gather' \(indices that vary along 2 axes.*192 elements, more than "
                                               r"the 100.*Instead: index one axis at a time"):
        rules.from_function(lambda p: {"y": p["s"][np.array([0, 3]), :, np.array([5, 1])]}, TREE)
    rules.from_function(lambda p: {"y": p["s"][:, np.array([7, 2])]}, TREE)  # one axis: no element table needed
