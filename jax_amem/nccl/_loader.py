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
import sys
import tempfile
from pathlib import Path

from .. import settings

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
    late: bool = False              # NCCL was in the process before jax_amem: nothing to put in front of


def find_real_nccl() -> Path | None:
    """The NCCL that JAX's CUDA plugin uses (nvidia-nccl-cu1x), or $JAX_AMEM_NCCL_LIBRARY."""
    forced = settings.value("JAX_AMEM_NCCL_LIBRARY")
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


def _mapped_files() -> list[str]:
    """The files mapped into this process (Linux: /proc/self/maps), [] where it cannot be read."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6})
    except OSError:
        return []


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _file_of(library: ctypes.CDLL) -> str | None:
    """The file a loaded NCCL came from (dladdr of its ncclGetVersion), None where it cannot tell."""
    try:
        info = _DlInfo()
        address = ctypes.cast(library.ncclGetVersion, ctypes.c_void_p)
        if ctypes.CDLL(None).dladdr(address, ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode())
    except (AttributeError, OSError, UnicodeDecodeError):
        pass
    return None


def loaded_first_reason(nccl: str | None = None, mapped: list[str] | None = None, modules=None) -> str:
    """Why the interposer cannot be put in front: which library loaded NCCL (the file `nccl`) first,
    and what to do. `mapped` (files mapped into the process) and `modules` (sys.modules) are for the
    tests."""
    mapped = _mapped_files() if mapped is None else mapped
    modules = sys.modules if modules is None else modules
    names = [Path(path).name for path in mapped]
    by = []
    if "torch" in modules or any(name.startswith("libtorch_cuda") for name in names):
        by.append("PyTorch (torch was imported before jax_amem)")
    if any("xla_cuda" in path or "jax_plugins" in path for path in mapped):
        by.append("JAX's GPU backend (a JAX computation, or jax.devices(), ran before jax_amem was imported)")
    where = f" ({nccl})" if nccl else ""
    return (f"NCCL{where} was loaded into this process before jax_amem, by {' and '.join(by) or 'another library'}, "
            "so its communicators (XLA's, PyTorch's) cannot be tracked, paused or resumed. Import jax_amem "
            "first (before torch and before any JAX computation), or start the program with "
            "`python -m jax_amem run script.py`.")


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
    if not settings.flag("JAX_AMEM_NCCL", True):
        return LoadState(reason="disabled by JAX_AMEM_NCCL=0")
    preloaded = settings.value("JAX_AMEM_NCCL_PRELOADED")
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
        return LoadState(reason=loaded_first_reason(_file_of(existing)), real_path=real, late=True)
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
