"""Every exception jax-amem raises, in one family: `except jax_amem.JaxAmemError` catches them all.

Each message names the input at fault and what to do. Members that refuse an argument are also
ValueErrors (as a wrong value is in Python); those about the machine or the process's state are
RuntimeErrors (JaxAmemError itself is one), so code written against either keeps working.

    JaxAmemError (RuntimeError)
        GpuUnavailableError            a GPU-only feature without a usable GPU, driver or kernel build
        NativeCoreMissingError         (also ImportError) the compiled core is not built
        PauseError                     pause / resume / paused / reserve refused or failed
            NcclPauseError             jax_amem.nccl.pause / resume / recover refused or failed
                NcclArgumentError      (also ValueError, TypeError) an argument of a jax_amem.nccl verb
        NcclNotInstalledError          the NCCL interposer is not in front of NCCL in this process
        LayoutError (ValueError)       a layout or a tree of names is inconsistent
        RuleError (ValueError)         rules do not describe the destination exactly
            TraceError                 a conversion function is not a pure layout change
            AffineError                a constant step the copy cannot run (integer dtype, NaN, too many)
        PlanError (ValueError)         a plan does not write every element exactly once
        SwapError (ValueError)         swap / to_torch refused its input; nothing was written
            PartialSwapError           a swap into jax.Arrays failed after donating: nothing lost
        ReadOnlyViewError              a write into a view that to_torch returned
        CopyError (ValueError)         jax_amem.copy refused a row table, an address or a size

docs/api.md lists which verb raises which.
"""

from __future__ import annotations


class JaxAmemError(RuntimeError):
    """Base class of jax-amem's errors."""


class GpuUnavailableError(JaxAmemError):
    """A GPU-only feature was called where no usable NVIDIA GPU (or driver, or kernel build) exists."""


class NativeCoreMissingError(JaxAmemError, ImportError):
    """The compiled core `jax_amem_core._core` is not importable (package not built)."""


class PauseError(JaxAmemError):
    """A pause or resume was refused or failed; the message says what to do."""


class NcclPauseError(PauseError):
    """A pause or resume of NCCL communicators could not be done; the message names the
    communicator and the fix."""


class NcclArgumentError(NcclPauseError, ValueError, TypeError):
    """An argument of a jax_amem.nccl verb of the wrong type or out of range (ids=, timeout=,
    strategy=, teardown=, agree=, async_=); nothing was touched. Also a ValueError and a
    TypeError, the classes these refusals had before the family."""


class NcclNotInstalledError(JaxAmemError):
    """The NCCL interposer is not in front of NCCL in this process; the message says why and how."""


class LayoutError(JaxAmemError, ValueError):
    """A layout description is inconsistent (boxes outside the shape, owners repeated, ...), or a
    tree's leaves cannot be named (two leaves under one name, dict keys that cannot be sorted)."""


class RuleError(JaxAmemError, ValueError):
    """Rules do not describe the destination exactly (a region missing, covered twice,
    shapes or dtypes that do not match)."""


class TraceError(RuleError):
    """The conversion function does something that is not a pure layout change."""


class AffineError(RuleError):
    """A constant step (scale, offset) the copy cannot run: an integer dtype, a NaN constant,
    more steps than a view holds."""


class PlanError(JaxAmemError, ValueError):
    """plan() refused one of its own arguments (split_bytes, planner, owner), or a plan does not
    write every destination element exactly once (a planner bug)."""


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


class ReadOnlyViewError(JaxAmemError):
    """An in-place write into a view `to_torch` returned: the view is JAX's own memory, and a
    jax.Array is immutable. Refused before any byte is written; write into a `.clone()`."""


class CopyError(JaxAmemError, ValueError):
    """jax_amem.copy's primitives refused their input before anything ran: a row table that is
    not integer rows of the right width, a row out of bounds, empty or overlapping another's
    destination bytes; a destination address or size that is not an integer of int64, an address
    that cannot be memory of this process, a misaligned address, rows past the allocation that
    holds it. The message names the input."""


FAMILY = (JaxAmemError, GpuUnavailableError, NativeCoreMissingError, PauseError, NcclPauseError,
          NcclArgumentError, NcclNotInstalledError, LayoutError, RuleError, TraceError, AffineError, PlanError,
          SwapError, PartialSwapError, ReadOnlyViewError, CopyError)

__all__ = [error.__name__ for error in FAMILY]
