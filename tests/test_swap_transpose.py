"""The direct launch's fused transpose-and-cast copy (src/copy/transpose.h,
swapping/in_process/fused_views.py): views that are a batched 2-D transpose and/or a cast are
read by the copy itself, not made by XLA first. On the CPU its loop runs the same rows, so
here: which views it covers, its conversions bit-exact against XLA's convert (specials
included), odd shapes and partial rows, the presets' real views swapped bit-exact against the
XLA route, that such programs take the direct route, and every refusal of a transpose row.
GPU (`gpu`): the kernel bit-exact against XLA on the GPU."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem import reshard
from jax_amem._native import core
from jax_amem.reshard import rules
from jax_amem.swapping import forget
from jax_amem.swapping.in_process import direct, fused_views, schedule

import preset_models as M

torch = pytest.importorskip("torch")
from swap_probes import clean, raw, the_program  # noqa: F401 - clean: an autouse fixture
ml_dtypes = pytest.importorskip("ml_dtypes")

KINDS = core.copy.TRANSPOSE_KINDS
SPECIALS = np.array([0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa12345, 0xff812345, 0x00000001, 0x00400000,
                     0x80000003, 0x7f7fffff, 0x3f808000, 0x3f818000, 0x3f80ffff, 0x7f7f8000, 0x387fe000,
                     0x33000000, 0x33000001, 0x477ff000, 0x477fefff, 0x7f800000, 0xff800000], np.uint32)


# ----------------------------------------------------------------------------- which views


@pytest.mark.parametrize("shape, perm, want", [
    ((3, 4), (1, 0), (1, 3, 4)),
    ((3, 4), (0, 1), (1, 1, 12)),
    ((2, 3, 4), (0, 2, 1), (2, 3, 4)),
    ((5, 2, 3), (1, 2, 0), (1, 5, 6)),      # a head-split kernel (in, heads, hd) read as (heads, hd, in)
    ((2, 3, 4), (2, 0, 1), (1, 6, 4)),
    ((7, 1, 4), (2, 1, 0), (1, 7, 4)),      # an axis of size 1 goes anywhere
    ((1, 1), (1, 0), (1, 1, 1)),
    ((2, 3, 4), (1, 0, 2), None),           # a transpose of rows of 4: not a 2-D transpose
    ((2, 3, 4), (2, 1, 0), None),
    ((2, 3, 4, 5), (0, 1, 3, 2), (6, 4, 5)),
])
def test_geometry(shape, perm, want):
    assert fused_views.geometry(shape, perm) == want
    if want is not None:  # the claim itself: the view is x read as (batch, rows, cols), last two swapped
        x = np.arange(np.prod(shape)).reshape(shape)
        assert np.array_equal(np.transpose(x, perm).reshape(-1),
                              np.swapaxes(x.reshape(want), 1, 2).reshape(-1))


def test_kinds():
    assert fused_views.kind("float32", "bfloat16") == KINDS["float32->bfloat16"]
    assert fused_views.kind("bfloat16", "bfloat16") == KINDS["copy2"]
    assert fused_views.kind("int32", "int32") == KINDS["copy4"]
    assert fused_views.kind("float32", "int32") is None
    assert fused_views.kind("int8", "int8") is None
    assert fused_views.kind("float64", "float32") is None


# ----------------------------------------------------------------------------- the copy itself


def _run_rows(source: np.ndarray, out_dtype, batch, rows, cols, first, count, dst_elements=None, kind=None):
    """The fused copy of view elements [first, first + count) of `source` read as (batch, rows,
    cols), on the CPU, into a fresh buffer; returns the buffer."""
    out = np.full(dst_elements or count, 0x5a5a, np.uint16 if np.dtype(out_dtype).itemsize == 2 else np.uint32)
    if kind is None:
        kind = fused_views.kind(source.dtype, out_dtype)
    row = np.array([[0, 0, 0, first, count, batch, rows, cols, kind, -1]], np.int64)
    empty = np.zeros((0, 6), np.int64)
    copy = core.copy.DirectCopy(-1, [source.nbytes], [([0], [out.ctypes.data], [out.nbytes], empty, empty, row)])
    assert copy.transpose_rows == 1
    copy.run(np.array([source.ctypes.data], np.int64))
    return out


def _xla(source, out_dtype, batch, rows, cols):
    x = jnp.asarray(source).reshape(batch, rows, cols)
    return np.asarray(jax.jit(lambda a: jnp.swapaxes(a, 1, 2).astype(out_dtype))(x)).reshape(-1)


def _bits(values) -> np.ndarray:
    values = np.asarray(values)
    return values.view(np.uint16 if values.dtype.itemsize == 2 else np.uint32)


CASTS = [("float32", "bfloat16"), ("float32", "float16"), ("bfloat16", "bfloat16"), ("float32", "float32"),
         ("float16", "float16"), ("bfloat16", "float32"), ("float16", "float32"), ("int32", "int32")]


def _random(rng, shape, dtype):
    if dtype == "int32":
        return rng.integers(-2**31, 2**31 - 1, shape, dtype=np.int32)
    wide = rng.standard_normal(shape).astype(np.float32) * np.float32(3.0) ** rng.integers(-30, 30, shape)
    with np.errstate(over="ignore"):  # values past float16's range: infinities, on purpose
        return wide.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


@pytest.mark.parametrize("src_dtype, dst_dtype", CASTS)
@pytest.mark.parametrize("batch, rows, cols", [(1, 67, 131), (3, 5, 129), (2, 64, 64), (1, 1, 1000), (4, 130, 1),
                                              (2, 150, 203)])
def test_bit_exact_against_xla(src_dtype, dst_dtype, batch, rows, cols):
    """Odd shapes (no multiple of the GPU's 64-wide tile), casts (rows == 1 or cols == 1) and
    whole views: the bytes of jnp.swapaxes(x, 1, 2).astype(dtype)."""
    rng = np.random.default_rng(batch * 1000 + rows + cols)
    source = _random(rng, (batch, rows, cols), src_dtype)
    out_dtype = jnp.bfloat16 if dst_dtype == "bfloat16" else dst_dtype
    want = _bits(_xla(source, out_dtype, batch, rows, cols))
    got = _run_rows(source, out_dtype, batch, rows, cols, 0, source.size)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dst_dtype", ["bfloat16", "float16"])
def test_specials_round_as_xla(dst_dtype):
    """NaN (quiet, signalling, with payloads, either sign), infinities, subnormals, overflow, and
    values exactly halfway between two results: the bits of XLA's convert on the CPU."""
    source = np.tile(SPECIALS, 3).view(np.float32)[:60].reshape(1, 6, 10)
    out_dtype = jnp.bfloat16 if dst_dtype == "bfloat16" else jnp.float16
    for rows, cols in ((6, 10), (1, 60)):
        want = _bits(_xla(source, out_dtype, 1, rows, cols))
        assert np.array_equal(_run_rows(source, out_dtype, 1, rows, cols, 0, 60), want), (rows, cols)


@pytest.mark.parametrize("first, count", [(0, 1), (5, 200), (131, 131), (67 * 131 - 1, 1), (1000, 5000),
                                          (8000, 9000), (3 * 67 + 7, 2 * 67 * 131 - 3 * 67 - 20), (67, 2 * 67 * 131 - 67)])
def test_a_row_of_part_of_the_view_writes_only_its_elements(first, count):
    """Rows that start and end inside a view row, span the two matrices, or cover whole view rows
    (the CPU loop copies whole view rows in tiles and the rest element by element)."""
    source = _random(np.random.default_rng(1), (2, 67, 131), "float32")
    whole = _bits(_xla(source, jnp.bfloat16, 2, 67, 131))
    got = _run_rows(source, jnp.bfloat16, 2, 67, 131, first, count, dst_elements=count + 3)
    assert np.array_equal(got[:count], whole[first:first + count])
    assert (got[count:] == 0x5a5a).all()  # nothing past the row


def _row(**fields):
    row = dict(src_index=0, dst_index=0, dst_offset=0, first=0, count=12, batch=1, rows=3, cols=4,
               kind=KINDS["float32->bfloat16"])
    row.update(fields)
    row.setdefault("program", -1)
    return np.array([list(row.values())], np.int64)


@pytest.mark.parametrize("fields, match", [
    (dict(kind=99), "kind 99 is not a known conversion"),
    (dict(src_index=1), "source 1 is not one of the 1 sources"),
    (dict(dst_index=1), "destination 1 is not one of the 1 destinations"),
    (dict(rows=0), r"shape \(1, 0, 4\) is not a shape of memory"),
    (dict(batch=1 << 40, rows=1 << 40), r"shape \(1099511627776, 1099511627776, 4\) is not a shape of memory"),
    (dict(batch=2), "its view reads 24 elements of 4 bytes, past the 48 bytes of source 0"),
    (dict(first=5, count=8), r"view elements \[5, \+8\) are outside its 12"),
    (dict(first=-1), r"view elements \[-1, \+12\) are outside its 12"),
    (dict(dst_offset=2), "writes 12 elements of 2 bytes at offset 2, past the 24 bytes of destination 0"),
    (dict(dst_offset=1, count=4), "writes at offset 1, not a multiple of its 2-byte elements"),
    (dict(count=-1), r"view elements \[0, \+-1\) are outside its 12"),
    (dict(program=0), r"program 0 is not one of the 0 programs of its affine table \(-1: none\)"),
    (dict(program=-2), r"program -2 is not one of the 0 programs"),
])
def test_transpose_rows_outside_their_buffers_are_refused(fields, match):
    source = np.arange(12, dtype=np.float32)
    out = np.zeros(12, np.uint16)
    empty = np.zeros((0, 6), np.int64)
    with pytest.raises(ValueError, match="chunk 0: transpose row 0: " + match):
        core.copy.DirectCopy(-1, [48], [([0], [out.ctypes.data], [24], empty, empty, _row(**fields))])
    assert not out.any()


def test_a_destination_that_holds_no_whole_elements_is_refused():
    """A destination address that is not a multiple of the elements the row writes (the CUDA
    kernel's stores there would fault) is refused, naming the row, before anything is written."""
    out = np.zeros(13, np.uint16)
    empty = np.zeros((0, 6), np.int64)
    with pytest.raises(ValueError, match=r"chunk 0: transpose row 0: destination 0 at address \d+ is not a multiple "
                                         "of the 2-byte elements it writes"):
        core.copy.DirectCopy(-1, [48], [([0], [out.ctypes.data + 1], [24], empty, empty, _row())])
    assert not out.any()


def test_a_view_of_more_tile_rows_than_the_kernel_counts_is_refused():
    """The kernel's tile indices are 32-bit: a view of 2^32 tile rows is refused when checked
    (nothing is read: the sizes alone)."""
    out = np.zeros(12, np.uint16)
    empty = np.zeros((0, 6), np.int64)
    row = _row(batch=1 << 22, rows=64, cols=1 << 16, count=1)
    with pytest.raises(ValueError, match="transpose row 0: too many tiles for one launch"):
        core.copy.DirectCopy(-1, [1 << 46], [([0], [out.ctypes.data], [24], empty, empty, row)])


def test_rows_of_several_kinds_in_one_chunk():
    """Rows of two conversions in one chunk (each kind is its own kernel launch on CUDA, the rows
    ordered by kind): both written, and a refusal names the row as given."""
    source = _random(np.random.default_rng(4), (3, 5), "float32")
    out16, out32 = np.zeros(15, np.uint16), np.zeros(15, np.uint32)
    rows = np.array([[0, 0, 0, 0, 15, 1, 3, 5, KINDS["float32->bfloat16"], -1],
                     [0, 1, 0, 0, 15, 1, 3, 5, KINDS["copy4"], -1]], np.int64)
    empty = np.zeros((0, 6), np.int64)
    chunk = ([0], [out16.ctypes.data, out32.ctypes.data], [30, 60], empty, empty, rows)
    copy = core.copy.DirectCopy(-1, [60], [chunk])
    copy.run(np.array([source.ctypes.data], np.int64))
    assert np.array_equal(out16, _bits(_xla(source, jnp.bfloat16, 1, 3, 5)))
    assert np.array_equal(out32, _bits(_xla(source, jnp.float32, 1, 3, 5)))
    bad = rows.copy()
    bad[1, 4] = 16  # the second row given, the first by kind: named as given
    with pytest.raises(ValueError, match=r"transpose row 1: view elements \[0, \+16\) are outside its 15"):
        core.copy.DirectCopy(-1, [60], [(*chunk[:5], bad)])


def test_transpose_rows_of_the_wrong_width_are_refused():
    empty = np.zeros((0, 6), np.int64)
    out = np.zeros(12, np.uint16)
    with pytest.raises(ValueError, match=r"transpose rows must have shape \(n, 10\)"):
        core.copy.DirectCopy(-1, [48], [([0], [out.ctypes.data], [24], empty, empty, np.zeros((1, 6), np.int64))])


# ----------------------------------------------------------------------------- swaps


def _one_device(tree):
    device = jax.devices()[0]
    return jax.tree_util.tree_map(lambda x: jax.device_put(jnp.asarray(x), device), tree)


def _swap_both_routes(monkeypatch, src, make_dst, **options):
    """The swap through the fused copy, then through XLA's route: (tensors, tensors, program)."""
    fused = make_dst()
    jax_amem.swap(src, fused, progress=False, **options)
    program = the_program()
    monkeypatch.setattr(direct, "ENABLED", False)
    forget()
    by_xla = make_dst()
    jax_amem.swap(src, by_xla, progress=False, **options)
    assert the_program().direct is False
    monkeypatch.setattr(direct, "ENABLED", True)
    return fused, by_xla, program


@pytest.mark.parametrize("family, source",
                         [(f, "flax") for f in ("llama", "qwen3", "gemma", "gemma2", "gemma3", "gpt2", "mixtral",
                                                "phi3")]
                         + [(f, "maxtext") for f in ("llama", "qwen3", "mixtral")])
@pytest.mark.parametrize("cast", ["bfloat16", None])
def test_preset_views_swap_bit_exact_through_the_fused_copy(monkeypatch, family, source, cast):
    """The presets' real views (stacked kernels read layer by layer and transposed, head-split
    kernels, embeddings and norms cast): the fused copy's bytes are the XLA route's and the
    independent oracle's. MaxText's query kernel has a constant step (its scale) on a transposed
    view: the fused copy runs it (its rows name the scale's program), launched directly too."""
    weights = M.logical(family, np.random.default_rng(5))
    tree = _one_device(M.source_tree(family, source, weights))
    want = M.oracle(family, "hf", weights, np, 1)
    dtype = torch.bfloat16 if cast else torch.float32

    def make_dst():
        return {k: torch.full(tuple(v.shape), float("nan"), dtype=dtype) for k, v in want.items()}

    rule_list = rules.preset(family, tree, source=source, layout="hf", tp=1, cast=cast, head_dim=M.HD)
    fused, by_xla, program = _swap_both_routes(monkeypatch, tree, make_dst, rules=rule_list)
    scaled = any(program.plan.affine(v) is not None for v in range(len(program.plan.views)))
    assert not scaled or source == "maxtext"  # MaxText's query scale, in some families: constant steps
    assert isinstance(program.direct, direct.DirectProgram)
    transformed = any(schedule._transforms(program.plan, v) for v in range(len(program.plan.views)))
    assert (sum(c.transpose_rows for c in program.direct.copies) > 0) == transformed
    assert transformed or (family == "gpt2" and not cast)  # GPT-2 keeps (in, out): nothing to transpose
    for name, value in want.items():
        assert np.array_equal(raw(fused[name]), raw(by_xla[name])), name
        if source == "flax":  # (MaxText's checkpoint holds the query pre-scaled: its oracle is another)
            expected = np.ascontiguousarray(value).astype(ml_dtypes.bfloat16 if cast else np.float32)
            assert np.array_equal(raw(fused[name]), expected.reshape(-1).view(np.uint8)), name


@pytest.mark.parametrize("dtype, cast", [("float32", "bfloat16"), ("bfloat16", None), ("float32", None),
                                         ("float32", "float16")])
def test_odd_sizes_and_partial_views_swap_bit_exact(monkeypatch, dtype, cast):
    """Kernels of odd sizes transposed whole, a stacked one read layer by layer (rows of part of
    a view), a cast-only vector, two transposed views side by side in one destination (a row
    per view row)."""
    rng = np.random.default_rng(2)
    src = _one_device({
        "a": _random(rng, (67, 131), dtype), "b": _random(rng, (3, 33, 65), dtype),
        "c": _random(rng, (129,), dtype), "d": _random(rng, (10, 7), dtype),
        "e": _random(rng, (33, 7), dtype)})
    out = {None: {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype], "bfloat16": torch.bfloat16,
           "float16": torch.float16}[cast]
    rule_list = [reshard.Rule.copy("a", transpose=(1, 0), cast=cast),
                 reshard.Rule.copy("c", cast=cast)]
    rule_list += [reshard.Rule.copy(f"b{k}", "b", index=(k,), transpose=(1, 0), cast=cast) for k in range(3)]
    rule_list += [reshard.Rule.concat("cat", [reshard.Part("d", transpose=(1, 0), cast=cast),
                                              reshard.Part("e", transpose=(1, 0), cast=cast)], axis=1)]
    shapes = {"a": (131, 67), "c": (129,), **{f"b{k}": (65, 33) for k in range(3)}, "cat": (7, 43)}

    def make_dst():
        return {k: torch.full(s, 7, dtype=out) for k, s in shapes.items()}

    fused, by_xla, program = _swap_both_routes(monkeypatch, src, make_dst, rules=rule_list)
    assert isinstance(program.direct, direct.DirectProgram)
    for name in shapes:
        assert np.array_equal(raw(fused[name]), raw(by_xla[name])), name
    b = np.asarray(src["b"])
    with np.errstate(over="ignore"):
        want_b1 = np.ascontiguousarray(b[1].T).astype(ml_dtypes.bfloat16 if cast == "bfloat16" else
                                                      np.float16 if cast == "float16" else b.dtype)
    assert np.array_equal(raw(fused["b1"]), want_b1.reshape(-1).view(np.uint8))


def test_a_transposed_program_is_launched_directly_and_repeats_without_xla(monkeypatch):
    """Counting: every swap of a program of transposed, cast views is one direct launch, and
    no XLA program runs (its calls would fail here)."""
    src = _one_device({f"w{i}": jnp.arange(12.0 * (i + 1), 12.0 * (i + 2)).reshape(3, 4) for i in range(5)})
    dst = {k: torch.zeros(4, 3, dtype=torch.bfloat16) for k in src}
    rule_list = [reshard.Rule.copy(k, transpose=(1, 0), cast="bfloat16") for k in src]
    launches = []
    real_launch = direct.DirectProgram.launch
    monkeypatch.setattr(direct.DirectProgram, "launch", lambda self, *a, **k: launches.append(1) or
                        real_launch(self, *a, **k))
    jax_amem.swap(src, dst, rules=rule_list, progress=False)
    program = the_program()
    assert isinstance(program.direct, direct.DirectProgram)
    monkeypatch.setattr(program, "fns", [_refuse] * len(program.fns))
    for k in range(3):
        src = jax.tree_util.tree_map(lambda x: x + 1, src)
        jax_amem.swap(src, dst, rules=rule_list, progress=False)
        for name, x in src.items():
            assert torch.equal(dst[name], torch.tensor(np.asarray(x)).T.to(torch.bfloat16))
    assert len(launches) == 4


def _refuse(*args, **kwargs):
    raise AssertionError("an XLA program ran")


def test_with_the_fused_copy_off_transposed_views_stay_in_xla(monkeypatch):
    monkeypatch.setattr(fused_views, "ENABLED", False)
    src = _one_device({"w": jnp.arange(12.0).reshape(3, 4)})
    dst = {"w": torch.zeros(4, 3, dtype=torch.bfloat16)}
    jax_amem.swap(src, dst, rules=[reshard.Rule.copy("w", transpose=(1, 0), cast="bfloat16")], progress=False)
    assert the_program().direct is False
    assert torch.equal(dst["w"], torch.arange(12.0).reshape(3, 4).T.to(torch.bfloat16))


def test_other_permutations_and_conversions_stay_in_xla():
    src = _one_device({"w": jnp.arange(24.0).reshape(2, 3, 4)})
    for perm, cast, dtype in (((1, 0, 2), None, torch.float32), ((0, 1, 2), "int32", torch.int32)):
        forget()
        want = np.asarray(src["w"]).transpose(perm).astype(cast or np.float32)
        dst = {"w": torch.zeros(want.shape, dtype=dtype)}
        jax_amem.swap(src, dst, rules=[reshard.Rule.copy("w", transpose=perm, cast=cast)], progress=False)
        assert the_program().direct is False
        assert np.array_equal(dst["w"].numpy(), want)


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("src_dtype, dst_dtype", CASTS)
def test_gpu_bit_exact_against_xla(src_dtype, dst_dtype):
    gpu = jax.devices("gpu")[0]
    cuda = torch.device("cuda", gpu.local_hardware_id)
    rng = np.random.default_rng(3)
    shapes = {"a": (67, 131), "b": (2, 2048, 1024), "c": (3, 65, 1), "d": (4099,)}
    src = {k: jax.device_put(_random(rng, s, src_dtype), gpu) for k, s in shapes.items()}
    if src_dtype == "float32":
        src["s"] = jax.device_put(np.tile(SPECIALS, 7).view(np.float32)[:128].reshape(8, 16), gpu)
        shapes["s"] = (8, 16)
    cast = None if src_dtype == dst_dtype else dst_dtype
    last_two = {k: None if len(s) == 1 else tuple(range(len(s) - 2)) + (len(s) - 1, len(s) - 2)
                for k, s in shapes.items()}
    rule_list = [reshard.Rule.copy(k, transpose=last_two[k], cast=cast) for k in shapes]
    out_dtype = jnp.bfloat16 if dst_dtype == "bfloat16" else dst_dtype
    want = {k: np.asarray(jax.jit(lambda x: (x if x.ndim == 1 else jnp.swapaxes(x, -1, -2)).astype(out_dtype))(v))
            for k, v in src.items()}
    tdtype = getattr(torch, dst_dtype)
    dst = {k: torch.zeros(w.shape, dtype=tdtype, device=cuda) for k, w in want.items()}
    jax_amem.swap(src, dst, rules=rule_list, progress=False)
    assert isinstance(the_program().direct, direct.DirectProgram)
    for name, w in want.items():
        assert np.array_equal(raw(dst[name]), np.ascontiguousarray(w).reshape(-1).view(np.uint8)), name
