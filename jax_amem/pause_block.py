"""The one shape of a pause surface's context manager. Each surface (`jax_amem`, i.e.
`jax_amem.process_pause`, for the whole process; `jax_amem.nccl` for the communicators alone) has
the same four verbs: `pause(...)`, `resume(...)`, `is_paused()` and `paused(...)`, this class's
subclass:

    with surface.paused(...) as p:     # pause(...) on entry; p.info is what it returned
        rollout()
    p.restored                         # what resume() returned, after the block

The block's own exception, if any, propagates after the resume.
"""

from __future__ import annotations

from .errors import PauseError


class PausedBlock:
    """Pauses on entry and resumes on exit; a subclass says how (`_pause`, `_resume`) and names
    its surface (`SURFACE`, for messages)."""

    SURFACE = "jax_amem"

    def __init__(self, *args, **kwargs):
        self._arguments = (args, kwargs)
        self.info = None        # what the surface's pause() returned, once entered
        self.restored = None    # what its resume() returned, once exited

    def __enter__(self):
        if self._arguments is None:
            raise PauseError(f"this `{self.SURFACE}.paused(...)` block was entered already: make a new one "
                             "for each `with`")
        args, kwargs = self._arguments
        self._arguments = None  # hold no reference to what the pause deletes
        self.info = self._pause(*args, **kwargs)
        return self

    def __exit__(self, *exc_info) -> bool:
        self.restored = self._resume()
        return False

    def _pause(self, *args, **kwargs):  # pragma: no cover - every surface defines it
        raise NotImplementedError

    def _resume(self):  # pragma: no cover - every surface defines it
        raise NotImplementedError
