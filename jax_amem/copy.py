"""Batched segment copy: many (src_offset, dst_offset, bytes) runs, one XLA custom call.

On CPU a loop of memcpy; on CUDA one kernel launch for all segments, on XLA's
stream. The destination is written in place (it is aliased to the result), so
donate it when calling from `jax.jit` to avoid a copy of the whole buffer.
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp

from . import _ffi
from ._native import core

MAX_PIECE_BYTES = core.copy.MAX_PIECE_BYTES
MAX_BUFFERS_PER_SIDE = core.copy.MAX_BUFFERS_PER_SIDE


def _nbytes(x) -> int:
    return int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize


def prepare_segments(segments, src_bytes: int, dst_bytes: int,
                     max_piece: int = MAX_PIECE_BYTES) -> np.ndarray:
    """Validates a table of (src_offset, dst_offset, bytes) rows and splits long rows.

    Raises ValueError naming the first row that is out of bounds, empty, or that
    overlaps another row's destination bytes.
    """
    table = np.ascontiguousarray(np.asarray(segments, dtype=np.int64).reshape(-1, 3))
    return core.copy.prepare_segments(table, int(src_bytes), int(dst_bytes), int(max_piece))


def segment_copy(src: jax.Array, dst: jax.Array, segments) -> jax.Array:
    """Returns `dst` with each segment's bytes replaced by the matching bytes of `src`.

    `segments` must be concrete (a numpy array or nested list of int rows), even
    inside `jax.jit`: it is validated on the host and baked into the program.
    Offsets are in bytes of the arrays' row-major storage.
    """
    _ffi.register_targets()
    table = prepare_segments(segments, _nbytes(src), _nbytes(dst))
    call = jax.ffi.ffi_call(
        _ffi.SEGMENT_COPY,
        jax.ShapeDtypeStruct(dst.shape, dst.dtype),
        input_output_aliases={1: 0},
    )
    # int64 rows travel as uint32 pairs so that JAX without x64 keeps every bit.
    return call(src, dst, _table_beside(dst, table.view(np.uint32)))


def _table_beside(dst, table: np.ndarray):
    """The segment table as an operand on the destination's device.

    Inside `jit` it becomes a constant of the program; called eagerly on a
    committed array, it must live on the same device as that array.
    """
    if isinstance(dst, jax.core.Tracer):
        return jnp.asarray(table)
    devices = dst.sharding.device_set
    if len(devices) != 1:
        raise ValueError(
            f"segment_copy works on single-device arrays; dst is sharded over {len(devices)} "
            "devices. Call it per shard inside jax.shard_map."
        )
    return jax.device_put(table, next(iter(devices)))


def prepare_buffer_segments(segments, src_bytes, dst_bytes,
                            max_piece: int = MAX_PIECE_BYTES) -> np.ndarray:
    """As prepare_segments, for rows (src_index, dst_index, src_offset, dst_offset, bytes[, 0])
    between several buffers whose sizes are `src_bytes` and `dst_bytes` (lists)."""
    table = np.asarray(segments, dtype=np.int64)
    if table.ndim == 2 and table.shape[1] == 5:
        table = np.concatenate([table, np.zeros((len(table), 1), np.int64)], axis=1)
    table = np.ascontiguousarray(table.reshape(-1, 6))
    return core.copy.prepare_buffer_segments(table, [int(b) for b in src_bytes],
                                             [int(b) for b in dst_bytes], int(max_piece))


def segment_copy_many(srcs, dsts, segments) -> list:
    """Copies rows (src_index, dst_index, src_offset, dst_offset, bytes) between many arrays
    in one XLA custom call (one kernel launch on CUDA); returns the new destinations.

    Every destination is aliased to its result, so donating them writes in place.
    At most MAX_BUFFERS_PER_SIDE sources and destinations per call. `segments` must
    be concrete; it is validated against every buffer's size on the host.
    """
    _ffi.register_targets()
    srcs, dsts = list(srcs), list(dsts)
    table = prepare_buffer_segments(segments, [_nbytes(s) for s in srcs], [_nbytes(d) for d in dsts])
    call = jax.ffi.ffi_call(
        _ffi.SEGMENT_COPY_MANY,
        [jax.ShapeDtypeStruct(d.shape, d.dtype) for d in dsts],
        input_output_aliases={1 + len(srcs) + i: i for i in range(len(dsts))},
    )
    anchor = dsts[0] if dsts else (srcs[0] if srcs else None)
    encoded = table.view(np.uint32)
    operand = _table_beside(anchor, encoded) if anchor is not None else jnp.asarray(encoded)
    return list(call(operand, *srcs, *dsts, sources=np.int64(len(srcs))))


# Rows at least this long run as one driver copy each (cuMemcpyAsync) on CUDA; shorter rows
# share one launch. Measured on the H200 (benchmarks/swap.py --bulk-mib): 64 rows of 4 MiB took
# 0.45 ms as one launch against 0.64 ms as 64 driver copies; 4 rows of 512 MiB 1.41 ms as driver
# copies against 1.61 ms as one launch. Rows in between are assumed to side with the launch.
BULK_BYTES = 64 << 20
_WHOLE = 1 << 62  # a piece size no row reaches: validate without splitting


def split_bulk(rows: np.ndarray, bulk_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(bulk rows, other rows) of a validated (n, 6) table: the split the CUDA handler runs."""
    long = rows[:, 4] >= bulk_bytes
    return np.ascontiguousarray(rows[long]), np.ascontiguousarray(rows[~long])


def segment_copy_to_addresses(srcs, addresses, destination_bytes, segments,
                              bulk_bytes: int | None = None) -> jax.Array:
    """Copies rows (src_index, dst_index, src_offset, dst_offset, bytes) from the arrays `srcs`
    into memory XLA does not own: destination d is `destination_bytes[d]` bytes at address
    `addresses[d]` on the sources' device (a PyTorch tensor's `data_ptr()`, a buffer opened
    through CUDA IPC). One custom call; on CUDA one kernel launch for the short rows and one
    driver copy per row of at least `bulk_bytes` (None: BULK_BYTES, read at each call). Returns a token (a uint8 scalar whose value
    means nothing): the copy is done when the token is ready.

    The caller keeps the destination memory alive and unused by others until then; nothing
    here can check an address, only the sizes it is given. At most MAX_BUFFERS_PER_SIDE
    sources and destinations per call; `segments` must be concrete.
    """
    _ffi.register_targets()
    srcs = list(srcs)
    if not srcs:
        raise ValueError("segment_copy_to_addresses needs at least one source array")
    addresses = np.asarray(addresses, dtype=np.int64).reshape(-1)
    sizes = np.asarray(destination_bytes, dtype=np.int64).reshape(-1)
    if len(addresses) != len(sizes):
        raise ValueError(f"{len(addresses)} addresses but {len(sizes)} destination sizes: give one of each")
    if len(srcs) > MAX_BUFFERS_PER_SIDE or len(addresses) > MAX_BUFFERS_PER_SIDE:
        raise ValueError(f"{len(srcs)} sources and {len(addresses)} destinations: at most "
                         f"{MAX_BUFFERS_PER_SIDE} of each per call; split the rows into several calls")
    src_bytes = [_nbytes(s) for s in srcs]
    rows = prepare_buffer_segments(segments, src_bytes, sizes.tolist(), max_piece=_WHOLE)
    bulk, short = split_bulk(rows, int(BULK_BYTES if bulk_bytes is None else bulk_bytes))
    table = prepare_buffer_segments(short, src_bytes, sizes.tolist())
    # Not has_side_effect: an effect would keep every call of the jitted function off JAX's C++
    # dispatch path (5x the dispatch time for a few thousand operands). The token is what keeps
    # the call alive: return it from the jitted function (or use it) and wait for it.
    call = jax.ffi.ffi_call(_ffi.SEGMENT_COPY_TO_ADDRESSES, jax.ShapeDtypeStruct((), np.uint8))
    operand = _table_beside(srcs[0], table.view(np.uint32))
    return call(operand, *srcs, addresses=addresses, destination_bytes=sizes, bulk=bulk.reshape(-1))
