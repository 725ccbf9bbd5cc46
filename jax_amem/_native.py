"""Loads the compiled core, with an error that says how to build it when it is missing."""

from .errors import NativeCoreMissingError

try:
    from . import _core as core
except ImportError as error:  # pragma: no cover - exercised only on broken installs
    raise NativeCoreMissingError(
        "jax_amem's compiled core (jax_amem._core) is missing: "
        f"{error}. Install the package (`pip install .` or `make install`) rather than "
        "importing it from the source tree."
    ) from error

__all__ = ["core"]
