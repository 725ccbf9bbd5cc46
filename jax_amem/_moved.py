"""Where names of earlier versions went, so that code written for them learns its fix from the error.

Two kinds of move:
* names that left the top level: `jax_amem.<name>` ends in an AttributeError naming the new home
  (REMOVED), or still works with a DeprecationWarning naming it (DEPRECATED, for one version);
* the package `jax_amem.swap` (now `jax_amem.swapping`; `jax_amem.swap` is the verb): importing it
  or one of its old modules ends in a ModuleNotFoundError naming where each of its modules went.
docs/api.md lists the same table.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import warnings

# Left the top level before 0.1: only under their modules.
REMOVED = {
    "segment_copy": "jax_amem.copy.segment_copy",
    "prepare_segments": "jax_amem.copy.prepare_segments",
    "require_gpu": "jax_amem.platform.require_gpu",
}

# Left the top level in 0.1 (the public API on one page): still resolved, with a warning.
DEPRECATED = {
    "PauseInfo": "jax_amem.process_pause.PauseInfo",
    "Restored": "jax_amem.process_pause.Restored",
    "SwapReport": "jax_amem.swapping.SwapReport",
    "GpuUnavailableError": "jax_amem.errors.GpuUnavailableError",
    "NativeCoreMissingError": "jax_amem.errors.NativeCoreMissingError",
}

# The old package jax_amem.swap, where its modules went (Python imports a package before its module,
# so the finder below sees "jax_amem.swap" alone and names them all).
OLD_SWAP_PACKAGE = (
    "jax_amem.swap was the package of earlier versions: it is now jax_amem.swapping (swap, verify, forget, "
    "to_torch, export_tensors, open_remote, ...); its modules went to jax_amem.swapping.same_host (ipc, "
    "remote -> ready_done), jax_amem.swapping.cross_host (nccl_transport, nccl_link -> link, nccl_control -> "
    "handshake, nccl_packing -> packing, nccl_sender -> send, nccl_receiver -> receive_torch, nccl_jax_receiver "
    "-> receive_jax), jax_amem.swapping.in_process (api -> run, executor, program -> programs, verify, "
    "addressed, batched) and jax_amem.errors (errors); destinations, sources, store, report and torch_bridge "
    "kept their names under jax_amem.swapping. jax_amem.swap is now the verb (a function); docs/api.md lists "
    "where every name went")


def _resolve(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def top_level_getattr(name: str):
    """The package's module __getattr__: moved names say where they went."""
    if name in DEPRECATED:
        warnings.warn(f"jax_amem.{name} moved to {DEPRECATED[name]}; the old name goes in the next version",
                      DeprecationWarning, stacklevel=3)
        return _resolve(DEPRECATED[name])
    if name in REMOVED:
        raise AttributeError(f"jax_amem.{name} moved to {REMOVED[name]}: import it from there "
                             f"(docs/api.md lists where every name went)")
    raise AttributeError(f"module 'jax_amem' has no attribute {name!r}")


class OldSwapPackage(importlib.abc.MetaPathFinder):
    """Consulted last on sys.meta_path: `import jax_amem.swap[.module]` finds no module (the verb
    `jax_amem.swap` is a function), and this says where the module went instead of Python's
    bare "No module named 'jax_amem.swap'"."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "jax_amem.swap" or fullname.startswith("jax_amem.swap."):
            raise ModuleNotFoundError(f"No module named {fullname!r}: {OLD_SWAP_PACKAGE}", name=fullname)
        return None


def install_finder() -> None:
    if not any(isinstance(finder, OldSwapPackage) for finder in sys.meta_path):
        sys.meta_path.append(OldSwapPackage())
