"""Typed wrappers over the interposer's C control API (see src/nccl/control_api.cc)."""

from __future__ import annotations

import ctypes
import json

from ..errors import NcclArgumentError, NcclPauseError

STRATEGIES = {"auto": 0, "suspend": 1, "recreate": 2}
TEARDOWNS = {"destroy": 0, "abort": 1, "parallel": 2}
UNIQUE_ID_BYTES = 128
_ERROR_BYTES = 4096


def _ids(ids):
    if ids is None:
        return None, 0
    array = (ctypes.c_uint64 * len(ids))(*ids)
    return array, len(ids)


def _check(code: int, buffer) -> None:
    if code != 0:
        raise NcclPauseError(buffer.value.decode(errors="replace"))


class Control:
    def __init__(self, library: ctypes.CDLL):
        self._lib = library

    def snapshot(self) -> list[dict]:
        return json.loads(self._lib.amem_nccl_snapshot().decode())

    def real_version(self) -> int:
        return self._lib.amem_nccl_real_version()

    def has_suspend(self) -> bool:
        return bool(self._lib.amem_nccl_has_suspend())

    def last_error(self) -> str:
        return self._lib.amem_nccl_last_error().decode(errors="replace")

    def plan(self, ids, strategy: str, make_ids: bool = False, agreed: bool = False) -> list[dict]:
        """What pause would do to each communicator; raises on a bad selection. make_ids: rank 0 of
        each communicator to recreate makes its replacement's unique id now (entry "next_id", hex).
        agreed: an agreement will merge every process's plan, so `auto` may choose by cost for
        every communicator (without one, only for those whose ranks all live in this process)."""
        array, count = _ids(ids)
        flags = (1 if make_ids else 0) | (2 if agreed else 0)
        answer = json.loads(self._lib.amem_nccl_plan(array, count, STRATEGIES[strategy], flags).decode())
        if "error" in answer:
            raise NcclPauseError(answer["error"])
        return answer["plan"]

    def pause(self, ids, requested: str, strategies: list[str], next_ids: list[bytes | None],
              timeout: float, teardown: str) -> list[dict]:
        """`strategies`: what every process agreed on for each id (from `requested`); `next_ids`: the
        replacement's unique id of each communicator to recreate, None where it must go over the
        communicator. Returns the paused communicators' rows."""
        array, count = _ids(ids)
        agreed = (ctypes.c_int * count)(*(STRATEGIES[s] for s in strategies))
        known = b"".join(uid or bytes(UNIQUE_ID_BYTES) for uid in next_ids)
        rows, buffer = ctypes.c_char_p(), ctypes.create_string_buffer(_ERROR_BYTES)
        code = self._lib.amem_nccl_pause(array, agreed, known, count, STRATEGIES[requested], float(timeout),
                                         TEARDOWNS[teardown], ctypes.byref(rows), buffer, _ERROR_BYTES)
        _check(code, buffer)
        return json.loads(rows.value.decode())

    def begin_resume(self, ids) -> None:
        array, count = _ids(ids)
        buffer = ctypes.create_string_buffer(_ERROR_BYTES)
        _check(self._lib.amem_nccl_begin_resume(array, count, buffer, _ERROR_BYTES), buffer)

    def cost_rates(self, reset: bool = False) -> dict:
        """`auto`'s cost model now (src/nccl/auto_cost.h); reset: forget what was measured."""
        answer = json.loads(self._lib.amem_nccl_cost_rates(int(reset)).decode())
        if "error" in answer:
            raise NcclArgumentError(answer["error"])
        return answer["rates"]

    def cancel_resume(self) -> None:
        """Calls stop waiting for a resume that will not come (its agreement failed)."""
        self._lib.amem_nccl_cancel_resume()

    def resume(self, ids, timeout: float) -> list[dict]:
        """Returns the resumed communicators' rows."""
        array, count = _ids(ids)
        rows, buffer = ctypes.c_char_p(), ctypes.create_string_buffer(_ERROR_BYTES)
        # ctypes releases the GIL during the call: an asynchronous resume runs
        # beside Python code.
        _check(self._lib.amem_nccl_resume(array, count, float(timeout), ctypes.byref(rows), buffer,
                                          _ERROR_BYTES), buffer)
        return json.loads(rows.value.decode())

    def new_unique_id(self) -> bytes:
        out = ctypes.create_string_buffer(UNIQUE_ID_BYTES)
        buffer = ctypes.create_string_buffer(_ERROR_BYTES)
        _check(self._lib.amem_nccl_new_unique_id(out, buffer, _ERROR_BYTES), buffer)
        return out.raw

    def recover(self, ids, unique_ids: list[bytes], timeout: float) -> None:
        array, count = _ids(ids)
        buffer = ctypes.create_string_buffer(_ERROR_BYTES)
        _check(self._lib.amem_nccl_recover(array, b"".join(unique_ids), count, float(timeout),
                                           buffer, _ERROR_BYTES), buffer)

    def keep_suspendable(self, on: bool | None = None) -> bool:
        return bool(self._lib.amem_nccl_keep_suspendable(-1 if on is None else int(on)))

    def keep_suspendable_rewrites(self) -> int:
        return int(self._lib.amem_nccl_keep_suspendable_rewrites())
