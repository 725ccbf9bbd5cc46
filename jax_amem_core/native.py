"""The compiled core (`jax_amem_core._core`, the nanobind extension built from src/), imported once
per process by whichever side comes first: `jax_amem` (a JAX trainer) or `jax_amem_vllm` (a vLLM
worker, which must not import JAX). Both import it here, by its one module name, so a process
never holds two copies of the library (nanobind registers its types to the first copy only).

`core()` is a function, not a module attribute, so that modules without a compiled core (a
source tree) still import, and tests can stand in for it with a fake."""

from __future__ import annotations

import importlib

NAME = "jax_amem_core._core"


def core():
    """The compiled core; ImportError saying how to get it when it is not built."""
    try:
        return importlib.import_module(NAME)
    except ImportError as error:
        raise ImportError(f"jax-amem's compiled core ({NAME}) is not importable: {error}. Install jax-amem "
                          "(`pip install .` or `make install`) into the environment this process runs in, "
                          "rather than importing it from the source tree") from error
