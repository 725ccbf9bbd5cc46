"""jax-amem: pause/resume of a JAX process's GPU memory and resharded in-place weight swaps.

Import it before JAX starts its GPU backend: it registers its XLA FFI targets
here (and, as the NCCL part lands, installs the NCCL interposer).
"""

from ._native import core as _core
from . import _ffi
from .copy import segment_copy, prepare_segments
from .errors import GpuUnavailableError, JaxAmemError, NativeCoreMissingError
from .platform import gpu_status, require_gpu

__version__ = "0.1.0"

_ffi.register_targets()

__all__ = [
    "GpuUnavailableError",
    "JaxAmemError",
    "NativeCoreMissingError",
    "gpu_status",
    "prepare_segments",
    "require_gpu",
    "segment_copy",
]
