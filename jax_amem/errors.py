"""Exceptions raised by jax-amem. Every message names the input at fault and what to do."""


class JaxAmemError(RuntimeError):
    """Base class of jax-amem's errors."""


class GpuUnavailableError(JaxAmemError):
    """A GPU-only feature was called where no usable NVIDIA GPU (or driver, or kernel build) exists."""


class NativeCoreMissingError(JaxAmemError, ImportError):
    """The compiled core `jax_amem._core` is not importable (package not built)."""
