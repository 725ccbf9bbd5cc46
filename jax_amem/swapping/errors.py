"""The swap's error: raised before any byte moves, so the destination is untouched."""

from __future__ import annotations

from ..errors import JaxAmemError


class SwapError(JaxAmemError, ValueError):
    """A swap's input is wrong (a destination of the wrong shape, dtype or device, a name
    missing or extra, a freed buffer, a plan made for other layouts), or an in-place write
    could not be proven. The message names the tensor and says what to do."""


class PartialSwapError(SwapError):
    """A swap into jax.Arrays failed after it had donated some of them (a device error, out of
    memory, a compile failure of a later group): nothing is lost. `dst` is the whole
    destination pytree, every array alive (those in `written` hold the new values, the others
    the old ones); `written` the names written in full; `shards` every written single-device
    buffer by (name, owner). The cause is chained (__cause__)."""

    def __init__(self, message: str = "", *, dst=None, written=(), shards=None):
        super().__init__(message)
        # Per instance: class-level [] and {} were shared by every error (a caller's append
        # showed in the next one).
        self.dst, self.written, self.shards = dst, list(written), dict(shards or {})
