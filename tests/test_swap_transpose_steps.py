"""Transposed views with constant steps through the direct launch: the fused transpose copy
(src/copy/transpose.h) runs the view's program of steps (the affine kernel's arithmetic,
src/copy/affine_kernel.h) while it transposes, so a scaled kernel read transposed (MaxText's
query kernel) is neither made by XLA first nor sends its program to the XLA route.

On the CPU the same rows run in the transpose loop, so here: every dtype pair the two kernels
share, scalar steps, chains, and vector constants along either axis of the transpose and along
a batch (layer) axis, bit-identical to JAX's eager evaluation of the exporter and to the XLA
route (XLA's transpose, then the affine custom call); the probes that the direct launch ran
(no custom call traced, transpose rows that name programs); odd sizes and rows of part of a
view; every refusal of a row or table before any byte moves. GPU (`gpu`): the same on CUDA.
MaxText's presets: tests/test_reshard_presets.py."""

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem._native import core
from jax_amem.affine_copy import Program, encode
from jax_amem.reshard import rules
from jax_amem.reshard.affine import Affine, Step
from jax_amem.swapping import forget
from jax_amem.swapping.in_process import direct, direct_affine

torch = pytest.importorskip("torch")
from swap_probes import clean, raw, the_program  # noqa: F401 - clean: an autouse fixture
from test_swap_direct_affine import (COLUMNS, HEADS, _no_xla, as_bytes, direct_then_xla, eager, on_one_device,
                                     refused_with_nine_steps, tensors_for, values)

BF16 = ml_dtypes.bfloat16
KINDS = core.copy.TRANSPOSE_KINDS
# Every (source, destination) pair both the transpose copy and the affine kernel have.
SHARED = [(np.float32, np.float32), (BF16, BF16), (np.float16, np.float16), (np.float32, BF16),
          (np.float32, np.float16), (BF16, np.float32), (np.float16, np.float32)]
LAYERS = np.linspace(0.25, 4.0, 16, dtype=np.float32)   # a vector along w's layer (batch) axis
HEAD_DIM = np.arange(1, 5, dtype=np.float32) / 3        # a vector along k's last axis
WIDE = np.linspace(-2.0, 2.0, 131, dtype=np.float32)    # along big's last axis


def tree_of(src, subnormals=True):
    return {"w": values((16, 6, 8), src, 1, subnormals), "k": values((8, 2, 4), src, 2, subnormals),
            "big": values((3, 67, 131), src, 3, subnormals)}


def exporter(dst):
    """Transposed views with steps, as exporters write them: a layer of a stack transposed, a
    whole stack transposed batch by batch, vectors along the transpose's rows, its columns and
    the batch axis, chains, a cast before the step, MaxText's query scaling (reshape then .T),
    a vector along head_dim merged into the transpose's columns; odd sizes; and a plain
    transposed view in the same program."""
    def convert(p):
        w, k, big = p["w"], p["k"], p["big"]
        return {"scalar": (w[1] * 0.3).T.astype(dst),
                "div": (w / np.float32(1.7)).transpose(0, 2, 1).astype(dst),
                "rows": (w * HEADS[None, :, None]).transpose(0, 2, 1).astype(dst),   # source axis 1
                "cols": (w[2:6] + COLUMNS).transpose(0, 2, 1).astype(dst),           # source axis 2
                "layers": (w * LAYERS[:, None, None]).transpose(0, 2, 1).astype(dst),  # the batch axis
                "t_rows": (w[3] * HEADS[:, None]).T.astype(dst),
                "t_cols": (w[3] - COLUMNS).T.astype(dst),
                "chain": ((w[4] * 0.7 + 1.25) / 3.0 - 0.5).T.astype(dst),
                "rsub": (0.5 - w[0]).T.astype(dst),
                "cast_first": w[5].astype(dst).T * 2,
                "query": (k.astype(jnp.float32) * np.float32(np.sqrt(3))).astype(k.dtype).reshape(8, 8).T.astype(dst),
                "head_dim": (k * HEAD_DIM).reshape(8, 8).T.astype(dst),
                "big": (big * WIDE).transpose(0, 2, 1).astype(dst),
                "big_layer": (big[1] * 0.5).T.astype(dst),
                "plain": w[7].T.astype(dst)}
    return convert


def _stepped(program) -> int:
    return sum(c.stepped_transpose_rows for c in program.direct.copies)


@pytest.mark.parametrize("src, dst", SHARED, ids=lambda d: np.dtype(d).name)
def test_every_shared_pair_bit_identical_to_jax_and_to_the_xla_route(monkeypatch, src, dst):
    tree = tree_of(src)
    convert = exporter(dst)
    want = eager(convert, tree)
    launched, program, by_xla = direct_then_xla(monkeypatch, on_one_device(tree), rules.from_function(convert, tree),
                                                want)
    copies = program.direct.copies
    # Every scaled view is a transpose row running its program; none went to the affine kernel.
    assert _stepped(program) >= len(want) - 1 and sum(c.affine_rows for c in copies) == 0
    assert sum(c.transpose_rows for c in copies) > _stepped(program)  # the plain view's rows too
    for name, value in want.items():
        assert np.array_equal(raw(launched[name]), as_bytes(value)), name
        assert np.array_equal(raw(launched[name]), raw(by_xla[name])), name


def test_scaled_and_unscaled_transposes_and_affine_rows_in_one_program(monkeypatch):
    """A transposed scaled view, a scaled view in order (the affine kernel's), a transposed
    cast (the plain fused copy) and a plain copy: one program, launched directly, each bit
    for bit JAX's."""
    tree = {"q": values((12, 2, 8), np.float32, 4), "n": values((12,), np.float32, 5)}
    convert = lambda p: {"q_proj": (p["q"] * np.float32(8 ** 0.5)).reshape(12, 16).T.astype(jnp.bfloat16),
                         "norm": (1.0 + p["n"]).astype(jnp.bfloat16),
                         "k_proj": p["q"].reshape(12, 16).T.astype(jnp.bfloat16),
                         "raw": p["n"]}
    want = eager(convert, tree)
    dst = tensors_for(want)
    with monkeypatch.context() as patch:
        _no_xla(patch)
        jax_amem.swap(on_one_device(tree), dst, rules=rules.from_function(convert, tree), progress=False)
    copies = the_program().direct.copies
    assert _stepped(the_program()) == 1 and sum(c.affine_rows for c in copies) == 1
    assert sum(c.transpose_rows for c in copies) == 2
    for name, value in want.items():
        assert np.array_equal(raw(dst[name]), as_bytes(value)), name


# ----------------------------------------------------------------------------- refusals


def test_a_refused_table_leaves_every_destination_untouched(monkeypatch):
    """The table of a transposed scaled view's program corrupted (9 steps): the swap raises
    naming the chunk and program before any byte of any tensor moves, keeps no half-made
    launch, and the next swap writes everything."""
    tree = {"a": values((4, 6), np.float32, 9), "b": values((4, 6), np.float32, 10)}
    convert = lambda p: {"a": (p["a"] * 0.5).T, "b": p["b"].T}
    src = on_one_device(tree)
    dst = {k: torch.full((6, 4), 3.0) for k in tree}
    pieces = rules.from_function(convert, tree)


    def the_transpose_copys(rows, fused):
        assert len(rows) == 0 and fused  # the scaled view is the transpose copy's, no affine row

    refused_with_nine_steps(monkeypatch, src, dst, pieces, the_transpose_copys)
    jax_amem.swap(src, dst, rules=pieces, progress=False)
    for name, value in eager(convert, tree).items():
        assert np.array_equal(raw(dst[name]), as_bytes(value)), name


def _table(src="float32", dst="float32", steps=(Step("mul", "float32", (0.5,)),)):
    return encode([Program(Affine(tuple(steps)), src, dst, (4, 3), (1, 0), (0, 0))])


def _chunk(out, row, table):
    empty6 = np.zeros((0, 6), np.int64)
    return ([0], [out.ctypes.data], [out.nbytes], empty6, empty6, np.asarray(row, np.int64).reshape(1, 10),
            empty6, table.words.view(np.int64), table.programs)


def test_direct_copy_runs_a_stepped_transpose_row_on_the_host():
    """One row by hand: a (3, 4) float32 source read transposed, times 0.5, as bfloat16; then a
    vector step along the source's rows (axis 0), looked up by view element."""
    source = values((3, 4), np.float32, 11, subnormals=False)
    out = np.zeros(12, np.uint16)
    row = [0, 0, 0, 0, 12, 1, 3, 4, KINDS["float32->bfloat16"], 0]
    copy = core.copy.DirectCopy(-1, [48], [_chunk(out, row, _table(dst="bfloat16"))])
    assert copy.transpose_rows == 1 and copy.stepped_transpose_rows == 1 and copy.affine_rows == 0
    copy.run(np.array([source.ctypes.data], np.int64))
    assert np.array_equal(out, as_bytes((source.T * np.float32(0.5)).astype(BF16)).view(np.uint16))
    vector = (Step("mul", "float32", (1.0, 2.0, 4.0), axis=0),)
    row = [0, 0, 0, 0, 12, 1, 3, 4, KINDS["copy4"], 0]
    out32 = np.zeros(12, np.float32)
    core.copy.DirectCopy(-1, [48], [_chunk(out32, row, _table(steps=vector))]).run(
        np.array([source.ctypes.data], np.int64))
    with np.errstate(over="ignore"):  # 3e38 * 4: infinity, as the copy writes it
        assert np.array_equal(out32, (source * np.array([[1], [2], [4]], np.float32)).T.reshape(-1))


@pytest.mark.parametrize("program, kind, table, match", [
    (1, "float32->bfloat16", _table(dst="bfloat16"), r"program 1 is not one of the 1 programs"),
    (-3, "float32->bfloat16", _table(dst="bfloat16"), r"program -3 is not one of the 1 programs"),
    (0, "float32->bfloat16", _table(), r"program 0 converts dtype code 0 to 0, which is not kind 2's conversion"),
    (0, "copy2", _table("bfloat16", "float16"), r"program 0 converts dtype code 1 to 2, which is not kind 0's"),
    (0, "copy4", _table("float64", "float64", (Step("mul", "float64", (0.5,)),)),
     r"program 0 converts dtype code 3 to 3"),
])
def test_direct_copy_refuses_a_row_whose_program_it_cannot_run(program, kind, table, match):
    out = np.zeros(12, np.float32)
    row = [0, 0, 0, 0, 12, 1, 3, 4, KINDS[kind], program]
    with pytest.raises(ValueError, match="direct copy, chunk 0: transpose row 0: " + match):
        core.copy.DirectCopy(-1, [96], [_chunk(out, row, table)])
    assert not out.any()


def test_direct_copy_checks_the_table_before_the_rows_that_name_it():
    out = np.zeros(12, np.float32)
    words = _table().words.view(np.int64).copy()
    words[6] = 5  # the step's constant past the table's one value
    table = type("Table", (), {"words": words.view(np.uint32), "programs": 1})
    with pytest.raises(ValueError, match="chunk 0: affine copy: program 0, step 0: its constants lie outside the 1"):
        core.copy.DirectCopy(-1, [48], [_chunk(out, [0, 0, 0, 0, 12, 1, 3, 4, KINDS["copy4"], 0], table)])
    assert not out.any()


# ----------------------------------------------------------------------------- GPU


def bits_equal_but_nan(got: np.ndarray, value) -> bool:
    """`got` (raw bytes) is `value` bit for bit, except that a NaN stands for any NaN: a NaN that
    arithmetic makes (inf * 0 in float16 sources that overflowed) has the platform's sign and
    payload, negative on x86 (the CPU oracle), the canonical positive one on CUDA (the kernel and
    XLA's GPU route alike, compared bit for bit below)."""
    want = np.asarray(value)
    unsigned = np.dtype(f"u{want.dtype.itemsize}")
    got_bits, want_bits = got.view(unsigned).reshape(-1), as_bytes(want).view(unsigned).reshape(-1)
    nan = np.isnan(want.astype(np.float32).reshape(-1))
    got_nan = np.isnan(got.view(want.dtype).astype(np.float32).reshape(-1))
    return bool(np.array_equal(nan, got_nan) and np.array_equal(got_bits[~nan], want_bits[~nan]))


@pytest.mark.gpu
@pytest.mark.parametrize("src, dst", SHARED, ids=lambda d: np.dtype(d).name)
def test_gpu_bit_identical_to_jax_and_the_xla_route(monkeypatch, src, dst):
    """On CUDA: the exporter's transposed scaled views into PyTorch tensors, launched directly on
    PyTorch's stream, a first swap and a repeat with new sources, each the bytes of JAX's eager
    evaluation (on the CPU, without float32 subnormals, which XLA:CPU flushes and the GPU
    keeps; a NaN that arithmetic makes is any NaN: bits_equal_but_nan); then the XLA route on
    the GPU writes the same bytes, NaNs included. A (4, 1024, 2048) stack scaled along its
    layers: many tiles, every block loading programs."""
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    cuda = torch.device("cuda", gpu.local_hardware_id)
    tree = {**tree_of(src, subnormals=False), "huge": values((4, 1024, 2048), src, 12, subnormals=False)}
    four = np.array([0.5, 1.0, 2.0, 3.0], np.float32)
    convert = lambda p: {**exporter(dst)({k: v for k, v in p.items() if k != "huge"}),
                         "huge": (p["huge"] * four[:, None, None]).transpose(0, 2, 1).astype(dst)}
    pieces = rules.from_function(convert, tree)
    arrays = {k: jax.device_put(v, gpu) for k, v in tree.items()}
    step = jax.jit(lambda t: jax.tree_util.tree_map(lambda x: (x * 1.5).astype(x.dtype), t))
    launched = tensors_for(eager(convert, tree), device=cuda)
    for k in range(2):  # a first swap, then a repeat with new sources
        if k:
            arrays = step(arrays)
        with monkeypatch.context() as patch:
            _no_xla(patch)
            jax_amem.swap(arrays, launched, rules=pieces, progress=False)
        with jax.default_device(cpu):
            want = eager(convert, {name: np.asarray(v) for name, v in arrays.items()})
        for name, value in want.items():
            assert bits_equal_but_nan(raw(launched[name]), value), (k, name)
    forget()
    again, program, by_xla = direct_then_xla(monkeypatch, arrays, pieces, want, device=cuda)
    assert _stepped(program) >= len(want) - 1
    for name in want:
        assert np.array_equal(raw(launched[name]), raw(again[name])), name
        assert np.array_equal(raw(launched[name]), raw(by_xla[name])), name
