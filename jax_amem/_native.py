"""The compiled core, `jax_amem_core._core`: one module per process, shared with the vLLM worker's
half (jax_amem_vllm), which imports it from the same place without JAX. Missing, it is an error
that says how to build it."""

from jax_amem_core.native import core as _load

from .errors import NativeCoreMissingError

try:
    core = _load()
except ImportError as error:  # pragma: no cover - exercised only on broken installs
    raise NativeCoreMissingError(f"{error}") from error

__all__ = ["core"]
