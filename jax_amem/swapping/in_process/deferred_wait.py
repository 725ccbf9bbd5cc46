"""One wait for many direct launches: inside `deferred()`, a direct launch (direct.py) returns
once its copies are queued instead of waiting for them, and the streams it used are waited for
when the block ends (on an error too: nothing still writes when the error leaves).

Why: a caller that writes a rollout engine by address and then does host work of its own
before anyone reads the weights (the vLLM backend's commit and finish calls, which for
parameters written in place are bookkeeping) can run that work while the device copies, and
wait once. What the caller owes meanwhile: the swap's sources stay referenced (`keep`), since
the copies still read them; and whatever reads the written memory from another stream or
process waits first (`wait`). Work queued later on the same stream (PyTorch's current one, where
the copies into this process's tensors run) is ordered after the copies by the stream itself.

The block is per thread: a swap on another thread waits as it always does.
"""

from __future__ import annotations

import contextlib
import threading

_local = threading.local()


class Pending:
    """The streams launched into inside one `deferred()` block, and what they still read."""

    def __init__(self, synchronize):
        self._synchronize = synchronize
        self._launched: list = []
        self._kept: list = []

    def add(self, launched) -> None:
        self._launched.extend(launched)

    def keep(self, sources) -> None:
        """Keeps `sources` (what a swap reads) alive until the copies are waited for."""
        self._kept.append(sources)

    def wait(self) -> None:
        """Waits for every copy launched so far; then their sources may go."""
        launched, self._launched = self._launched, []
        try:
            if launched:
                self._synchronize(launched)
        finally:
            self._kept = []


def current() -> Pending | None:
    """This thread's open block, or None (a launch then waits for its own copies)."""
    return getattr(_local, "pending", None)


@contextlib.contextmanager
def deferred(synchronize, enabled: bool = True):
    """Yields the block's Pending (None when not `enabled`: every launch waits as usual).
    `synchronize(launched)` waits for a list of (CUDA ordinal, stream). Blocks do not nest."""
    if not enabled:
        yield None
        return
    if current() is not None:
        raise RuntimeError("jax_amem: deferred waits do not nest")
    pending = _local.pending = Pending(synchronize)
    try:
        yield pending
    except BaseException:
        _local.pending = None
        try:
            pending.wait()
        except Exception:  # noqa: BLE001 - the error being raised already says what went wrong
            pass
        raise
    _local.pending = None
    pending.wait()
