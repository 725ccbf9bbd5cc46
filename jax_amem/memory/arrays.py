"""Offload of jax.Array buffers to the staging pool, and their reload into new arrays.

JAX arrays are immutable and own their buffers, so a paused array cannot come
back as the same object: pause copies each distinct shard to host memory and
the caller deletes the array; resume allocates a new array with the same
shape, dtype, sharding, layout, committedness and weak type, and copies the
bytes back into its buffers. Replicated shards are stored once and written to
every device that holds them. Typed PRNG keys travel as their key data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Any, Sequence

import numpy as np
import jax
import jax.numpy as jnp

from .. import _jax_compat
from .._native import core

HOST_DEVICE = -1  # the C++ side's ordinal for XLA CPU buffers (a plain memcpy)


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """What resume needs to allocate an array like the one that was paused."""

    shape: tuple[int, ...]
    dtype: Any                 # the physical dtype (uint32 key data for PRNG keys)
    format: Any                # jax Format: layout and sharding
    committed: bool
    weak_type: bool
    key_impl: Any              # the PRNG implementation for typed keys, else None
    device_bytes: int          # bytes on the devices, every replica counted
    bytes_by_ordinal: tuple = ()  # ((device ordinal, bytes), ...): what deleting it frees where

    @property
    def alloc_key(self) -> tuple:
        return (self.shape, np.dtype(self.dtype), self.format, self.weak_type)


@dataclasses.dataclass(frozen=True)
class Offloaded:
    """One kept array in the staging pool: host address and size per distinct shard."""

    spec: ArraySpec
    shards: dict  # index key -> (host address, bytes)

    @property
    def host_bytes(self) -> int:
        return sum(nbytes for _, nbytes in self.shards.values())


def is_key_array(x: jax.Array) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended)


def physical(x: jax.Array) -> jax.Array:
    """The array whose buffers hold x's bytes (key data for typed PRNG keys)."""
    return jax.random.key_data(x) if is_key_array(x) else x


def device_ordinal(device) -> int:
    """The driver's ordinal for a GPU device, HOST_DEVICE for an XLA CPU device."""
    return HOST_DEVICE if device.platform == "cpu" else device.local_hardware_id


def index_key(index) -> tuple:
    """A hashable form of a shard's index (a tuple of slices)."""
    return tuple((s.start, s.stop, s.step) for s in index)


@functools.lru_cache(maxsize=None)
def _bits(dtype) -> int:
    return jax.dtypes.itemsize_bits(dtype)  # slow (ml_dtypes' finfo): once per dtype


def buffer_bytes(data: jax.Array) -> int:
    """Bytes of one single-device buffer.

    Sub-byte types (int4, float4, ...) are stored packed, two or more to a
    byte, while on_device_size_in_bytes() counts one byte each (measured on
    XLA CPU: 16 int4 values in 8 bytes, reported as 16); copying the reported
    size would run past the buffer.
    """
    bits = _bits(data.dtype)
    if bits < 8:
        return (int(np.prod(data.shape, dtype=np.int64)) * bits + 7) // 8
    return data.on_device_size_in_bytes()


def _buffer(shard) -> tuple[int, int]:
    nbytes = buffer_bytes(shard.data)
    return (shard.data.unsafe_buffer_pointer() if nbytes else 0), nbytes


def describe(x: jax.Array, data: jax.Array, shards=None) -> ArraySpec:
    """x's spec; `data` is physical(x), `shards` its addressable shards when already read."""
    by_ordinal: dict[int, int] = {}
    for s in (data.addressable_shards if shards is None else shards):
        ordinal = device_ordinal(s.device)
        by_ordinal[ordinal] = by_ordinal.get(ordinal, 0) + buffer_bytes(s.data)
    return ArraySpec(tuple(data.shape), data.dtype, data.format, bool(x.committed),
                     bool(data.aval.weak_type), jax.random.key_impl(x) if is_key_array(x) else None,
                     sum(by_ordinal.values()), tuple(sorted(by_ordinal.items())))


def _distinct_shards(datas) -> tuple[list, list]:
    """([(array number, index key, shard)] one per distinct index, [shards per array])."""
    chosen, every = [], []
    for number, data in enumerate(datas):
        shards = data.addressable_shards
        every.append(shards)
        seen = set()
        for shard in shards:
            key = index_key(shard.index)
            if key not in seen:
                seen.add(key)
                chosen.append((number, key, shard))
    return chosen, every


def staging_sizes(arrays: Sequence[jax.Array]) -> list[int]:
    """The host bytes offload() will place for `arrays`, in its order (what reserve() asks for)."""
    chosen, _ = _distinct_shards([physical(x) for x in arrays])
    return [buffer_bytes(shard.data) for _, _, shard in chosen]


@dataclasses.dataclass(frozen=True)
class OffloadTimes:
    staging_seconds: float   # placing the shards in the pool, growing it included
    allocate_seconds: float  # of which making new host blocks (0 when the pool was reserved)
    copy_seconds: float      # the device -> host copies


def offload(arrays: Sequence[jax.Array], pool) -> tuple[list[Offloaded], OffloadTimes]:
    """Copies every distinct shard of each array into `pool`; the arrays stay intact.

    Waits for XLA's work on the arrays first. The copies start as soon as the
    shards are placed; the arrays' specs are read while they run. On error the
    pool's placements are returned and nothing else has changed.
    """
    datas = jax.block_until_ready([physical(x) for x in arrays])
    chosen, every = _distinct_shards(datas)
    buffers = [_buffer(shard) for _, _, shard in chosen]
    grown_before = pool.stats()["grow_seconds"]
    start = time.perf_counter()
    addresses = pool.place([nbytes for _, nbytes in buffers])
    placed = time.perf_counter()
    allocate_seconds = pool.stats()["grow_seconds"] - grown_before
    table = [(device_ordinal(shard.device), pointer, address, nbytes)
             for (_, _, shard), (pointer, nbytes), address in zip(chosen, buffers, addresses)]
    try:
        started = core.memory.start_copy_to_host(np.array(table, dtype=np.int64).reshape(-1, 4))
        try:
            specs = [describe(x, data, shards) for x, data, shards in zip(arrays, datas, every)]
        finally:
            core.memory.wait_copies(started)
    except BaseException:
        pool.release_all()
        raise
    times = OffloadTimes(placed - start, allocate_seconds, time.perf_counter() - placed)
    shards = [{} for _ in arrays]
    for (number, key, _), (_, nbytes), address in zip(chosen, buffers, addresses):
        shards[number][key] = (address, nbytes)
    return [Offloaded(spec, s) for spec, s in zip(specs, shards)], times


def _zeros(shape, dtype, weak_type: bool):
    zeros = jnp.zeros(shape, dtype)
    if weak_type:
        # Weak types change promotion (a weak f32 scalar times bf16 stays bf16),
        # so they must come back for training to continue bit-identically.
        zeros = _jax_compat.weak_typed(zeros, dtype)
    return zeros


@functools.lru_cache(maxsize=32)
def _allocator_committed(keys: tuple):
    """One jitted program that allocates all committed arrays of a resume (compiled once)."""
    formats = tuple(fmt for _, _, fmt, _ in keys)
    return jax.jit(lambda: tuple(_zeros(s, d, w) for s, d, _, w in keys), out_shardings=formats)


@functools.lru_cache(maxsize=32)
def _allocator_uncommitted(keys: tuple):
    return jax.jit(lambda: tuple(_zeros(s, d, w) for s, d, _, w in keys))


def _device_group(sharding) -> tuple:
    """The sharding's devices in its own order (what jit compares across outputs)."""
    assignment = _jax_compat.device_assignment(sharding)
    return assignment if assignment is not None else tuple(sorted(sharding.device_set, key=lambda d: d.id))


def _programs(specs: Sequence[ArraySpec]):
    """(numbers, jitted function, default device or None) per program allocate() runs.

    One program per group: a jitted program's outputs must share one device
    assignment, and uncommitted arrays come back uncommitted on their device
    (so they run under jax.default_device).
    """
    groups: dict = {}
    for i, s in enumerate(specs):
        groups.setdefault((s.committed, _device_group(s.format.sharding)), []).append(i)
    for (committed, devices), numbers in groups.items():
        keys = tuple(specs[i].alloc_key for i in numbers)
        if committed:
            yield numbers, _allocator_committed(keys), None
        else:
            yield numbers, _allocator_uncommitted(keys), devices[0]


def _on(device):
    return contextlib.nullcontext() if device is None else jax.default_device(device)


def prepare_allocation(specs: Sequence[ArraySpec]) -> None:
    """Compiles allocate()'s programs ahead, allocating nothing (reserve() does this, so the
    first resume does not compile: a program of a few hundred outputs compiles for seconds)."""
    for _, function, device in _programs(specs):
        with _on(device):
            function.lower().compile()


def allocate(specs: Sequence[ArraySpec]) -> list[jax.Array]:
    """Zero-filled arrays like `specs` (physical dtype), ready (their buffers written)."""
    out: list[jax.Array | None] = [None] * len(specs)
    made = []
    try:
        for numbers, function, device in _programs(specs):
            with _on(device):
                arrays = function()
            made.extend(arrays)
            for i, a in zip(numbers, arrays):
                out[i] = a
        return jax.block_until_ready(out)
    except Exception:
        for a in made:
            a.delete()
        raise


# Arrays per batch of reload copies: the first copies start while later arrays are read.
RELOAD_BATCH = 64


def reload(offloaded: Sequence[Offloaded], targets: Sequence[jax.Array]) -> None:
    """Copies each offloaded array's bytes into every addressable shard of its target."""
    started: set[int] = set()
    try:
        for first in range(0, len(offloaded), RELOAD_BATCH):
            table = []
            for item, target in zip(offloaded[first:first + RELOAD_BATCH],
                                    targets[first:first + RELOAD_BATCH]):
                for shard in target.addressable_shards:
                    address, nbytes = item.shards[index_key(shard.index)]
                    pointer, target_bytes = _buffer(shard)
                    if target_bytes != nbytes:
                        raise RuntimeError(
                            f"a restored shard holds {target_bytes} bytes where {nbytes} were "
                            f"saved (array of shape {item.spec.shape}, {item.spec.dtype}); its "
                            "layout changed")
                    table.append((device_ordinal(shard.device), pointer, address, nbytes))
            started.update(core.memory.start_copy_to_device(
                np.array(table, dtype=np.int64).reshape(-1, 4)))
    finally:
        core.memory.wait_copies(sorted(started))  # no copy may run on after we return


def finish(spec: ArraySpec, data: jax.Array) -> jax.Array:
    """The user-facing array from its physical data (re-wraps typed PRNG keys)."""
    if spec.key_impl is None:
        return data
    return jax.random.wrap_key_data(data, impl=spec.key_impl)
