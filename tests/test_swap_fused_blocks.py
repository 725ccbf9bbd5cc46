"""A transposed view's column slice read as whole blocks (jax_amem/swapping/in_process/fused_blocks.py):
the rows of a tensor-parallel rank of a row-parallel layer (vLLM's o_proj, down_proj, an
expert's w2) merged into one row per matrix, which must read the same source elements into the
same destination bytes as the rows it replaces (an element-by-element model of the kernel's
row, below), and the vLLM backend's ranks written bit for bit through them, with far fewer rows."""

import numpy as np
import pytest

from jax_amem.swapping.in_process import fused_blocks

torch = pytest.importorskip("torch", reason="the vLLM ranks' staging buffers are PyTorch tensors")

COPY = 1  # a row's kind: 4-byte elements copied (any kind maps elements the same way)


def row(first, count, batch, rows, cols, dst_offset=0, src=0, dst=0, program=-1):
    return [src, dst, dst_offset, first, count, batch, rows, cols, COPY, program]


def mapping(table: np.ndarray, item: int) -> dict:
    """{destination (buffer, byte): (source operand, source element)} as the kernel reads the rows:
    view element v of a row is (b, j, i) of the view (batch, cols, rows), source element (b, i, j)."""
    out = {}
    for src, dst, offset, first, count, batch, rows, cols, _, _ in table.tolist():
        for v in range(first, first + count):
            b, j, i = v // (rows * cols), v % (rows * cols) // rows, v % rows
            assert b < batch
            out[(dst, offset + (v - first) * item)] = (src, b * rows * cols + i * cols + j)
    return out


def column_slices(batch, rows, cols, parts, part, item=2, dst_offset=0, matrices=None):
    """The schedule's rows for columns [part * rows / parts, ...) of every view row of `matrices`
    (default: all), written one after the other: a rank's row-parallel slice."""
    n = rows // parts
    table, offset = [], dst_offset
    for b in (range(batch) if matrices is None else matrices):
        for j in range(cols):
            table.append(row(b * rows * cols + j * rows + part * n, n, batch, rows, cols, offset))
            offset += n * item
    return np.array(table, np.int64)


@pytest.mark.parametrize("batch, rows, cols, parts", [(1, 8, 5, 2), (3, 12, 4, 4), (2, 16, 3, 8), (4, 6, 7, 3)])
def test_a_rank_slice_becomes_one_row_per_matrix_reading_the_same_elements(batch, rows, cols, parts):
    for part in range(parts):
        table = column_slices(batch, rows, cols, parts, part)
        merged = fused_blocks.merged(table, 2)
        assert len(merged) == batch
        assert mapping(merged, 2) == mapping(table, 2)
        assert (merged[:, 5] == batch * parts).all() and (merged[:, 6] == rows // parts).all()
        assert (merged[:, 7] == cols).all() and (merged[:, 4] == cols * rows // parts).all()


def test_a_run_that_starts_and_ends_inside_a_matrix_keeps_its_place():
    table = column_slices(2, 8, 6, 4, 1)[3:10]  # view rows 3..5 of matrix 0, 0..3 of matrix 1
    merged = fused_blocks.merged(table, 2)
    assert len(merged) == 2
    assert mapping(merged, 2) == mapping(table, 2)


@pytest.mark.parametrize("change", ["uneven", "odd_start", "gap", "other_count", "program", "cast_only",
                                    "whole_rows", "other_destination", "one"])
def test_rows_that_are_no_such_run_are_left_as_they_are(change):
    """Each way a run is broken: a slice width that does not divide the view row (no even
    split), one that does not start at a multiple of it, a gap in the destination, rows of
    other widths, rows with a program of constant steps (their vector constants are numbered by
    view element), a cast (no transpose), whole view rows (already contiguous), rows into
    another buffer, a single row."""
    batch, rows, cols = 1, 12, 4
    if change == "uneven":
        table = np.array([row(j * rows, 5, batch, rows, cols, 10 * j) for j in range(cols)], np.int64)
    elif change == "odd_start":
        table = np.array([row(j * rows + 2, 4, batch, rows, cols, 8 * j) for j in range(cols)], np.int64)
    elif change == "gap":
        table = np.array([row(j * rows, 6, batch, rows, cols, 16 * j) for j in range(cols)], np.int64)
    elif change == "other_count":
        table = np.array([row(j * rows, 6 if j % 2 else 3, batch, rows, cols, 12 * j) for j in range(cols)], np.int64)
    elif change == "program":
        table = column_slices(batch, rows, cols, 2, 0)
        table[:, 9] = 0
    elif change == "cast_only":
        table = np.array([row(j * 6, 6, 1, 1, rows * cols, 12 * j) for j in range(cols)], np.int64)
    elif change == "whole_rows":
        table = np.array([row(j * rows, rows, batch, rows, cols, 2 * rows * j) for j in range(cols)], np.int64)
    elif change == "other_destination":
        table = column_slices(batch, rows, cols, 2, 0)
        table[1::2, 1] = 1
    else:
        table = column_slices(batch, rows, cols, 2, 0)[:1]
    assert np.array_equal(fused_blocks.merged(table, 2), table)


def test_runs_split_where_the_next_row_starts_a_new_run():
    """Two ranks' slices of one matrix into one buffer, one after the other: two runs."""
    first = column_slices(1, 8, 4, 2, 0)
    second = column_slices(1, 8, 4, 2, 1, dst_offset=int(first[-1, 2]) + 8)
    table = np.concatenate([first, second])
    merged = fused_blocks.merged(table, 2)
    assert len(merged) == 2
    assert mapping(merged, 2) == mapping(table, 2)


# ----------------------------------------------------------------------------- the vLLM backend's ranks

@pytest.mark.parametrize("family, tp", [("llama", 2), ("qwen3_moe", 2), ("llama", 4)])
def test_row_parallel_slices_of_every_rank_are_written_bit_for_bit_in_whole_blocks(family, tp, monkeypatch):
    """The vLLM backend's in-process ranks (test_vllm_ranks): each rank's o_proj / down_proj
    (and the experts' w2) is a column slice of its transposed kernel. Through whole blocks the
    ranks hold the hand-cut slices at two versions, with fewer rows than one per view row."""
    import jax
    import jax.numpy as jnp

    from jax_amem._native import core
    from jax_amem.swapping import forget
    from jax_amem.vllm.trainer import VllmEngine
    import test_vllm_ranks as by_rank
    import vllm_models as vm

    monkeypatch.setenv("JAX_AMEM_SWAP_DIRECT", "1")
    trees = [vm.flax_tree(family, seed) for seed in (3, 4)]
    params = [jax.tree.map(jnp.asarray, t) for t in trees]

    def transpose_rows(merge) -> int:
        made = []
        real = core.copy.DirectCopy
        monkeypatch.setattr(core.copy, "DirectCopy", lambda *a: made.append(real(*a)) or made[-1])
        monkeypatch.setattr(fused_blocks, "merged", merge)
        forget()
        ranks = [by_rank.Rank(note) for note in by_rank.notes(family, "flax", params[0], tp=tp)]
        engine = VllmEngine(by_rank.Commits(ranks), ranks, params[0], family=family, source="flax", rules=None,
                            cast=None, timeout=60)
        for version, tree in enumerate(trees):
            engine.update(params[version])
            for rank in ranks:
                for name, tensor in rank.held.items():
                    assert np.array_equal(tensor.numpy(), by_rank.expected(tree, name, rank.note["tp_rank"], tp)), \
                        (version, rank.note["tp_rank"], name)
        monkeypatch.setattr(core.copy, "DirectCopy", real)
        return sum(copy.transpose_rows for copy in made)

    blocks = transpose_rows(fused_blocks.merged)
    strided = transpose_rows(lambda table, item: table)
    assert blocks < strided // 4, (blocks, strided)


def test_random_tables_map_the_same_elements_to_the_same_bytes():
    """Random rank slices, widths down to one element (a block of one source row: read as a cast),
    cut into random pieces and shuffled with whole rows and other buffers' rows."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        batch, cols = int(rng.integers(1, 4)), int(rng.integers(2, 9))
        parts = int(rng.choice([1, 2, 3, 4, 6]))
        rows = parts * int(rng.integers(1, 5))
        part = int(rng.integers(0, parts))
        table = column_slices(batch, rows, cols, parts, part, item=4)
        start = int(rng.integers(0, len(table)))
        table = table[start:start + int(rng.integers(1, len(table) + 1))]
        if rng.random() < 0.3:  # a whole-row run of another buffer after it
            extra = np.array([row(j * rows, rows, batch, rows, cols, 4 * rows * j, dst=1) for j in range(cols)],
                             np.int64)
            table = np.concatenate([table, extra])
        merged = fused_blocks.merged(table, 4)
        assert len(merged) <= len(table)
        assert mapping(merged, 4) == mapping(table, 4)
