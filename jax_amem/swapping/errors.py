"""The swap's errors, members of jax-amem's one family (jax_amem/errors.py): raised before any
byte moves (SwapError), or after a donation with every array handed back (PartialSwapError)."""

from ..errors import PartialSwapError, SwapError

__all__ = ["PartialSwapError", "SwapError"]
