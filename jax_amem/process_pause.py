"""Whole-process pause: NCCL communicators, tagged arrays and the allocator's pool.

    info = jax_amem.pause(keep=state, drop=cache)   # state -> host, both deleted, pool trimmed
    ...                                              # another framework uses the GPU
    restored = jax_amem.resume()                     # restored.keep, restored.drop: new arrays

    with jax_amem.paused(keep=state, drop=cache) as p:
        ...
    state, cache = p.keep, p.drop

    jax_amem.reserve(keep=state)                     # ahead, in the background: the first
                                                     # pause then pins nothing

Why new arrays: a jax.Array owns its buffer and cannot be re-pointed at new
memory, so pause deletes the arrays it was given (any later use raises JAX's
own "Array has been deleted" error, never reads freed memory) and resume returns
new arrays of the same structure, shapes, dtypes and shardings. Kept arrays come
back bit-identical; dropped arrays come back zero-filled (see docs/pause.md).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from typing import Any

import jax

from . import _jax_compat
from ._native import core
from .errors import PauseError
from .memory import allocator, arrays as array_io, release as releasing, staging
from .pause_block import PausedBlock
from .reshard.from_jax import unflattenable


@dataclasses.dataclass(frozen=True)
class PauseInfo:
    """What a pause did, returned by `pause()`."""

    arrays_kept: int
    arrays_dropped: int
    bytes_kept: int          # device bytes of the kept arrays (every replica)
    bytes_offloaded: int     # bytes copied to host (one copy per distinct shard)
    bytes_dropped: int       # device bytes of the dropped arrays
    offload_seconds: float   # staging + the device -> host copies
    seconds: float           # the whole pause
    pool_returned: bool      # the allocator's idle memory went back to the driver
    pool_note: str           # why not, and how to fix it, when it did not
    nccl_paused: bool
    device_free_before: dict  # CUDA ordinal -> free bytes (cuMemGetInfo); empty without GPU
    device_free_after: dict
    staging_seconds: float = 0.0   # placing the kept shards in the pinned pool (growth included)
    allocate_seconds: float = 0.0  # of which making new pinned blocks: 0 after reserve()
    copy_seconds: float = 0.0      # the device -> host copies alone
    release_seconds: float = 0.0   # delete, return the pool to the driver, check, collect if needed
    collections: int = 0           # gc.collect() calls this pause needed (0 unless a buffer was
                                   # still referenced outside its array, e.g. a DLPack view)

    @property
    def bytes_freed(self) -> int:
        """Device bytes the driver had free after the pause minus before (all local GPUs)."""
        return sum(self.device_free_after[o] - self.device_free_before[o]
                   for o in self.device_free_after)

    @property
    def offload_gb_per_s(self) -> float:
        return self.bytes_offloaded / self.offload_seconds / 1e9 if self.offload_seconds else 0.0


@dataclasses.dataclass(frozen=True)
class Restored:
    """What `resume()` returns: new arrays in the structure of `keep` and `drop`."""

    keep: Any
    drop: Any
    bytes_reloaded: int
    reload_seconds: float
    seconds: float
    nccl_resumed: bool
    allocate_seconds: float = 0.0  # the new device arrays (one jitted program per device group)

    @property
    def reload_gb_per_s(self) -> float:
        return self.bytes_reloaded / self.reload_seconds / 1e9 if self.reload_seconds else 0.0


@dataclasses.dataclass
class _PausedState:
    keep_tree: Any            # treedef of `keep`, leaves numbered into `kept`
    keep_slots: list          # leaf position -> number in `kept` (repeats share one)
    drop_tree: Any
    drop_slots: list
    kept: list                # Offloaded per distinct kept array
    dropped: list             # ArraySpec per distinct dropped array
    nccl: Any                 # the jax_amem.nccl module when it was paused, else None
    info: PauseInfo


_lock = threading.RLock()
_state: _PausedState | None = None


def is_paused() -> bool:
    return _state is not None


def current_pause() -> PauseInfo | None:
    """The running pause's info, or None."""
    state = _state
    return state.info if state is not None else None


def paused_bytes() -> dict:
    """{'kept_host': bytes in host memory, 'dropped': device bytes dropped}, zeros when not paused."""
    state = _state
    if state is None:
        return {"kept_host": 0, "dropped": 0}
    return {"kept_host": sum(o.host_bytes for o in state.kept),
            "dropped": sum(s.device_bytes for s in state.dropped)}


# ----------------------------------------------------------------- validation

def _flatten(tree, name: str):
    """(treedef, [(path name, leaf)]) with leaves checked to be live, supported jax.Arrays."""
    try:
        with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    except (TypeError, ValueError) as error:  # dict keys that do not sort: 0 and '0' side by side
        raise PauseError(unflattenable(tree, f"{name}= tree", error) + "; nothing was paused") from None
    leaves = []
    for path, leaf in with_path:
        where = name + jax.tree_util.keystr(path)
        _check_leaf(where, leaf)
        leaves.append((where, leaf))
    return treedef, leaves


def _check_leaf(where: str, leaf) -> None:
    if _jax_compat.is_tracer(leaf):
        raise PauseError(f"{where} is a tracer: pause() cannot run inside jax.jit or another "
                         "transformation; call it from plain Python between steps.")
    if not isinstance(leaf, jax.Array):
        raise PauseError(
            f"{where} is a {type(leaf).__module__}.{type(leaf).__qualname__}, not a jax.Array. "
            "keep= and drop= take pytrees whose leaves are all jax.Arrays; leave other values "
            "(Python numbers, numpy arrays, functions) out of them.")
    if leaf.is_deleted():
        raise PauseError(
            f"{where} has been deleted (donated to a jitted function, or .delete()) before "
            "pause(): pass the live arrays, e.g. the new state a donating step returned.")
    memory_kind = leaf.sharding.memory_kind
    if memory_kind not in (None, "device"):
        raise PauseError(f"{where} lives in memory kind '{memory_kind}', not device memory: it "
                         "holds no device memory to free; leave it out of keep= and drop=.")
    for device in leaf.sharding.device_set:
        if device.platform not in ("cpu", "gpu"):
            raise PauseError(f"{where} is on a {device.platform} device ({device}); pause "
                             "supports XLA CPU and CUDA GPU devices.")
        if device.platform == "gpu" and not core.cuda.driver_status()[0]:
            raise PauseError(f"{where} is on {device} but jax_amem cannot reach the CUDA driver: "
                             f"{core.cuda.driver_status()[1]}.")


def _distinct(leaves):
    """(distinct arrays, slot per leaf): a leaf repeated in one tree is stored once."""
    numbers: dict[int, int] = {}
    distinct, slots = [], []
    for _, leaf in leaves:
        if id(leaf) not in numbers:
            numbers[id(leaf)] = len(distinct)
            distinct.append(leaf)
        slots.append(numbers[id(leaf)])
    return distinct, slots


def _check_disjoint(keep_leaves, drop_leaves) -> None:
    kept = {id(leaf): where for where, leaf in keep_leaves}
    for where, leaf in drop_leaves:
        if id(leaf) in kept:
            raise PauseError(f"the same array is {kept[id(leaf)]} and {where}: an array is either "
                             "kept or dropped; remove it from one of them.")


# ----------------------------------------------------------------- NCCL seam

def _nccl_to_pause(enabled: bool):
    """jax_amem.nccl when it is built, installed and tracks communicators, or when this
    process has jax.distributed peers (NCCL's pause is collective: a process with no
    communicator of its own still joins the agreement, or the others wait for it until
    their timeout); else None."""
    if not enabled:
        return None
    try:
        from . import nccl
    except ImportError:
        return None
    if not nccl.is_installed() or not (nccl.communicators() or nccl.in_a_job()):
        return None
    return nccl


# ----------------------------------------------------------------- GPU memory

def _local_gpus() -> dict:
    """CUDA ordinal -> JAX device, for the GPUs this process's JAX uses (empty on its CPU platform)."""
    try:
        devices = jax.local_devices(backend="gpu")
    except RuntimeError:
        return {}
    return {d.local_hardware_id: d for d in devices}


def _free_bytes(ordinal: int) -> int:
    return core.cuda.mem_get_info(ordinal)[0]


def _bytes_in_use(gpus: dict, status):
    """in_use(ordinal): bytes live buffers hold, from the allocator, or None where it cannot say."""
    def in_use(ordinal):
        if status.needs_trim:  # cuda_async: the device's memory pool
            return core.memory.device_pool_usage(ordinal)[1]
        return (gpus[ordinal].memory_stats() or {}).get("bytes_in_use")  # BFC
    return in_use


def _trim(status):
    return core.cuda.trim_memory_pool if status.needs_trim else (lambda ordinal: None)


def _deleted_bytes(specs) -> dict:
    """Device bytes the arrays of `specs` hold, per CUDA ordinal."""
    total: dict[int, int] = {}
    for spec in specs:
        for ordinal, nbytes in spec.bytes_by_ordinal:
            total[ordinal] = total.get(ordinal, 0) + nbytes
    return total


# ----------------------------------------------------------------- pause / resume

def pause(keep=None, drop=None, *, nccl: bool = True) -> PauseInfo:
    """Frees the device memory of `keep` and `drop`, NCCL's and the allocator's pool.

    keep: a pytree of jax.Arrays copied to host memory and restored bit-identical by resume().
    drop: a pytree of jax.Arrays whose contents are not needed; resume() returns them zeroed.
    nccl: also pause every NCCL communicator jax_amem tracks (collective: every rank must
          pause) when jax_amem.nccl is built and installed.
    Every array in keep and drop is deleted; no garbage collection runs unless a buffer is
    still referenced outside its array (PauseInfo.collections). Call reserve() ahead so the
    first pause pins nothing. Raises PauseError, with nothing changed, on a second pause, a
    non-array or deleted leaf, an array both kept and dropped, or a tree that cannot be flattened.
    When the NCCL part fails, the error is a NcclPauseError (a PauseError) naming each
    communicator's state (broken ones with jax_amem.nccl.recover()); no array was deleted.
    """
    global _state
    if not isinstance(nccl, bool):  # nccl="no" is a true string: it would pause NCCL, collectively
        raise PauseError(f"jax_amem.pause(nccl={nccl!r}): nccl is True or False, not {type(nccl).__name__}; "
                         "nothing was paused")
    with _lock:
        if _state is not None:
            raise PauseError("already paused: call jax_amem.resume() before pausing again.")
        start = time.perf_counter()
        keep_tree, keep_leaves = _flatten(keep, "keep")
        drop_tree, drop_leaves = _flatten(drop, "drop")
        _check_disjoint(keep_leaves, drop_leaves)
        kept_arrays, keep_slots = _distinct(keep_leaves)
        dropped_arrays, drop_slots = _distinct(drop_leaves)
        nccl_module = _nccl_to_pause(nccl)
        status = allocator.allocator_status()
        gpus = _local_gpus()
        ordinals = sorted(gpus)
        free_before = {o: _free_bytes(o) for o in ordinals}

        jax.block_until_ready(dropped_arrays)
        pool = staging.staging_pool()
        offload_start = time.perf_counter()
        try:
            kept, times = array_io.offload(kept_arrays, pool)
        except Exception as error:
            raise PauseError(f"pause could not copy the kept arrays to host memory: {error}. "
                             "Nothing was paused or deleted.") from error
        offload_seconds = time.perf_counter() - offload_start
        dropped = [array_io.describe(x, array_io.physical(x)) for x in dropped_arrays]
        if nccl_module is not None:
            try:
                nccl_module.pause()
            except Exception:
                pool.release_all()
                raise
            if not nccl_module.resume_owed():
                nccl_module = None  # nothing paused anywhere in the job: no resume to agree on

        release_start = time.perf_counter()
        in_use = _bytes_in_use(gpus, status)
        deleted = _deleted_bytes([o.spec for o in kept] + dropped)
        limit = {}
        for o in ordinals:
            now = in_use(o)
            if now is not None:
                limit[o] = now - deleted.get(o, 0)
        for x in kept_arrays + dropped_arrays:
            x.delete()
        del kept_arrays, dropped_arrays, keep_leaves, drop_leaves
        released = releasing.release(ordinals, limit, in_use, _trim(status))
        returned, note = _pool_returned(ordinals, status, released)
        free_after = {o: _free_bytes(o) for o in ordinals}
        release_seconds = time.perf_counter() - release_start
        if note and ordinals:
            warnings.warn(note, RuntimeWarning, stacklevel=2)

        info = PauseInfo(
            arrays_kept=len(kept), arrays_dropped=len(dropped),
            bytes_kept=sum(o.spec.device_bytes for o in kept),
            bytes_offloaded=sum(o.host_bytes for o in kept),
            bytes_dropped=sum(s.device_bytes for s in dropped),
            offload_seconds=offload_seconds, seconds=time.perf_counter() - start,
            pool_returned=returned, pool_note=note, nccl_paused=nccl_module is not None,
            device_free_before=free_before, device_free_after=free_after,
            staging_seconds=times.staging_seconds, allocate_seconds=times.allocate_seconds,
            copy_seconds=times.copy_seconds,
            release_seconds=release_seconds, collections=released.collections)
        _state = _PausedState(keep_tree, keep_slots, drop_tree, drop_slots, kept, dropped,
                              nccl_module, info)
        return info


def _pool_returned(ordinals, status, released) -> tuple[bool, str]:
    """(the allocator's idle memory went back, why not and how to fix it)."""
    if not ordinals:
        return True, "no GPU: nothing to return"
    if released.still_held:
        held = ", ".join(f"GPU {o}: {n / 2**20:.1f} MiB" for o, n in sorted(released.still_held.items()))
        return False, (f"after deleting the arrays and collecting garbage, buffers are still in use "
                       f"({held}): something outside JAX's arrays holds them (a DLPack export such "
                       "as a torch view, or an array aliased by another). Drop those references "
                       "before pause().")
    if status.needs_trim:
        return True, ""
    problem = allocator.pool_return_problem(status)
    return not problem, problem


def resume() -> Restored:
    """Brings back what pause() took: returns new `keep` (bit-identical) and `drop` (zeros).

    Raises PauseError when nothing is paused. If the memory cannot be allocated (another
    framework still holds it), raises PauseError and stays paused: free that memory (for
    PyTorch: del the tensors, torch.cuda.empty_cache()) and call resume() again.
    """
    global _state
    with _lock:
        state = _state
        if state is None:
            raise PauseError("not paused: resume() needs a pause() (or use jax_amem.paused()).")
        _wait_for_reservations()
        start = time.perf_counter()
        specs = [o.spec for o in state.kept] + state.dropped
        try:
            datas = array_io.allocate(specs)
            allocate_seconds = time.perf_counter() - start
        except Exception as error:
            need = sum(s.device_bytes for s in specs)
            raise PauseError(
                f"resume could not allocate the {len(specs)} arrays ({need / 2**20:.1f} MiB on the "
                f"devices): {error}. Still paused, nothing lost. If the devices are short of "
                "memory, free what another framework holds (PyTorch: delete the tensors, then "
                "torch.cuda.empty_cache()); then call jax_amem.resume() again.") from error
        kept_datas = datas[:len(state.kept)]
        reload_start = time.perf_counter()
        try:
            array_io.reload(state.kept, kept_datas)
        except Exception as error:
            for data in datas:
                data.delete()
            raise PauseError(f"resume could not copy the kept arrays back: {error}. Still "
                             "paused, nothing lost: call jax_amem.resume() again.") from error
        reload_seconds = time.perf_counter() - reload_start
        restored = [array_io.finish(o.spec, d) for o, d in zip(state.kept, kept_datas)]
        zeroed = [array_io.finish(s, d) for s, d in zip(state.dropped, datas[len(state.kept):])]
        staging.staging_pool().release_all()
        _state = None
        keep = jax.tree_util.tree_unflatten(state.keep_tree, [restored[i] for i in state.keep_slots])
        drop = jax.tree_util.tree_unflatten(state.drop_tree, [zeroed[i] for i in state.drop_slots])
        result = Restored(keep, drop, sum(o.host_bytes for o in state.kept), reload_seconds,
                          time.perf_counter() - start, state.nccl is not None, allocate_seconds)
        if state.nccl is not None:
            try:
                state.nccl.resume()
            except Exception as error:
                failure = PauseError(
                    f"the arrays are restored (see this error's .restored) but NCCL did not "
                    f"resume: {error}. Call jax_amem.nccl.resume() before the next collective.")
                failure.restored = result
                raise failure from error
        return result


class Reservation:
    """What reserve() started: the staging pool grown, and resume's programs compiled, ahead.

    `bytes` is the host memory the kept shards need; `wait()` blocks until the work is done (and
    raises PauseError if it failed), `done()` says whether it is. `pool_seconds` and
    `compile_seconds` are what the work took, off the critical path (None until done).
    """

    def __init__(self, sizes: list, specs: list):
        self.bytes = sum(sizes)
        self.pool_seconds: float | None = None
        self.compile_seconds: float | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(sizes, specs),
                                        name="jax_amem.reserve", daemon=True)
        self._thread.start()

    def _run(self, sizes, specs) -> None:
        try:
            start = time.perf_counter()
            staging.staging_pool().reserve(sizes)
            self.pool_seconds = time.perf_counter() - start
            start = time.perf_counter()
            array_io.prepare_allocation(specs)
            self.compile_seconds = time.perf_counter() - start
        except BaseException as error:  # reported by wait(); pause() then tries itself
            self._error = error

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> "Reservation":
        self._thread.join(timeout)
        if self._error is not None:
            raise PauseError(f"reserve() could not prepare the pause: {self._error}. Nothing is "
                             "lost: pause() will allocate what it needs itself.") from self._error
        return self

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return (f"Reservation({staging.human(self.bytes)}, {state}, pool_seconds="
                f"{self.pool_seconds}, compile_seconds={self.compile_seconds})")


_reservations: list[Reservation] = []


def reserve(keep=None, drop=None, *, wait: bool = False) -> Reservation:
    """Prepares a later `pause(keep=..., drop=...)` ahead, off the critical path.

    On background threads: grows the pinned staging pool to hold `keep` (blocks of up to 1 GiB
    pinned on worker threads; pinning 17 GiB takes ~3.4 s on the H200, which a first pause
    without it pays inside the switch), and
    compiles the program resume() allocates `keep` and `drop` with. The arrays are only read
    (shapes, shardings, shard sizes), never copied nor deleted; training may go on meanwhile.
    Call it once the trainer state exists, before the first pause; again if the state grows.
    wait=True returns when the work is done. Raises PauseError for the leaves pause() refuses.
    """
    _, keep_leaves = _flatten(keep, "keep")
    _, drop_leaves = _flatten(drop, "drop")
    _check_disjoint(keep_leaves, drop_leaves)
    kept, _ = _distinct(keep_leaves)
    dropped, _ = _distinct(drop_leaves)
    sizes = array_io.staging_sizes(kept)
    specs = [array_io.describe(x, array_io.physical(x)) for x in kept + dropped]
    reservation = Reservation(sizes, specs)
    with _lock:
        _reservations[:] = [r for r in _reservations if not r.done()] + [reservation]
    return reservation.wait() if wait else reservation


def _wait_for_reservations() -> None:
    """resume() waits for reserve()'s compilation rather than compile the same program again."""
    for reservation in list(_reservations):
        reservation._thread.join()


class paused(PausedBlock):  # noqa: N801  (used as a context manager, like contextlib's)
    """`with jax_amem.paused(keep=..., drop=...) as p:` pauses on entry, resumes on exit.

    After the block, p.keep and p.drop are the restored trees (new arrays); p.info is
    what the pause did and p.restored what the resume did. The arrays passed in are
    deleted on entry. The block's own exception, if any, propagates after the resume.
    The same shape as `jax_amem.nccl.paused` (pause_block.py).
    """

    def __init__(self, keep=None, drop=None, *, nccl: bool = True):
        super().__init__(keep, drop, nccl=nccl)

    def _pause(self, keep, drop, *, nccl) -> PauseInfo:
        return pause(keep, drop, nccl=nccl)

    def _resume(self) -> Restored:
        return resume()

    def _result(self, name: str):
        if self.restored is None:
            raise PauseError(f"p.{name} exists once the `with jax_amem.paused(...)` block has "
                             "ended (the arrays are restored on exit).")
        return getattr(self.restored, name)

    @property
    def keep(self):
        return self._result("keep")

    @property
    def drop(self):
        return self._result("drop")


__all__ = ["PauseInfo", "Reservation", "Restored", "is_paused", "pause", "paused", "reserve", "resume"]
