"""`python -m jax_amem run script.py [args]`: run a program with the interposer preloaded.

For programs that cannot import jax_amem first (PyTorch imported earlier, or
code you do not control): LD_PRELOAD puts the interposer in front of NCCL
before anything else is loaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from . import _loader


def staged_for_preload(real: Path) -> Path:
    """A stable folder per (user, real NCCL, interposer build): it must outlive exec()."""
    digest = hashlib.sha256(f"{real.resolve()}:{_loader.INTERPOSER_FILE.stat().st_mtime_ns}".encode())
    folder = Path(tempfile.gettempdir()) / f"jax_amem_nccl_{os.getuid()}_{digest.hexdigest()[:12]}"
    staged = folder / "libnccl.so.2"
    if not staged.exists():
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_loader.INTERPOSER_FILE, folder / "libnccl.so.2.tmp")
        link = folder / "libnccl_real.so.2"
        if not link.is_symlink():
            link.symlink_to(real.resolve())
        os.replace(folder / "libnccl.so.2.tmp", staged)
    return staged


def run(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m jax_amem run script.py [args...]", file=sys.stderr)
        return 2
    real = _loader.find_real_nccl()
    if real is None:
        print("jax_amem run: no NCCL library found (install nvidia-nccl-cu13 or set "
              "JAX_AMEM_NCCL_LIBRARY); running without the interposer", file=sys.stderr)
        os.execv(sys.executable, [sys.executable, *argv])
    staged = staged_for_preload(real)
    preload = os.environ.get("LD_PRELOAD", "")
    os.environ["LD_PRELOAD"] = f"{staged}:{preload}" if preload else str(staged)
    os.environ["JAX_AMEM_NCCL_PRELOADED"] = str(staged)
    os.execv(sys.executable, [sys.executable, *argv])
    return 0  # not reached
