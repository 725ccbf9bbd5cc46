"""Copies through constant steps (jax_amem/reshard/affine.py), one XLA custom call.

An affine row copies `count` elements from a source array (read in its own dtype) into a
destination (written in its dtype), running a program of constant steps on each element on
the way: the copy kernel of src/copy/affine.h, on CUDA one launch for every row of a call
(beside the byte-copy rows of jax_amem.copy, which it leaves to those calls), on the CPU a
loop. Rows are (src_index, dst_index, src_element, dst_element, count, program), checked on
the host and split into pieces here; programs and their constants travel as one table.

    table = encode([Program(affine, "float32", "bfloat16", view_shape, perm, box_start)])
    out = affine_copy_many([src], [dst], rows, table)          # donated destinations
    token = affine_copy_to_addresses([src], [address], [nbytes], rows, table)
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

from . import _ffi
from .copy import (MAX_BUFFERS_PER_SIDE, _bounded_by_allocations, _checked_destinations, _integers, _nbytes,
                   _platform, _table_beside)
from .reshard.affine import MAX_STEPS, Affine

DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2, "float64": 3}
OP_CODES = {"mul": 0, "div": 1, "add": 2, "sub": 3, "rsub": 4}
PROGRAM_WORDS = 4 + 6 * MAX_STEPS     # copy::AffineProgram, int64 words
MAX_PIECE_ELEMENTS = 64 * 1024        # copy::kMaxPieceElements
ROW_COLUMNS = "(src_index, dst_index, src_element, dst_element, count, program)"


@dataclass(frozen=True)
class Program:
    """What one source view's rows run: `affine` from `src_dtype` to `dst_dtype`, on a view of
    shape `view_shape` (the shard transposed by `perm`) whose box on the source starts at
    `box_start` (vectors are looked up by source coordinate)."""
    affine: Affine
    src_dtype: str
    dst_dtype: str
    view_shape: tuple
    perm: tuple
    box_start: tuple


@dataclass(frozen=True)
class Table:
    """Programs and constants as the kernel reads them (uint32 words), and how many programs."""
    words: np.ndarray
    programs: int
    dtypes: tuple   # per program: (source dtype, destination dtype) names


def encode(programs) -> Table:
    words = np.zeros((len(programs), PROGRAM_WORDS), np.int64)
    constants: list[np.ndarray] = []
    used = 0
    for p, program in enumerate(programs):
        src, dst = np.dtype(program.src_dtype).name, np.dtype(program.dst_dtype).name
        affine = program.affine
        wide = affine.compute_dtype(src, dst) == np.float64
        words[p, :4] = (DTYPE_CODES[src], DTYPE_CODES[dst], int(wide), len(affine.steps))
        box_size = [0] * len(program.perm)
        for j, a in enumerate(program.perm):
            box_size[a] = program.view_shape[j]
        rounding = _roundings(affine, src, dst)
        for k, step in enumerate(affine.steps):
            values = step.table(program.box_start, box_size)
            if step.is_scalar:
                stride, extent = 0, 1
            else:
                axis = list(program.perm).index(step.axis)
                stride, extent = int(np.prod(program.view_shape[axis + 1:], dtype=np.int64)), len(values)
            words[p, 4 + 6 * k:10 + 6 * k] = (OP_CODES[step.op], DTYPE_CODES[step.dtype], used, stride, extent,
                                              rounding[k])
            constants.append(values)
            used += len(values)
    flat = np.concatenate(constants) if constants else np.zeros(0, np.float64)
    table = np.concatenate([words.reshape(-1).view(np.uint32), flat.astype(np.float64).view(np.uint32)])
    return Table(table, len(programs), tuple((np.dtype(p.src_dtype).name, np.dtype(p.dst_dtype).name)
                                             for p in programs))


# Which dtypes hold every value of which (a rounding into the larger is a no-op).
_HOLDS = {"float64": {"float64", "float32", "bfloat16", "float16"}, "float32": {"float32", "bfloat16", "float16"},
          "bfloat16": {"bfloat16"}, "float16": {"float16"}}
ROUND_INPUT, ROUND_RESULT = 1, 2   # copy::kRoundInput, kRoundResult


def _roundings(affine: Affine, src: str, dst: str) -> list[int]:
    """Per step, the roundings the kernel must run: its input's, unless the dtype before it is
    held exactly by the step's; its result's, unless it is the last step and the destination
    dtype is its own (the store rounds to it). Leaving out a no-op changes no bit."""
    out, before = [], src
    for k, step in enumerate(affine.steps):
        flags = 0 if before in _HOLDS[step.dtype] else ROUND_INPUT
        last = k == len(affine.steps) - 1
        if not (last and dst == step.dtype):
            flags |= ROUND_RESULT
        out.append(flags)
        before = step.dtype
    return out


def from_byte_rows(rows: np.ndarray, view_itemsize, program_of) -> np.ndarray:
    """Byte rows (src_index, dst_index, src_offset, dst_offset, bytes[, 0]) of plan views into
    affine rows: offsets in the view's bytes (`view_itemsize[src_index]` bytes per element,
    which the destination holds too) become element numbers, `program_of[src_index]` the
    program. ValueError when a row does not hold whole, aligned elements."""
    rows = np.asarray(rows, np.int64)
    if len(rows) == 0:
        return np.zeros((0, 6), np.int64)
    item = np.array([view_itemsize[i] for i in rows[:, 0].tolist()], np.int64)
    if ((rows[:, 2] % item) | (rows[:, 3] % item) | (rows[:, 4] % item)).any():
        bad = int(np.nonzero((rows[:, 2] % item) | (rows[:, 3] % item) | (rows[:, 4] % item))[0][0])
        raise ValueError(f"row {rows[bad, :5].tolist()} does not hold whole elements of {int(item[bad])} bytes "
                         "aligned in both buffers, which an affine row needs")
    return np.stack([rows[:, 0], rows[:, 1], rows[:, 2] // item, rows[:, 3] // item, rows[:, 4] // item,
                     np.array([program_of[i] for i in rows[:, 0].tolist()], np.int64)], axis=1)


def prepare_rows(rows, table: Table, src_elements, dst_elements, max_piece: int = MAX_PIECE_ELEMENTS) -> np.ndarray:
    """Checks affine rows (ValueError naming the first bad row: indices out of range, a count not
    positive, elements outside a buffer, a source or destination whose dtype is not the
    program's, two rows writing one element) and splits them into pieces of `max_piece`."""
    rows = np.asarray(rows)
    if rows.size == 0:
        return np.zeros((0, 6), np.int64)
    if rows.ndim != 2 or rows.shape[1] != 6 or rows.dtype.kind not in "iu":
        raise ValueError(f"affine rows are integer rows of six columns {ROW_COLUMNS}; got {rows.dtype} {rows.shape}")
    rows = rows.astype(np.int64)
    src_elements, dst_elements = np.asarray(src_elements, np.int64), np.asarray(dst_elements, np.int64)
    s, d, a, b, n, p = rows.T
    bad = ((s < 0) | (s >= len(src_elements)) | (d < 0) | (d >= len(dst_elements)) | (p < 0)
           | (p >= table.programs) | (n <= 0) | (a < 0) | (b < 0))
    if not bad.any():
        bad = (a > src_elements[s] - n) | (b > dst_elements[d] - n)
    if bad.any():
        i = int(np.nonzero(bad)[0][0])
        raise ValueError(f"affine row {i} {rows[i].tolist()} {ROW_COLUMNS}: an index out of range, no elements, or "
                         f"elements outside its buffers ({len(src_elements)} sources, {len(dst_elements)} "
                         f"destinations, {table.programs} programs)")
    order = np.lexsort((b, d))
    overlap = (d[order][1:] == d[order][:-1]) & (b[order][1:] < b[order][:-1] + n[order][:-1])
    if overlap.any():
        i, j = int(order[np.nonzero(overlap)[0][0]]), int(order[np.nonzero(overlap)[0][0] + 1])
        raise ValueError(f"affine rows {i} and {j} write the same elements of destination {int(d[i])}")
    pieces = np.maximum(1, -(-n // max_piece))
    which = np.repeat(np.arange(len(rows)), pieces)
    k = np.arange(len(which)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    out = rows[which].copy()
    out[:, 2] += k * max_piece
    out[:, 3] += k * max_piece
    out[:, 4] = np.minimum(max_piece, n[which] - k * max_piece)
    return out


def _checked_dtypes(srcs, dst_dtypes, rows: np.ndarray, table: Table) -> None:
    for i, (s, d, p) in enumerate(rows[:, [0, 1, 5]].tolist()):
        src, dst = table.dtypes[p]
        if np.dtype(srcs[s].dtype).name != src or (dst_dtypes[d] is not None and np.dtype(dst_dtypes[d]).name != dst):
            raise ValueError(f"affine row {i}: program {p} reads {src} and writes {dst}, but source {s} is "
                             f"{np.dtype(srcs[s].dtype).name} and destination {d} is {dst_dtypes[d]}")


def affine_copy_many(srcs, dsts, rows, table: Table) -> list:
    """`dsts` with each affine row written (every destination aliased to its result: donate
    them to write in place). Rows are checked and split here; at most MAX_BUFFERS_PER_SIDE
    buffers a side."""
    _ffi.register_targets()
    srcs, dsts = list(srcs), list(dsts)
    if len(srcs) > MAX_BUFFERS_PER_SIDE or len(dsts) > MAX_BUFFERS_PER_SIDE:
        raise ValueError(f"at most {MAX_BUFFERS_PER_SIDE} sources and destinations per affine copy")
    raw = np.asarray(rows, np.int64).reshape(-1, 6)
    _checked_dtypes(srcs, [d.dtype for d in dsts], raw, table)
    split = prepare_rows(raw, table, [_nbytes(s) // np.dtype(s.dtype).itemsize for s in srcs],
                         [_nbytes(d) // np.dtype(d.dtype).itemsize for d in dsts])
    call = jax.ffi.ffi_call(_ffi.AFFINE_COPY_MANY, [jax.ShapeDtypeStruct(d.shape, d.dtype) for d in dsts],
                            input_output_aliases={2 + len(srcs) + i: i for i in range(len(dsts))})
    anchor = dsts[0] if dsts else srcs[0]
    return list(call(_table_beside(anchor, split.view(np.uint32)), _table_beside(anchor, table.words), *srcs, *dsts,
                     sources=np.int64(len(srcs)), programs=np.int64(table.programs)))


def address_affine_rows(srcs, addresses, destination_bytes, rows, table: Table, dst_dtypes=None,
                        platform: str | None = None) -> tuple:
    """What a copy of affine rows into destinations given by address runs, every check of
    affine_copy_to_addresses done once (ValueError naming the input): (addresses, destination
    sizes as lists of ints, the rows split into pieces). `srcs`: anything with `.shape` and
    `.dtype` (arrays, avals); `platform`: where the copy runs ("gpu": each destination is
    bounded by its device allocation too). The custom call and the direct launch of an eager
    swap (swapping/in_process/direct.py) both run these rows."""
    srcs = list(srcs)
    address_list = _integers(addresses, "addresses")
    size_list = _integers(destination_bytes, "destination_bytes")
    if not srcs or len(address_list) != len(size_list):
        raise ValueError("affine_copy_to_addresses needs sources and one size per address")
    if len(srcs) > MAX_BUFFERS_PER_SIDE or len(address_list) > MAX_BUFFERS_PER_SIDE:
        raise ValueError(f"at most {MAX_BUFFERS_PER_SIDE} sources and destinations per affine copy")
    _checked_destinations(address_list, size_list)
    raw = np.asarray(rows, np.int64).reshape(-1, 6)
    dst_dtypes = [None] * len(address_list) if dst_dtypes is None else list(dst_dtypes)
    _checked_dtypes(srcs, dst_dtypes, raw, table)
    # A destination's element size: its programs' output dtype (one per destination).
    itemsize = [1] * len(address_list)
    for d, p in raw[:, [1, 5]].tolist():
        itemsize[d] = np.dtype(table.dtypes[p][1]).itemsize
    for d, (address, item) in enumerate(zip(address_list, itemsize)):
        if address % item:
            raise ValueError(f"destination {d}: address {address:#x} is not a multiple of its item size {item}")
    split = prepare_rows(raw, table, [_nbytes(s) // np.dtype(s.dtype).itemsize for s in srcs],
                         [b // i for b, i in zip(size_list, itemsize)])
    if platform == "gpu":
        ends = np.zeros(len(address_list), np.int64)
        np.maximum.at(ends, split[:, 1], (split[:, 3] + split[:, 4]) * np.array(itemsize, np.int64)[split[:, 1]])
        _bounded_by_allocations(address_list, ends)
    return address_list, size_list, split


def affine_copy_to_addresses(srcs, addresses, destination_bytes, rows, table: Table, dst_dtypes=None):
    """As jax_amem.copy.segment_copy_to_addresses for affine rows: destination d is
    `destination_bytes[d]` bytes at `addresses[d]` (`dst_dtypes[d]` its dtype, checked against
    the programs when given). Returns a token; the same contract on the addresses."""
    _ffi.register_targets()
    srcs = list(srcs)
    address_list, size_list, split = address_affine_rows(srcs, addresses, destination_bytes, rows, table, dst_dtypes,
                                                         _platform(srcs) if srcs else None)
    call = jax.ffi.ffi_call(_ffi.AFFINE_COPY_TO_ADDRESSES, jax.ShapeDtypeStruct((), np.uint8))
    return call(_table_beside(srcs[0], split.view(np.uint32)), _table_beside(srcs[0], table.words), *srcs,
                addresses=np.array(address_list, np.int64), destination_bytes=np.array(size_list, np.int64),
                programs=np.int64(table.programs))
