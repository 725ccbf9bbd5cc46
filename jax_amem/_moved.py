"""Where names of earlier versions went, so that code written for them learns its fix from the error.

Two kinds of move:
* names that left the top level: `jax_amem.<name>` ends in an AttributeError naming the new home
  (REMOVED), or still works with a DeprecationWarning naming it (DEPRECATED, for one version);
* the package `jax_amem.swap` (now `jax_amem.swapping`; `jax_amem.swap` is the verb): importing it
  or one of its old modules ends in a ModuleNotFoundError naming where each of its modules went
  (jax_amem/swap.py).
docs/api.md lists the same table.
"""

from __future__ import annotations

import importlib
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
