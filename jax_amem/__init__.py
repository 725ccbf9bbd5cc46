"""jax-amem: pause/resume of a JAX process's GPU memory and resharded in-place weight swaps.

Import it before JAX starts its GPU backend (and before PyTorch): it puts the
NCCL interposer in front of libnccl, chooses XLA's cuda_async allocator (so a
pause can return the pool), and registers its XLA FFI targets.
"""

from ._native import core as _core
from . import nccl
nccl.install()  # first: before anything loads libnccl.so.2

from .memory import allocator as _allocator
_allocator.configure_at_import()  # XLA's cuda_async allocator, so pause can return its pool

from . import _ffi
from .copy import segment_copy, prepare_segments
from .errors import GpuUnavailableError, JaxAmemError, NativeCoreMissingError
from .platform import gpu_status, require_gpu
from .memory import memory_report
from .process_pause import PauseError, PauseInfo, Restored, is_paused, pause, paused, resume
from .process_pause import reserve
from .swap import SwapError, SwapReport, swap, to_torch  # `swap` the function; jax_amem/swap/ its package
from . import reshard
from .reshard import Layout, Owner, plan, rules

__version__ = "0.1.0"

_ffi.register_targets()

__all__ = [
    "GpuUnavailableError",
    "JaxAmemError",
    "Layout",
    "NativeCoreMissingError",
    "Owner",
    "PauseError",
    "PauseInfo",
    "Restored",
    "gpu_status",
    "is_paused",
    "memory_report",
    "pause",
    "paused",
    "plan",
    "prepare_segments",
    "require_gpu",
    "reserve",
    "reshard",
    "resume",
    "rules",
    "segment_copy",
    "swap",
    "SwapError",
    "SwapReport",
    "to_torch",
]
