"""Puts the interposer in front of the real libnccl.so.2, before XLA or PyTorch load it.

Mechanism (verified against the real XLA plugin on the GPU machine; see
docs/nccl.md): the interposer's SONAME is libnccl.so.2, so once loaded, a bare
dlopen("libnccl.so.2") - which is how XLA reaches NCCL - returns it, and
PyTorch's NEEDED libnccl.so.2 binds to it. The interposer needs
libnccl_real.so.2 (RUNPATH $ORIGIN): a symbolic link to the real library
placed beside a copy of the interposer in a private temporary folder, so that
every NCCL function it does not define resolves from the real library, and only
one real NCCL is mapped in the process.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

INTERPOSER_FILE = Path(__file__).resolve().parent.parent / "_nccl" / "libjax_amem_nccl.so"
# The interposer's control API version; the build reads this line (src/nccl/CMakeLists.txt).
ABI_VERSION = 4


@dataclasses.dataclass
class LoadState:
    installed: bool = False
    reason: str = "not attempted"
    library: ctypes.CDLL | None = None
    path: Path | None = None        # the staged interposer that was loaded
    real_path: Path | None = None   # the real NCCL behind it


def find_real_nccl() -> Path | None:
    """The NCCL that JAX's CUDA plugin uses (nvidia-nccl-cu1x), or $JAX_AMEM_NCCL_LIBRARY."""
    forced = os.environ.get("JAX_AMEM_NCCL_LIBRARY")
    if forced:
        return Path(forced) if Path(forced).exists() else None
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "lib" / "libnccl.so.2"
        if candidate.exists():
            return candidate
    return None


def stage(real: Path) -> Path:
    """A private folder holding a copy of the interposer and the link to the real NCCL."""
    folder = Path(tempfile.mkdtemp(prefix="jax_amem_nccl_"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    staged = folder / "libnccl.so.2"
    shutil.copyfile(INTERPOSER_FILE, staged)
    (folder / "libnccl_real.so.2").symlink_to(real.resolve())
    return staged


def _loaded(name: str) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except OSError:
        return None


def _bind(library: ctypes.CDLL) -> None:
    u64p = ctypes.POINTER(ctypes.c_uint64)
    signatures = {
        "amem_nccl_abi_version": ([], ctypes.c_int),
        "amem_nccl_real_version": ([], ctypes.c_int),
        "amem_nccl_has_suspend": ([], ctypes.c_int),
        "amem_nccl_is_front": ([], ctypes.c_int),
        "amem_nccl_snapshot": ([], ctypes.c_char_p),
        "amem_nccl_last_error": ([], ctypes.c_char_p),
        "amem_nccl_plan": ([u64p, ctypes.c_int, ctypes.c_int, ctypes.c_int], ctypes.c_char_p),
        "amem_nccl_pause": ([u64p, ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                             ctypes.c_double, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
                             ctypes.c_char_p, ctypes.c_int], ctypes.c_int),
        "amem_nccl_new_unique_id": ([ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int], ctypes.c_int),
        "amem_nccl_recover": ([u64p, ctypes.c_char_p, ctypes.c_int, ctypes.c_double, ctypes.c_char_p,
                               ctypes.c_int], ctypes.c_int),
        "amem_nccl_cancel_resume": ([], None),
        "amem_nccl_cost_rates": ([ctypes.c_int], ctypes.c_char_p),
        "amem_nccl_keep_suspendable": ([ctypes.c_int], ctypes.c_int),
        "amem_nccl_keep_suspendable_rewrites": ([], ctypes.c_uint64),
        "amem_nccl_begin_resume": ([u64p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int], ctypes.c_int),
        "amem_nccl_resume": ([u64p, ctypes.c_int, ctypes.c_double, ctypes.POINTER(ctypes.c_char_p),
                              ctypes.c_char_p, ctypes.c_int], ctypes.c_int),
    }
    for name, (arguments, result) in signatures.items():
        function = getattr(library, name)
        function.argtypes = arguments
        function.restype = result


def load() -> LoadState:
    """Loads the interposer if it can still be put in front; never raises."""
    if os.environ.get("JAX_AMEM_NCCL", "1") == "0":
        return LoadState(reason="disabled by JAX_AMEM_NCCL=0")
    preloaded = os.environ.get("JAX_AMEM_NCCL_PRELOADED")
    if preloaded:  # `python -m jax_amem run` put it in LD_PRELOAD
        library = _loaded(preloaded)
        if library is not None:
            return _finish(LoadState(path=Path(preloaded)), library)
    if not INTERPOSER_FILE.exists():
        return LoadState(reason=f"the interposer was not built ({INTERPOSER_FILE} is missing)")
    real = find_real_nccl()
    if real is None:
        return LoadState(reason="no NCCL library found (install nvidia-nccl-cu13, or set "
                                "JAX_AMEM_NCCL_LIBRARY to the real libnccl.so.2)")
    existing = _loaded("libnccl.so.2")
    if existing is not None and not hasattr(existing, "amem_nccl_abi_version"):
        return LoadState(reason=(
            "NCCL was loaded into this process before jax_amem (by PyTorch, or by a JAX GPU "
            "backend that already started), so XLA's communicators cannot be tracked. Import "
            "jax_amem before torch and before any JAX computation, or start the program with "
            "`python -m jax_amem run script.py`."), real_path=real)
    path = stage(real)
    try:
        library = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    except OSError as error:
        return LoadState(reason=f"loading the interposer failed: {error}", real_path=real)
    return _finish(LoadState(path=path, real_path=real), library)


def _finish(state: LoadState, library: ctypes.CDLL) -> LoadState:
    _bind(library)
    version = library.amem_nccl_abi_version()
    if version != ABI_VERSION:
        state.reason = f"interposer ABI {version} does not match this package's {ABI_VERSION}"
        return state
    if not library.amem_nccl_is_front():
        state.reason = "the interposer loaded but dlopen('libnccl.so.2') does not return it"
        return state
    state.installed, state.library, state.reason = True, library, ""
    return state
