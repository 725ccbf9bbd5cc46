"""Batched segment copy: many (src_index, dst_index, src_offset, dst_offset, bytes) runs between
arrays, one XLA custom call.

On CPU a loop of memcpy; on CUDA one kernel launch for all segments, on XLA's stream. Each
destination is written in place (it is aliased to its result), so donate it when calling from
`jax.jit` to avoid a copy of the whole buffer. `segment_copy`, between two arrays, is the case
of one buffer a side: its (src_offset, dst_offset, bytes) rows become rows of buffer 0 to 0, so
one row type, one validation and one kernel serve every copy.
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp

from . import _ffi, _jax_compat
from ._native import core
from .errors import CopyError

MAX_PIECE_BYTES = core.copy.MAX_PIECE_BYTES
MAX_BUFFERS_PER_SIDE = core.copy.MAX_BUFFERS_PER_SIDE
# Addresses user memory can have: below lies the null page and what Linux never maps, above
# no user-space address of x86-64 or AArch64 (src/copy/segments.h).
MIN_ADDRESS = core.copy.MIN_ADDRESS
ADDRESS_LIMIT = core.copy.ADDRESS_LIMIT
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


def _nbytes(x, what: str = "an operand") -> int:
    try:
        return int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
    except (AttributeError, TypeError) as error:
        raise CopyError(f"{what} is {type(x).__name__}, not an array ({error})") from None


def _arrays(values, what: str) -> list:
    """`values` as a list of arrays (anything with .shape and .dtype), refused otherwise."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise CopyError(f"{what} is {type(values).__name__}: give a list of arrays")
    values = list(values)
    for i, value in enumerate(values):
        _nbytes(value, f"{what}[{i}]")
    return values


def _integer_rows(segments, columns: str, widths: tuple[int, ...]) -> np.ndarray:
    """`segments` as an (n, width) int64 array, checked before anything reads it: rows of one
    of `widths` columns, integers only (floats would be truncated, wide ints wrapped)."""
    try:
        table = np.asarray(segments)
    except ValueError as error:  # rows of different lengths
        raise CopyError(f"segment rows must all have {' or '.join(map(str, widths))} columns "
                           f"{columns}: {error}") from None
    if table.size == 0:
        return np.zeros((0, widths[-1]), np.int64)
    if table.ndim != 2 or table.shape[1] not in widths:
        raise CopyError(f"segment rows must have {' or '.join(map(str, widths))} columns {columns}; "
                           f"got an array of shape {table.shape}")
    if table.dtype.kind not in "iu" or (table.dtype.kind == "u" and table.max() > _INT64_MAX):
        raise CopyError(f"segment rows must be integers that fit int64; got {table.dtype} values, "
                           f"such as row 0: {table[0].tolist()}. Round them on purpose (astype) if meant")
    return np.ascontiguousarray(table, dtype=np.int64)


def one_buffer_rows(segments) -> np.ndarray:
    """(src_offset, dst_offset, bytes) rows, checked for their width and integers, as (n, 6)
    rows from source 0 into destination 0."""
    table = _integer_rows(segments, "(src_offset, dst_offset, bytes)", (3,))
    rows = np.zeros((len(table), 6), np.int64)
    rows[:, 2:5] = table
    return rows


def prepare_segments(segments, src_bytes: int, dst_bytes: int,
                     max_piece: int = MAX_PIECE_BYTES) -> np.ndarray:
    """Validates a table of (src_offset, dst_offset, bytes) rows and splits long rows: as
    prepare_buffer_segments with one buffer a side, returned as (n, 3) rows.

    Raises CopyError (a ValueError) for rows that are not three integers, and naming the
    first row that is out of bounds, empty, or that overlaps another row's destination bytes.
    """
    rows = prepare_buffer_segments(one_buffer_rows(segments), [src_bytes], [dst_bytes], max_piece)
    return np.ascontiguousarray(rows[:, 2:5])


def segment_copy(src: jax.Array, dst: jax.Array, segments) -> jax.Array:
    """Returns `dst` with each segment's bytes replaced by the matching bytes of `src`.

    `segments` must be concrete (a numpy array or nested list of int rows), even
    inside `jax.jit`: it is validated on the host and baked into the program.
    Offsets are in bytes of the arrays' row-major storage. The call is segment_copy_many
    with one source and one destination.
    """
    return segment_copy_many([src], [dst], one_buffer_rows(segments))[0]


def _table_beside(dst, table: np.ndarray):
    """The segment table as an operand on the destination's device.

    Inside `jit` it becomes a constant of the program; called eagerly on a
    committed array, it must live on the same device as that array.
    """
    if _jax_compat.is_tracer(dst):
        return jnp.asarray(table)
    devices = dst.sharding.device_set
    if len(devices) != 1:
        raise CopyError(
            f"segment_copy works on single-device arrays; dst is sharded over {len(devices)} "
            "devices. Call it per shard inside jax.shard_map."
        )
    return jax.device_put(table, next(iter(devices)))


def prepare_buffer_segments(segments, src_bytes, dst_bytes,
                            max_piece: int = MAX_PIECE_BYTES) -> np.ndarray:
    """Validates rows (src_index, dst_index, src_offset, dst_offset, bytes[, 0]) between several
    buffers whose sizes are `src_bytes` and `dst_bytes` (lists) and splits long rows into pieces
    of at most `max_piece` bytes: (n, 6) int64 rows. CopyError (a ValueError) for rows that are
    not five or six integers, and naming the first row whose indices are out of range, that is
    out of bounds, empty, or that overlaps another row's destination bytes."""
    return _checked_by_core(core.copy.prepare_buffer_segments, _six_columns(segments),
                            _integers(src_bytes, "src_bytes"), _integers(dst_bytes, "dst_bytes"),
                            _integers([max_piece], "max_piece")[0])


def _checked_by_core(prepare, *args):
    """`prepare(*args)` of the native core, its refusals (a row out of bounds, empty or
    overlapping another's destination) raised as CopyError."""
    try:
        return prepare(*args)
    except (ValueError, TypeError) as error:  # TypeError: a size nanobind cannot hold in an int64
        raise CopyError(str(error)) from None


def _six_columns(segments) -> np.ndarray:
    """Rows (src_index, dst_index, src_offset, dst_offset, bytes[, 0]) as (n, 6) int64 rows,
    checked for their width and integers (a table of six columns passes as it is)."""
    table = _integer_rows(segments, "(src_index, dst_index, src_offset, dst_offset, bytes[, 0])", (5, 6))
    if table.shape[1] == 5:
        table = np.concatenate([table, np.zeros((len(table), 1), np.int64)], axis=1)
    return table


def segment_copy_many(srcs, dsts, segments) -> list:
    """Copies rows (src_index, dst_index, src_offset, dst_offset, bytes) between many arrays
    in one XLA custom call (one kernel launch on CUDA); returns the new destinations.

    Every destination is aliased to its result, so donating them writes in place.
    At most MAX_BUFFERS_PER_SIDE sources and destinations per call. `segments` must
    be concrete; it is validated against every buffer's size on the host.
    """
    _ffi.register_targets()
    srcs, dsts = _arrays(srcs, "srcs"), _arrays(dsts, "dsts")
    table = prepare_buffer_segments(segments, [_nbytes(s) for s in srcs], [_nbytes(d) for d in dsts])
    call = jax.ffi.ffi_call(
        _ffi.SEGMENT_COPY_MANY,
        [jax.ShapeDtypeStruct(d.shape, d.dtype) for d in dsts],
        input_output_aliases={1 + len(srcs) + i: i for i in range(len(dsts))},
    )
    anchor = dsts[0] if dsts else (srcs[0] if srcs else None)
    # int64 rows travel as uint32 pairs so that JAX without x64 keeps every bit.
    encoded = table.view(np.uint32)
    operand = _table_beside(anchor, encoded) if anchor is not None else jnp.asarray(encoded)
    return list(call(operand, *srcs, *dsts, sources=np.int64(len(srcs))))


# Rows at least this long run as one driver copy each (cuMemcpyAsync) on CUDA; shorter rows
# share one launch. Measured on the H200 (benchmarks/swap.py --bulk-mib): 64 rows of 4 MiB took
# 0.45 ms as one launch against 0.64 ms as 64 driver copies; 4 rows of 512 MiB 1.41 ms as driver
# copies against 1.61 ms as one launch. Rows in between are assumed to side with the launch.
BULK_BYTES = 64 << 20


def _integers(values, what: str) -> list[int]:
    """`values` (a sequence, an array, or one value) as Python ints that fit int64; floats, bools
    and anything else refused (CopyError), so that nothing is truncated or wrapped on its way to
    int64. Values past int64 are no address or size of this process's memory."""
    if isinstance(values, np.ndarray):
        values = values.reshape(-1).tolist()
    elif not isinstance(values, (list, tuple, range)):  # np.ndim would fail on ragged lists
        values = [values]
    out = []
    for i, value in enumerate(values):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise CopyError(f"{what}[{i}] is {value!r}: give integers")
        if not _INT64_MIN <= int(value) <= _INT64_MAX:
            raise CopyError(f"{what}[{i}] is {int(value):#x}, outside int64: it cannot be memory of this process")
        out.append(int(value))
    return out


def _checked_destinations(addresses: list[int], sizes: list[int]) -> None:
    """The destinations' one check (src/copy/segments.h, CheckDestinations): sizes not negative,
    each non-empty destination's address in [MIN_ADDRESS, ADDRESS_LIMIT). The custom calls
    (segment_copy_to_addresses, affine_copy_to_addresses) take what passed it as part of their
    program and do not check it again."""
    try:
        core.copy.check_destinations(np.array(addresses, np.int64), np.array(sizes, np.int64))
    except ValueError as error:
        raise CopyError(str(error)) from None


def _write_ends(rows: np.ndarray, count: int) -> np.ndarray:
    """Per destination, the end of the farthest byte its rows write (0: none)."""
    ends = np.zeros(count, np.int64)
    np.maximum.at(ends, rows[:, 1], rows[:, 3] + rows[:, 4])
    return ends


def _checked_alignment(srcs, addresses, rows: np.ndarray, alignment) -> None:
    """Each destination's address is a multiple of `alignment`; None: of the largest item size
    among the sources that write into it."""
    if alignment is None:
        itemsizes = np.array([np.dtype(s.dtype).itemsize for s in srcs], np.int64)
        needed = np.ones(len(addresses), np.int64)
        np.maximum.at(needed, rows[:, 1], itemsizes[rows[:, 0]])
    else:
        if isinstance(alignment, bool) or not isinstance(alignment, (int, np.integer)) or not 1 <= alignment < 2**63:
            raise CopyError(f"alignment must be a positive integer, got {alignment!r}")
        needed = np.full(len(addresses), int(alignment), np.int64)
    for d, address in enumerate(addresses):
        if address % int(needed[d]):
            raise CopyError(f"destination {d}: address {address:#x} is not a multiple of {int(needed[d])} "
                            "(the item size of the sources written into it; pass alignment= to say "
                            "otherwise)")


def _platform(srcs) -> str:
    """Where the call will run: the sources' platform; inside `jit` (tracers), JAX's default."""
    for source in srcs:
        sharding = getattr(source, "sharding", None)
        if sharding is not None and not _jax_compat.is_tracer(source):
            return next(iter(sharding.device_set)).platform
    return jax.default_backend()


def _bounded_by_allocations(addresses, ends: np.ndarray) -> None:
    """On CUDA: every destination's rows end inside the device memory that holds its address
    (its cudaMalloc allocation, or the mapped run of a virtual-memory reservation)."""
    for d, (address, end) in enumerate(zip(addresses, ends.tolist())):
        if end == 0:
            continue
        try:
            extent = core.cuda.extent_at(address, end)
        except RuntimeError as error:
            raise CopyError(f"destination {d} (address {address:#x}): {error}") from None
        if extent < end:
            raise CopyError(f"destination {d}: rows write {end} bytes from address {address:#x}, but "
                            f"its allocation ends {extent} bytes after that address: the rows or "
                            "destination_bytes are larger than the tensor's memory")


def address_rows(srcs, addresses, destination_bytes, segments, bulk_bytes: int | None = None,
                 alignment: int | None = None, platform: str | None = None) -> tuple:
    """What a copy into destinations given by address runs, every check of
    segment_copy_to_addresses done once (naming the input: CopyError for the destinations'
    addresses, sizes and alignment, and for rows): (addresses, destination sizes as lists
    of ints, bulk rows (n, 6) run as one driver copy each, the other rows (m, 6) split into
    pieces for one kernel launch). `srcs`: anything with `.shape` and `.dtype` (arrays,
    avals); `platform`: where the copy runs ("gpu": each destination is bounded by its device
    allocation too). The custom call and the direct launch of an eager swap
    (swapping/in_process/direct.py) both run these rows."""
    if not srcs:
        raise CopyError("segment_copy_to_addresses needs at least one source array")
    address_list = _integers(addresses, "addresses")
    size_list = _integers(destination_bytes, "destination_bytes")
    if len(address_list) != len(size_list):
        raise CopyError(f"{len(address_list)} addresses but {len(size_list)} destination sizes: give one of each")
    if len(srcs) > MAX_BUFFERS_PER_SIDE or len(address_list) > MAX_BUFFERS_PER_SIDE:
        raise CopyError(f"{len(srcs)} sources and {len(address_list)} destinations: at most "
                           f"{MAX_BUFFERS_PER_SIDE} of each per call; split the rows into several calls")
    _checked_destinations(address_list, size_list)
    rows = _six_columns(segments)
    # Validated once, as one table, then split: bulk rows whole, the others into pieces.
    bulk_bytes = BULK_BYTES if bulk_bytes is None else _integers([bulk_bytes], "bulk_bytes")[0]
    bulk, table = _checked_by_core(core.copy.prepare_address_rows, rows, [_nbytes(s) for s in srcs], size_list,
                                   bulk_bytes, MAX_PIECE_BYTES)
    _checked_alignment(srcs, address_list, rows, alignment)
    if platform == "gpu":
        _bounded_by_allocations(address_list, _write_ends(rows, len(address_list)))
    return address_list, size_list, bulk, table


def segment_copy_to_addresses(srcs, addresses, destination_bytes, segments,
                              bulk_bytes: int | None = None, alignment: int | None = None) -> jax.Array:
    """Copies rows (src_index, dst_index, src_offset, dst_offset, bytes) from the arrays `srcs`
    into memory XLA does not own: destination d is `destination_bytes[d]` bytes at address
    `addresses[d]` on the sources' device (a PyTorch tensor's `data_ptr()`, a buffer opened
    through CUDA IPC). One custom call; on CUDA one kernel launch for the short rows and one
    driver copy per row of at least `bulk_bytes` (None: BULK_BYTES, read at each call). Returns
    a token (a uint8 scalar whose value means nothing): the copy is done when the token is ready.

    Checked before anything runs, once (naming the input; CopyError, a ValueError, for addresses
    and sizes): addresses and sizes are integers that fit int64, sizes not negative, each address of a non-empty destination in
    [MIN_ADDRESS, ADDRESS_LIMIT) and a multiple of `alignment` (None: the largest item size of
    the sources written into it), the rows in bounds of the sizes given. On CUDA each
    destination's rows must also end inside the device memory that holds its address (asked
    of the driver once, when the call is traced or built, not at each run).
    What cannot be checked on the CPU: whether an address is memory of this process, and how
    far it extends. There, a wrong address or a size past the end of a buffer writes over other
    memory or kills the process; the caller answers for them. On CUDA, sub-allocated memory
    (PyTorch's caching allocator) is bounded by its block, not by the tensor. Inside `jit` the
    platform is JAX's default backend.

    The caller keeps the destination memory alive and unused by others until the token is
    ready. At most MAX_BUFFERS_PER_SIDE sources and destinations per call; `segments` must be
    concrete.
    """
    _ffi.register_targets()
    srcs = _arrays(srcs, "srcs")
    address_list, size_list, bulk, table = address_rows(srcs, addresses, destination_bytes, segments,
                                                        bulk_bytes, alignment, _platform(srcs) if srcs else None)
    # Not has_side_effect: an effect would keep every call of the jitted function off JAX's C++
    # dispatch path (5x the dispatch time for a few thousand operands). The token is what keeps
    # the call alive: return it from the jitted function (or use it) and wait for it.
    call = jax.ffi.ffi_call(_ffi.SEGMENT_COPY_TO_ADDRESSES, jax.ShapeDtypeStruct((), np.uint8))
    operand = _table_beside(srcs[0], table.view(np.uint32))
    return call(operand, *srcs, addresses=np.array(address_list, np.int64),
                destination_bytes=np.array(size_list, np.int64), bulk=bulk.reshape(-1))


__all__ = ["MAX_BUFFERS_PER_SIDE", "MAX_PIECE_BYTES", "prepare_buffer_segments", "prepare_segments", "segment_copy",
           "segment_copy_many", "segment_copy_to_addresses"]
