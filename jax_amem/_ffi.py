"""The core's XLA FFI targets: registered with JAX, and named for their callers.

The C++ module lists its targets (`_core.ffi.targets()`: each src/ffi/<target>.cc registers
itself), so a target's name is written once, in C++. This module binds each name to an
attribute, `jax_amem_segment_copy` -> `SEGMENT_COPY`, and registers every handler with
`jax.ffi` for its platforms ("cpu", "CUDA"). Registration only records handler addresses; it
does not start a backend, so it is safe at import time.
"""

from __future__ import annotations

import jax

from ._native import core

PREFIX = "jax_amem_"
TARGETS: dict = core.ffi.targets()  # {name: {platform: handler capsule}}

for _name in TARGETS:
    globals()[_name.removeprefix(PREFIX).upper()] = _name

_registered = False


def register_targets() -> None:
    global _registered
    if _registered:
        return
    for name, by_platform in TARGETS.items():
        for platform, capsule in by_platform.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)
    _registered = True
