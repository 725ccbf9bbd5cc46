"""Every use jax-amem makes of JAX's private APIs, one small function each.

JAX does not promise these from one release to the next. Keeping them here means a JAX upgrade
that moves one breaks this module alone, and tests/test_jax_compat.py, which calls every
function below on the JAX installed, fails first and names the use. No other module under
jax_amem/ reads `jax._src` or a private attribute of JAX's objects (tests/test_jax_compat.py
checks that too).

Each function imports what it reads when it is called, so a missing private name breaks the
one feature that needs it, not `import jax_amem`. Where a public way exists and is only slower,
the function falls back to it and the caller never knows; where none exists, the error is
JAX's own.
"""

from __future__ import annotations

import jax

# ----------------------------------------------------------------------------- arrays


def shard_arrays(array) -> list | None:
    """The single-device arrays behind `array` in the order of `addressable_shards`, read from
    the list the array keeps (`ArrayImpl._arrays`: no Shard objects are made), or None where
    this JAX keeps no such list (callers then use `addressable_shards[i].data`)."""
    return getattr(array, "_arrays", None)


def sharding_attribute(arrays) -> str:
    """The attribute to read an array's sharding from, fastest for arrays like `arrays`: the one
    behind `ArrayImpl.sharding` (`_sharding`, read in C with no Python frame: a third of the
    repeat swap's check for thousands of arrays once) when it is the sharding for every one of
    them, else the public `sharding`."""
    if all(getattr(a, "_sharding", None) is a.sharding for a in arrays):
        return "_sharding"
    return "sharding"


def is_tracer(value) -> bool:
    """Whether `value` is an abstract value under a JAX transformation (jit, grad, vmap)."""
    return isinstance(value, jax.core.Tracer)


def weak_typed(array, dtype):
    """`array` cast to `dtype` with JAX's weak type set. Weak types change promotion (a weak f32
    scalar times bf16 stays bf16), so an array restored from a pause needs its weak type back
    for training to continue bit-identically; no public function sets it."""
    import numpy as np
    from jax._src.lax import lax as lax_internal

    return lax_internal._convert_element_type(array, np.dtype(dtype), weak_type=True)


def device_assignment(sharding) -> tuple | None:
    """The sharding's devices in its own order (what jit compares across a program's outputs),
    or None where the sharding does not say (callers then sort `device_set` by id)."""
    assignment = getattr(sharding, "_device_assignment", None)
    return tuple(assignment) if assignment is not None else None


# ----------------------------------------------------------------------------- executables


def direct_call(jitted, operands):
    """A function that runs `jitted`'s compiled XLA executable on arguments like `operands`
    directly (the loaded executable's `execute_sharded`), skipping jit's per-call checks of
    every operand; it returns a list per output of that output's single-device arrays.

    None where calling the executable plainly would skip something jit does for this program:
    operands it prunes, effects, host callbacks, mutable arrays; or where this JAX's compiled
    object does not look as expected (the caller keeps the jitted call)."""
    try:
        executable = jitted.lower(operands).compile()._executable
        call = executable.unsafe_call
        plain = (len(executable.in_avals) == len(operands) and len(call.kept_var_idx) == len(operands)
                 and not call.ordered_effects and not call.has_unordered_effects
                 and not call.has_host_callbacks and call.mut is None)
        execute = executable.xla_executable.execute_sharded
    except Exception:  # noqa: BLE001 - another JAX's internals: keep the jitted call
        return None
    if not plain:
        return None

    def run(arguments):
        return execute(arguments).disassemble_into_single_device_arrays()

    return run


def batched_wait():
    """A function that waits until every array of a list is ready in one C call
    (`xla_client.batched_block_until_ready`; `jax.block_until_ready` walks the list in Python:
    2000 arrays cost milliseconds), or jax.block_until_ready where this JAX has none."""
    try:
        from jax._src.lib import xla_client

        return xla_client.batched_block_until_ready
    except (ImportError, AttributeError):
        return jax.block_until_ready


# ----------------------------------------------------------------------------- backends


def started_backends() -> tuple[str, ...]:
    """The platforms ("cpu", "cuda", ...) whose backends JAX has already started; empty before
    the first one starts (after which XLA reads no more allocator settings)."""
    from jax._src import xla_bridge

    return tuple(xla_bridge._backends)


# ----------------------------------------------------------------------------- jax.distributed


def distributed_client():
    """The client of the jax.distributed coordinator's key-value store, or None when this
    process has not called `jax.distributed.initialize`."""
    try:
        from jax._src.distributed import global_state
    except ImportError:
        return None
    return global_state.client


def distributed_processes() -> tuple[int, int]:
    """(this process's id, the number of processes) under jax.distributed; (0, 1) outside it."""
    try:
        from jax._src.distributed import global_state
    except ImportError:
        return 0, 1
    return global_state.process_id, global_state.num_processes or 1


# ----------------------------------------------------------------------------- tracing


def user_line(eqn) -> str | None:
    """'file:line (function)' of the user's code that made the jaxpr equation `eqn` (JAX's own
    frames skipped), or None where it cannot be told (an error message then loses its line)."""
    try:
        from jax._src import source_info_util

        frame = source_info_util.user_frame(eqn.source_info.traceback)
    except Exception:  # noqa: BLE001 - the message only loses its line
        return None
    return f"{frame.file_name}:{frame.start_line} ({frame.function_name})" if frame else None
