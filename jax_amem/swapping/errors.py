"""The swap's error: raised before any byte moves, so the destination is untouched."""

from __future__ import annotations

from ..errors import JaxAmemError


class SwapError(JaxAmemError, ValueError):
    """A swap's input is wrong (a destination of the wrong shape, dtype or device, a name
    missing or extra, a freed buffer, a plan made for other layouts), or an in-place write
    could not be proven. The message names the tensor and says what to do."""
