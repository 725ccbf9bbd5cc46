"""XLA's GPU allocator, chosen so that a pause can give its pool back to the driver.

Measured on an H200 (docs/pause.md, "The allocator's pool"): XLA's default allocator (BFC)
keeps its preallocation (75% of the GPU) until the process ends, whatever is
deleted. With ``XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async`` XLA allocates from the
device's CUDA memory pool, and ``cuMemPoolTrimTo(pool, 0)`` returns every unused
byte of it once the arrays are deleted. XLA reads the variable once, when it
starts its GPU backend, so it must be set before that: ``import jax_amem`` does it
(unless the user chose an allocator, or opted out with
``JAX_AMEM_CONFIGURE_ALLOCATOR=0``).
"""

from __future__ import annotations

import dataclasses
import os

from .. import settings

ALLOCATOR_VARIABLE = "XLA_PYTHON_CLIENT_ALLOCATOR"
OPT_OUT_VARIABLE = "JAX_AMEM_CONFIGURE_ALLOCATOR"
RETURNING_ALLOCATOR = "cuda_async"
# Allocators that give memory back by themselves when arrays are deleted.
RETURNS_ON_DELETE = ("platform",)

HOW_TO_FIX = (
    f"import jax_amem before JAX starts its GPU backend (before the first jax.devices(), "
    f"jnp array or jit call), or set {ALLOCATOR_VARIABLE}={RETURNING_ALLOCATOR} in the "
    "environment before starting Python"
)


@dataclasses.dataclass(frozen=True)
class AllocatorStatus:
    """Which allocator XLA uses (as far as can be known) and what jax_amem did about it."""

    allocator: str  # the variable's value when XLA read it, or "default" (BFC)
    configured_by_jax_amem: bool
    note: str

    @property
    def returns_pool(self) -> bool:
        """True when a pause can give the allocator's idle memory back to the driver."""
        return self.allocator in (RETURNING_ALLOCATOR,) + RETURNS_ON_DELETE

    @property
    def needs_trim(self) -> bool:
        return self.allocator == RETURNING_ALLOCATOR


_configured_by_us = False
_too_late = False


def backends_started() -> bool:
    """True once JAX has created any backend (after which XLA ignores the variable)."""
    from .. import _jax_compat

    return bool(_jax_compat.started_backends())


def configure_allocator() -> AllocatorStatus:
    """Selects XLA's cuda_async allocator, if JAX has not started and the user chose none.

    Returns what was decided; never raises. Safe to call more than once.
    """
    global _configured_by_us, _too_late
    _too_late = backends_started()
    if not _too_late and not os.environ.get(ALLOCATOR_VARIABLE):
        os.environ[ALLOCATOR_VARIABLE] = RETURNING_ALLOCATOR
        _configured_by_us = True
    return allocator_status()


def configure_at_import() -> AllocatorStatus | None:
    """`import jax_amem`'s call: configures unless ``JAX_AMEM_CONFIGURE_ALLOCATOR=0``."""
    if not settings.flag(OPT_OUT_VARIABLE, True):
        return None
    return configure_allocator()


def allocator_status() -> AllocatorStatus:
    """What XLA's GPU allocator is, or will be when JAX starts; changes nothing.

    XLA reads the variable when it starts its GPU backend, so its value now is
    what XLA used unless someone changed it after JAX started.
    """
    chosen = os.environ.get(ALLOCATOR_VARIABLE)
    ours = _configured_by_us and chosen == RETURNING_ALLOCATOR
    if ours:
        note = f"{ALLOCATOR_VARIABLE}={chosen} set by jax_amem"
    elif chosen:
        note = f"{ALLOCATOR_VARIABLE}={chosen} set by the user"
    else:
        note = f"{ALLOCATOR_VARIABLE} unset"
    if _too_late and not ours:
        note += "; JAX had started its backends before jax_amem could choose the allocator"
    return AllocatorStatus(chosen or "default", ours, note)


def pool_return_problem(status: AllocatorStatus | None = None) -> str:
    """Why a pause cannot return the allocator's pool, or "" when it can."""
    status = status or allocator_status()
    if status.returns_pool:
        return ""
    return (f"XLA's allocator is '{status.allocator}' ({status.note}): it keeps its pool "
            f"after arrays are deleted, so pause() freed the arrays but not the pool. To fix it, "
            f"{HOW_TO_FIX}.")
