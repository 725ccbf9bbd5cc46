"""Views with constant steps through the direct launch (swapping/in_process/direct_affine.py):
the affine kernel's rows launched beside the byte rows, outside XLA. On the CPU the same rows run
in the affine CPU loop, so here: every dtype pair, operation and kind of constant (Python and
NumPy scalars, vectors along an axis, chains, `Part`/`Rule` scale and offset) written in place,
bit-identical to the XLA route (the custom call `affine_copy_to_addresses`) and to the exporter
as JAX evaluates it eagerly (subnormals and infinities included); that such programs run no
XLA call, on the first swap and on repeats with new sources; which views stay with XLA; every
refusal of an affine row or table before any byte moves. GPU (`gpu`): the same on CUDA."""

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem import reshard
from jax_amem._native import core
from jax_amem.affine_copy import Program, encode
from jax_amem.reshard import rules
from jax_amem.reshard.affine import Affine, Step
from jax_amem.swapping import forget
from jax_amem.swapping.in_process import direct, direct_affine, fused_views, repeat, routes

torch = pytest.importorskip("torch")
from swap_probes import clean, python_work, raw, the_program  # noqa: F401 - clean: an autouse fixture

BF16 = ml_dtypes.bfloat16
NARROW = [np.float32, BF16, np.float16]
PAIRS = [(s, d) for s in NARROW + [np.float64] for d in NARROW + [np.float64]]  # every pair the kernel has
HEADS = np.linspace(0.5, 3.0, 6, dtype=np.float32)      # a vector along axis 1 of w
COLUMNS = np.arange(1, 9, dtype=np.float32) / 7         # a vector along axis 2 of w


def values(shape, dtype, seed, subnormals=True):
    """Normal values over many binades, with float32 subnormals (unless told not to), signed
    zeros and infinities among them (no NaN: its payload is the platform's), in `dtype`."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-40, 40, shape))).astype(np.float32).reshape(-1)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 6e-5, 65504.0, 3e38] + ([1e-39, -3e-40, 1e-45, 2e-38] if subnormals
                                                                          else []), np.float32)
    x[:len(special)] = special[:x.size]
    with np.errstate(over="ignore"):
        return x.astype(dtype).reshape(shape)


def tree_of(src, subnormals=True):
    return {"w": values((16, 6, 8), src, 1, subnormals), "n": values((48,), src, 2, subnormals),
            "v": values((1, 24, 1), src, 3, subnormals)}


def exporter(dst, src=None):
    """Every operation, every kind of constant, parts of sources, chains and, where the fused
    copy has the cast from `src` (the direct launch reads no other view), a destination made of
    a scaled and a plain part and a plain one: written the way a framework's exporter is."""
    plain = src is None or fused_views.kind(src, dst) is not None

    def convert(p):
        w, n, v = p["w"], p["n"], p["v"]
        return {"mul": (w[1] * 0.3).astype(dst),                             # a Python scalar, part of a view
                "div": (w / np.float32(1.7)).astype(dst),                    # a NumPy scalar, a division
                "add": (1 + n).astype(dst),                                  # a norm offset
                "sub": (w[3] - 0.25).astype(dst),
                "rsub": (0.5 - n).astype(dst),
                "heads": (w * HEADS[None, :, None]).astype(dst),             # a vector along axis 1
                "columns": (w[2:6] + COLUMNS).astype(dst),                   # a vector along the last axis
                "chain": ((w[4] * 0.7 + 1.25) / 3.0 - 0.5).reshape(48).astype(dst),
                "cast_first": w[5].astype(dst) * 2,                          # rounded to dst, then the step
                "squeezed": (v.transpose(2, 1, 0) * 4.0).reshape(24).astype(dst),  # moves axes of size 1 only
                **({"mixed": jnp.concatenate([w[0] * 2.0, w[1]], axis=0).astype(dst),
                    "plain": w[7].astype(dst)} if plain else {})}
    return convert


def eager(convert, tree):
    return {k: np.asarray(v) for k, v in convert({k: jnp.asarray(v) for k, v in tree.items()}).items()}


def on_one_device(tree):
    device = jax.devices()[0]
    return {k: jax.device_put(v, device) for k, v in tree.items()}


def tensors_for(want, fill=float("nan"), device="cpu"):
    return {k: torch.full(v.shape, fill, dtype=getattr(torch, np.dtype(v.dtype).name), device=device)
            for k, v in want.items()}


def as_bytes(value) -> np.ndarray:
    return np.ascontiguousarray(value).reshape(-1).view(np.uint8)


def _refuse(*args, **kwargs):
    raise AssertionError("an XLA custom call was traced or an XLA program ran")


def _no_xla(monkeypatch):
    """Any affine or byte custom call traced for the address route fails the test."""
    monkeypatch.setattr(routes, "affine_copy_to_addresses", _refuse)
    monkeypatch.setattr(routes, "segment_copy_to_addresses", _refuse)


def direct_then_xla(monkeypatch, arrays, pieces, want, device="cpu"):
    """The swap launched directly (no custom call traced) into fresh tensors, in place, then
    through the XLA route (the direct launch of constant steps off) into others:
    (the direct launch's tensors, its program, the XLA route's tensors)."""
    launched = tensors_for(want, device=device)
    pointers = {k: t.data_ptr() for k, t in launched.items()}
    with monkeypatch.context() as patch:
        _no_xla(patch)
        jax_amem.swap(arrays, launched, rules=pieces, progress=False)
    program = the_program()
    assert isinstance(program.direct, direct.DirectProgram)
    assert {k: t.data_ptr() for k, t in launched.items()} == pointers       # in place
    monkeypatch.setattr(direct_affine, "ENABLED", False)
    forget()
    by_xla = tensors_for(want, device=device)
    jax_amem.swap(arrays, by_xla, rules=pieces, progress=False)
    assert the_program().direct is False
    return launched, program, by_xla


@pytest.mark.parametrize("src, dst", PAIRS, ids=lambda d: np.dtype(d).name)
def test_every_pair_bit_identical_to_the_xla_route_and_to_jax(monkeypatch, src, dst):
    with jax.enable_x64(np.float64 in (src, dst)):
        tree = tree_of(src)
        convert = exporter(dst, src)
        want = eager(convert, tree)
        launched, program, by_xla = direct_then_xla(monkeypatch, on_one_device(tree),
                                                    rules.from_function(convert, tree), want)
        assert sum(c.affine_rows for c in program.direct.copies) > 0
    for name, value in want.items():
        assert np.array_equal(raw(launched[name]), as_bytes(value)), name
        assert np.array_equal(raw(launched[name]), raw(by_xla[name])), name


def test_parts_and_rules_with_scale_offset_and_along(monkeypatch):
    """Hand-written steps (`Part`/`Rule` scale, offset, along) into one chunk with a fused
    transposed cast and plain copies: direct, and the XLA route's bytes."""
    tree = {"w": values((6, 8), np.float32, 4), "b": values((8,), BF16, 5), "k": values((4, 6), np.float32, 6)}
    arrays = on_one_device(tree)
    Rule, Part = reshard.Rule, reshard.Part
    pieces = [Rule.copy("w_scaled", "w", scale=0.125, offset=1.0, cast="bfloat16"),
              Rule.copy("w_rows", "w", scale=tuple(float(x) for x in HEADS), along=0),
              Rule.copy("b", scale=2.0, cast="float32"),
              Rule.concat("cat", [Part("w", index=(0,), offset=tuple(float(x) for x in COLUMNS)), Part("b", cast="float32")]),
              Rule.copy("k_t", "k", transpose=(1, 0), cast="bfloat16"),
              Rule.copy("k")]
    shapes = {"w_scaled": ((6, 8), torch.bfloat16), "w_rows": ((6, 8), torch.float32), "b": ((8,), torch.float32),
              "cat": ((16,), torch.float32), "k_t": ((6, 4), torch.bfloat16), "k": ((4, 6), torch.float32)}

    def make():
        return {k: torch.full(s, 3.0, dtype=d) for k, (s, d) in shapes.items()}

    launched = make()
    with monkeypatch.context() as patch:
        _no_xla(patch)
        jax_amem.swap(arrays, launched, rules=pieces, progress=False)
    copies = the_program().direct.copies
    assert sum(c.affine_rows for c in copies) > 0 and sum(c.transpose_rows for c in copies) > 0
    monkeypatch.setattr(direct_affine, "ENABLED", False)
    forget()
    by_xla = make()
    jax_amem.swap(arrays, by_xla, rules=pieces, progress=False)
    assert the_program().direct is False
    for name in shapes:
        assert np.array_equal(raw(launched[name]), raw(by_xla[name])), name
    w = jnp.asarray(tree["w"])  # JAX's eager arithmetic (XLA:CPU flushes the subnormals among them)
    assert np.array_equal(raw(launched["w_rows"]), as_bytes(w * jnp.asarray(HEADS)[:, None]))
    assert np.array_equal(raw(launched["w_scaled"]), as_bytes((w * 0.125 + 1.0).astype(jnp.bfloat16)))


@pytest.mark.parametrize("transposed", [False, True])
def test_a_training_loop_repeats_with_new_sources_and_no_xla(monkeypatch, transposed):
    """Every swap of a scaled program is one direct launch: the first and the repeats with new
    buffers (the repeat's native check reads their addresses); no XLA call is traced or run.
    Transposed: the scaled views are the fused transpose copy's rows, each running the scale."""
    tree = {f"q{i}": values((8, 16), np.float32, 10 + i) for i in range(5)}
    scale = 8 ** -0.5
    convert = lambda p: {k: (v * scale).astype(jnp.bfloat16).T if transposed else (v * scale).astype(jnp.bfloat16)
                         for k, v in p.items()}
    pieces = rules.from_function(convert, tree)
    src = on_one_device(tree)
    dst = tensors_for(eager(convert, tree))
    launches = []
    real_launch = direct.DirectProgram.launch
    monkeypatch.setattr(direct.DirectProgram, "launch",
                        lambda self, *a, **k: launches.append(1) or real_launch(self, *a, **k))
    _no_xla(monkeypatch)
    step = jax.jit(lambda t: jax.tree_util.tree_map(lambda x: x * 1.5 + 1.0, t))
    jax_amem.swap(src, dst, rules=pieces, progress=False)
    program = the_program()
    monkeypatch.setattr(program, "fns", [_refuse] * len(program.fns))
    for _ in range(3):
        src = step(src)
        jax_amem.swap(src, dst, rules=pieces, progress=False)
        want = eager(convert, {k: np.asarray(v) for k, v in src.items()})
        for name, value in want.items():
            assert np.array_equal(raw(dst[name]), as_bytes(value)), name
    assert len(launches) == 4
    copies = program.direct.copies
    assert [sum(c.stepped_transpose_rows for c in copies), sum(c.affine_rows for c in copies)] == \
        ([5, 0] if transposed else [0, 5])
    entry = next(iter(repeat._entries.values()))
    assert entry.program is program and entry.calls is None  # the repeats never made an XLA call


def _python_work_of_a_scaled_repeat(count: int) -> dict:
    """Python calls and C calls from Python (swap_probes.python_work) of one repeated swap of
    `count` scaled tensors, after the repeat that makes what later ones reuse."""
    forget()
    src = on_one_device({f"t{i:04d}": values((4,), np.float32, i) for i in range(count)})
    pieces = [reshard.Rule.copy(name, scale=0.5, cast="bfloat16") for name in src]
    dst = {name: torch.zeros(4, dtype=torch.bfloat16) for name in src}
    step = jax.jit(lambda t: jax.tree_util.tree_map(lambda x: x + 1.0, t))
    for _ in range(2):
        jax_amem.swap(src, dst, rules=pieces, progress=False)
        src = step(src)
    seen = python_work(lambda: jax_amem.swap(src, dst, rules=pieces, progress=False))
    assert sum(c.affine_rows for c in the_program().direct.copies) == count
    for name, array in src.items():
        assert np.array_equal(raw(dst[name]), as_bytes((array * 0.5).astype(jnp.bfloat16))), name
    return seen


def test_a_scaled_repeat_does_no_python_work_per_tensor():
    few, many = _python_work_of_a_scaled_repeat(8), _python_work_of_a_scaled_repeat(300)
    assert few == many, (few, many)


def test_views_xla_must_make_keep_the_custom_calls():
    """A view with steps that neither the affine kernel nor the fused transpose copy reads (a
    transpose of rows of 8, not a 2-D one; a transposed bfloat16 -> float16 view, a conversion
    the transpose copy has not) is one XLA makes first: the program keeps the XLA route (its
    affine rows in the custom call), with the same values. (A transposed view the fused copy
    has: tests/test_swap_transpose_steps.py.)"""
    for src, convert in ((np.float32, lambda p: {"t": (p["w"] * 0.5).transpose(1, 0, 2), "plain": p["w"] * 2.0}),
                         (BF16, lambda p: {"t": (p["w"] * 0.5).transpose(0, 2, 1).astype(jnp.float16)})):
        forget()
        tree = {"w": values((6, 4, 8), src, 7)}
        want = eager(convert, tree)
        dst = tensors_for(want)
        jax_amem.swap(on_one_device(tree), dst, rules=rules.from_function(convert, tree), progress=False)
        assert the_program().direct is False
        for name, value in want.items():
            assert np.array_equal(raw(dst[name]), as_bytes(value)), name


# ----------------------------------------------------------------------------- refusals


def test_bad_constants_are_refused_before_anything_is_written():
    """A vector that does not fit its axis, steps on an integer tensor: refused when planned,
    the destination untouched, and the next good swap runs (nothing half-made was kept)."""
    src = on_one_device({"w": values((4, 6), np.float32, 8), "i": np.arange(6, dtype=np.int32)})
    dst = {"w": torch.full((4, 6), 3.0), "i": torch.zeros(6, dtype=torch.int32)}
    Rule = reshard.Rule
    for bad, match in (([Rule.copy("w", scale=(1.0, 2.0, 3.0), along=1), Rule.copy("i")],
                        r"its vector of 3 constants does not fit its axis 1 \(along=\)"),
                       ([Rule.copy("w"), Rule.copy("i", scale=0.5)], "a constant step runs in a floating dtype")):
        with pytest.raises(jax_amem.SwapError, match=r"cannot be planned \(nothing was written\).*" + match):
            jax_amem.swap(src, dst, rules=bad, progress=False)
        assert (dst["w"] == 3.0).all() and not dst["i"].any()
    jax_amem.swap(src, dst, rules=[Rule.copy("w", scale=0.5), Rule.copy("i")], progress=False)
    assert np.array_equal(raw(dst["w"]), as_bytes(src["w"] * 0.5))
    assert [c.affine_rows for c in the_program().direct.copies] == [1]


def test_a_refused_affine_table_leaves_every_destination_and_the_program_untouched(monkeypatch):
    """An affine table that the DirectCopy's checks refuse (a program of 9 steps, injected): the
    swap raises naming the chunk and program before any byte of any tensor moves; the program
    keeps no half-made launch, and the next swap writes everything."""
    tree = {"a": values((4, 6), np.float32, 9), "b": values((4, 6), np.float32, 10)}
    src = on_one_device(tree)
    dst = {k: torch.full((4, 6), 3.0) for k in tree}
    pieces = [reshard.Rule.copy("a", scale=0.5), reshard.Rule.copy("b")]
    refused_with_nine_steps(monkeypatch, src, dst, pieces)
    jax_amem.swap(src, dst, rules=pieces, progress=False)
    assert np.array_equal(raw(dst["a"]), as_bytes(src["a"] * 0.5))
    assert np.array_equal(raw(dst["b"]), as_bytes(tree["b"]))


def refused_with_nine_steps(monkeypatch, src, dst, pieces, check_rows=lambda rows, fused: None):
    """The swap of `src` into `dst` with the direct launch's first affine program made one of 9
    steps (`check_rows(rows, fused)` sees what direct_affine.rows made): refused naming the
    chunk and program, no byte of `dst` (all 3.0) moved, nothing half-made kept. Restores the
    real rows after."""
    real = direct_affine.rows

    def corrupted(*args, **kwargs):
        rows, words, programs, fused = real(*args, **kwargs)
        check_rows(rows, fused)
        words = words.copy()
        words[3] = 9  # the program's step count
        return rows, words, programs, fused

    monkeypatch.setattr(direct_affine, "rows", corrupted)
    with pytest.raises(ValueError, match=r"direct copy, chunk 0: affine copy: program 0: 9 steps \(1 to 8\)"):
        jax_amem.swap(src, dst, rules=pieces, progress=False)
    assert all((t == 3.0).all() for t in dst.values())
    assert the_program().direct is None  # made again on the next run
    monkeypatch.setattr(direct_affine, "rows", real)


def _table(src="float32", dst="float32", steps=(Step("mul", "float32", (0.5,)),)):
    return encode([Program(Affine(tuple(steps)), src, dst, (0,), (0,), (0,))])


def _chunk(out, rows, table=None, programs=None, address=None):
    empty6, empty10 = np.zeros((0, 6), np.int64), np.zeros((0, 10), np.int64)
    table = _table() if table is None else table
    words = table.words.view(np.int64) if hasattr(table, "words") else np.asarray(table, np.int64)
    programs = table.programs if programs is None else programs
    return ([0], [out.ctypes.data if address is None else address], [out.nbytes], empty6, empty6, empty10,
            np.asarray(rows, np.int64).reshape(-1, 6), words, programs)


def test_direct_copy_runs_affine_rows_on_the_host():
    source = np.arange(16, dtype=np.float32)
    out = np.zeros(16, np.float32)
    copy = core.copy.DirectCopy(-1, [64], [_chunk(out, [[0, 0, 2, 4, 8, 0]])])
    assert copy.affine_rows == 1 and copy.rows == 0
    copy.run(np.array([source.ctypes.data], np.int64))
    assert np.array_equal(out[4:12], source[2:10] * np.float32(0.5)) and not out[:4].any() and not out[12:].any()


def _program_words(**fields):
    """A one-step program's words with fields changed (copy::AffineProgram: src, dst, wide,
    steps, then per step op, dtype, constant, stride, extent, rounding)."""
    words = _table().words.view(np.int64).copy()
    at = {"src": 0, "dst": 1, "wide": 2, "steps": 3, "op": 4, "step_dtype": 5, "constant": 6, "stride": 7,
          "extent": 8, "rounding": 9}
    for name, value in fields.items():
        words[at[name]] = value
    return words


@pytest.mark.parametrize("rows, table, programs, match", [
    ([[0, 0, 10, 0, 8, 0]], None, None, r"affine row 0 \(8 elements from 10 to 0\): outside its buffers"),
    ([[0, 0, 0, 10, 8, 0]], None, None, r"affine row 0 \(8 elements from 0 to 10\): outside its buffers"),
    ([[0, 0, 0, 0, 0, 0]], None, None, "affine row 0 .*outside its buffers"),
    ([[0, 1, 0, 0, 8, 0]], None, None, "affine row 0: buffer or program index out of range"),
    ([[1, 0, 0, 0, 8, 0]], None, None, "affine row 0: buffer or program index out of range"),
    ([[0, 0, 0, 0, 8, 1]], None, None, "affine row 0: buffer or program index out of range"),
    ([[0, 0, 0, 0, 8, 0]], None, 2, "affine table of 424 bytes does not hold its 2 programs"),
    ([[0, 0, 0, 0, 8, 0]], None, -1, "affine table of 424 bytes does not hold its -1 programs"),
    ([[0, 0, 0, 0, 8, 0]], _program_words(src=7), 1, "affine copy: program 0: unknown source or destination dtype code"),
    ([[0, 0, 0, 0, 8, 0]], _program_words(steps=0), 1, r"affine copy: program 0: 0 steps \(1 to 8\)"),
    ([[0, 0, 0, 0, 8, 0]], _program_words(wide=1), 1, "affine copy: program 0: computed in float64 exactly when"),
    ([[0, 0, 0, 0, 8, 0]], _program_words(op=9), 1, "affine copy: program 0, step 0: unknown operation or dtype code"),
    ([[0, 0, 0, 0, 8, 0]], _program_words(step_dtype=3), 1, "affine copy: program 0, step 0: a float64 step between narrower"),
    ([[0, 0, 0, 0, 8, 0]], _program_words(constant=1), 1, "affine copy: program 0, step 0: its constants lie outside the 1"),
    ([[0, 0, 0, 0, 8, 0]], _program_words(stride=1, extent=5), 1, "affine copy: program 0, step 0: its constants lie outside"),
    ([[0, 0, 0, 0, 8, 0]], _program_words(rounding=4), 1, "affine copy: program 0, step 0: unknown rounding flags"),
])
def test_direct_copy_refuses_affine_rows_and_tables_outside_their_memory(rows, table, programs, match):
    out = np.zeros(16, np.float32)
    with pytest.raises(ValueError, match="direct copy, chunk 0: " + match):
        core.copy.DirectCopy(-1, [64], [_chunk(out, rows, table, programs)])
    assert not out.any()


def test_direct_copy_refuses_a_destination_that_does_not_hold_whole_elements():
    out = np.zeros(20, np.float32)
    with pytest.raises(ValueError, match="affine row 0: destination 0 at address .* is not a multiple of the "
                                         "4-byte elements it writes"):
        core.copy.DirectCopy(-1, [64], [(*_chunk(out, [[0, 0, 0, 0, 4, 0]])[:1], [out.ctypes.data + 2], [64],
                                         *_chunk(out, [[0, 0, 0, 0, 4, 0]])[3:])])
    assert not out.any()


def test_direct_copy_refuses_affine_rows_of_the_wrong_width():
    out = np.zeros(16, np.float32)
    chunk = list(_chunk(out, [[0, 0, 0, 0, 8, 0]]))
    chunk[6] = np.zeros((1, 5), np.int64)
    with pytest.raises(ValueError, match=r"affine rows must have shape \(n, 6\)"):
        core.copy.DirectCopy(-1, [64], [tuple(chunk)])
    with pytest.raises(ValueError, match=r"a chunk is \(source slots"):
        core.copy.DirectCopy(-1, [64], [tuple(chunk[:7])])


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("src, dst", [(np.float32, np.float32), (BF16, BF16), (np.float32, BF16),
                                      (np.float16, np.float32), (BF16, np.float16)],
                         ids=lambda d: np.dtype(d).name)
def test_gpu_direct_launch_bit_identical_to_jax_and_the_xla_route(monkeypatch, src, dst):
    """On CUDA: the exporter's every step into PyTorch tensors, launched directly on PyTorch's
    stream, a first swap and two repeats with new sources, each the bytes of JAX's eager
    evaluation (on the CPU: float32 subnormals left out of the inputs, which XLA:CPU flushes and
    the GPU keeps); then the XLA route's custom call writes the same bytes. A 64 MiB scaled
    tensor among them: rows in many pieces."""
    gpu = jax.devices("gpu")[0]
    cpu = jax.devices("cpu")[0]
    cuda = torch.device("cuda", gpu.local_hardware_id)
    tree = tree_of(src, subnormals=False)
    tree["big"] = values((16 << 20,), src, 11, subnormals=False)
    convert = lambda p: {**exporter(dst, src)({k: v for k, v in p.items() if k != "big"}),
                         "big": (p["big"] * 0.125).astype(dst)}
    pieces = rules.from_function(convert, tree)
    arrays = {k: jax.device_put(v, gpu) for k, v in tree.items()}
    step = jax.jit(lambda t: jax.tree_util.tree_map(lambda x: (x * 1.5).astype(x.dtype), t))
    launched = tensors_for(eager(convert, tree), device=cuda)
    for k in range(3):
        if k:
            arrays = step(arrays)
        jax_amem.swap(arrays, launched, rules=pieces, progress=False)
        with jax.default_device(cpu):
            want = eager(convert, {name: np.asarray(v) for name, v in arrays.items()})
        for name, value in want.items():
            assert np.array_equal(raw(launched[name]), as_bytes(value)), (k, name)
    copies = the_program().direct.copies
    assert sum(c.affine_rows for c in copies) > 0 and all(c.device == gpu.local_hardware_id for c in copies)
    monkeypatch.setattr(direct_affine, "ENABLED", False)
    forget()
    by_xla = tensors_for(want, device=cuda)
    jax_amem.swap(arrays, by_xla, rules=pieces, progress=False)
    assert the_program().direct is False
    for name in want:
        assert np.array_equal(raw(launched[name]), raw(by_xla[name])), name
