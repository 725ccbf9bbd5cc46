"""jax-amem: pause/resume of a JAX process's GPU memory and resharded in-place weight swaps.

Import it before JAX starts its GPU backend (and before PyTorch): it puts the
NCCL interposer in front of libnccl, chooses XLA's cuda_async allocator (so a
pause can return the pool), and registers its XLA FFI targets.
"""

from . import settings
settings.check_all()  # a JAX_AMEM_* variable set to a value it does not take: said now, by name

from ._native import core as _core
from . import nccl
nccl.install()  # first: before anything loads libnccl.so.2
nccl._api.warn_if_loaded_first()  # torch or JAX's GPU backend loaded NCCL before this import

from .memory import allocator as _allocator
_allocator.configure_at_import()  # XLA's cuda_async allocator, so pause can return its pool

from . import _ffi
from . import copy  # the byte mover's primitives, by their module: jax_amem.copy.segment_copy
from . import errors  # the one family of errors: jax_amem.errors
from .errors import JaxAmemError, PartialSwapError, PauseError, SwapError
from .platform import gpu_status  # and jax_amem.platform.require_gpu, for code that builds on it
from .memory import memory_report
from .process_pause import is_paused, pause, paused, resume
from .process_pause import reserve  # grow the pinned pool ahead, off the switch
from .swapping import swap, to_torch  # `swap` the verb; jax_amem/swapping/ its package
from . import reshard
from .reshard import Layout, Owner, plan, rules

__version__ = "0.1.0"

_ffi.register_targets()

# The public API on one page (docs/api.md): what a user calls, then what a user names (to annotate,
# to catch). Everything else lives under its subpackage: jax_amem.process_pause (PauseInfo,
# Restored), jax_amem.swapping (SwapReport, verify, forget, open_remote, ...), jax_amem.reshard
# (layouts, plans, rules in detail), jax_amem.errors (the whole family), jax_amem.copy
# (segment_copy, prepare_segments), jax_amem.platform (require_gpu).
__all__ = [
    # verbs
    "pause", "resume", "paused", "is_paused", "reserve", "memory_report",
    "swap", "plan", "to_torch",
    "nccl", "rules",
    "gpu_status",
    # types a user names
    "Layout", "Owner",
    # errors a user catches (the others: jax_amem.errors)
    "JaxAmemError", "PauseError", "SwapError", "PartialSwapError",
]

from . import _moved  # noqa: E402 - where earlier versions' names went (and jax_amem/swap.py: the old package)

__getattr__ = _moved.top_level_getattr
