"""jax-amem's compiled core (its CUDA IPC export), loaded without the `jax_amem` package.

`import jax_amem._core` would run `jax_amem/__init__.py`, which imports JAX; inside vLLM's
worker that must not happen (JAX's default preallocation would take 75% of the GPU from the
engine). The core is a plain extension module that imports no Python package, so it is loaded
here straight from its file.

It is loaded under its own name, `jax_amem._core`, without running the package: a process that
imports `jax_amem` later (an in-process engine whose worker came first, a test) then finds the
same module instead of loading the library a second time, which would run its init again and
leave nanobind's types registered to the first copy only.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_NAME = "jax_amem._core"   # the extension's init function is PyInit__core: the name ends in _core


def core():
    """The loaded core (once per process); ImportError saying what is missing."""
    if _NAME in sys.modules:   # a process that imported jax_amem (a trainer) has it already
        return sys.modules[_NAME]
    spec = importlib.util.find_spec("jax_amem")   # finds the package without running it
    folders = list(spec.submodule_search_locations or []) if spec else []
    files = [os.path.join(d, f) for d in folders for f in sorted(os.listdir(d)) if f.startswith("_core.")]
    if not files:
        raise ImportError(f"jax_amem's compiled core (_core.*) is not in {folders or 'any installed jax_amem'}: "
                          "install jax-amem into the environment vLLM runs in")
    loaded = importlib.util.spec_from_file_location(_NAME, files[0])
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    sys.modules[_NAME] = module
    return module
