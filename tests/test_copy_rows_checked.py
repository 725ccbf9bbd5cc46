"""Row tables are checked before anything reads them: integers only (floats were
truncated), the row width first (five columns were reshaped into threes, and the error named a
row the user never wrote); and a plan of a tensor whose byte size overflows int64 is refused."""

import numpy as np
import pytest

import jax.numpy as jnp

import jax_amem.copy
from jax_amem.copy import prepare_buffer_segments, prepare_segments, segment_copy_many
from jax_amem.reshard import Layout, LayoutError


@pytest.mark.parametrize("rows", [[(4.7, 0, 8.9)], np.array([[4.0, 0.0, 8.0]])])
def test_segment_copy_refuses_rows_that_are_not_integers(rows):
    src, dst = jnp.arange(32, dtype=jnp.uint8), jnp.full(32, 7, jnp.uint8)
    with pytest.raises(ValueError, match="segment rows must be integers"):
        jax_amem.copy.segment_copy(src, dst, rows)
    np.testing.assert_array_equal(np.asarray(dst), np.full(32, 7))


def test_many_buffer_rows_that_are_not_integers_are_refused():
    with pytest.raises(ValueError, match="segment rows must be integers"):
        segment_copy_many([jnp.zeros(16, jnp.uint8)], [jnp.zeros(16, jnp.uint8)], [(0, 0, 0.5, 0, 4)])
    with pytest.raises(ValueError, match="must be integers that fit int64"):
        prepare_buffer_segments(np.array([[0, 0, 0, 0, 2**63]], np.uint64), [16], [16])


def test_five_columns_for_segment_copy_are_refused_by_width_not_by_a_row_never_written():
    rows = [(0, 0, 0, 0, 4), (0, 0, 4, 4, 4), (0, 0, 8, 8, 4)]  # 15 numbers: once read as 5 rows of 3
    with pytest.raises(ValueError, match=r"rows must have 3 columns .* shape \(3, 5\)") as refused:
        prepare_segments(rows, 64, 64)
    assert "segment 3" not in str(refused.value) and "segment 4" not in str(refused.value)


def test_three_columns_for_a_many_buffer_copy_are_refused_not_regrouped_into_sixes():
    rows = [(0, 0, 4)] * 6  # 18 numbers: once silently read as 3 rows of 6
    with pytest.raises(ValueError, match=r"rows must have 5 or 6 columns .* shape \(6, 3\)"):
        prepare_buffer_segments(rows, [64], [64])


def test_ragged_rows_are_refused_with_the_width():
    with pytest.raises(ValueError, match="must all have 3 columns"):
        prepare_segments([(0, 0, 4), (4, 4)], 64, 64)


def test_empty_tables_still_mean_no_rows():
    assert prepare_segments([], 8, 8).shape == (0, 3)
    assert prepare_buffer_segments(np.zeros((0, 5), np.int64), [8], [8]).shape == (0, 6)


def test_plan_of_a_tensor_whose_bytes_overflow_int64_is_refused():
    owners = [(0, 0)]
    huge = {"w": Layout.replicated((2**61, 8), np.float32, owners)}  # 2^66 bytes
    with pytest.raises(LayoutError, match=r"tensor 'w' of shape \(2305843009213693952, 8\) .* more bytes than int64"):
        jax_amem.reshard.plan(huge, huge)
    fits = {"w": Layout.replicated((2**40, 8), np.float32, owners)}
    assert jax_amem.reshard.plan(fits, fits).transfers[0, -1] == 2**45
