"""The core's XLA FFI targets: named here, registered with JAX.

Each target's name is written here once for Python (its callers: jax_amem/copy.py,
jax_amem/affine_copy.py and jax_amem/transport.py) and once in the C++ table (src/ffi/targets.cc), which the module hands
over with each target's handlers (`_core.ffi.targets()`: {name: {platform: capsule}}).
`register_targets` registers every handler with `jax.ffi` for its platforms ("cpu", "CUDA")
after checking that the two lists agree, so a core built from other sources is named as such
instead of failing later inside XLA. Registration only records handler addresses; it does not
start a backend, so it is safe at import time.
"""

from __future__ import annotations

import jax

from ._native import core

SEGMENT_COPY_MANY = "jax_amem_segment_copy_many"
SEGMENT_COPY_TO_ADDRESSES = "jax_amem_segment_copy_to_addresses"
NCCL_SEND_BUCKET = "jax_amem_nccl_send_bucket"
NCCL_RECV_BUCKET = "jax_amem_nccl_recv_bucket"
AFFINE_COPY_MANY = "jax_amem_affine_copy_many"
AFFINE_COPY_TO_ADDRESSES = "jax_amem_affine_copy_to_addresses"
NAMES = (SEGMENT_COPY_MANY, SEGMENT_COPY_TO_ADDRESSES, NCCL_SEND_BUCKET, NCCL_RECV_BUCKET,
         AFFINE_COPY_MANY, AFFINE_COPY_TO_ADDRESSES)

TARGETS: dict = core.ffi.targets()  # {name: {platform: handler capsule}}, the C++ table

_registered = False


def check_table(table=None) -> None:
    """RuntimeError unless the compiled table holds exactly the targets named here."""
    names = set(TARGETS if table is None else table)
    if names != set(NAMES):
        raise RuntimeError(f"jax_amem's compiled core has FFI targets {sorted(names)}, but this package names "
                           f"{sorted(NAMES)}: the core was built from other sources; rebuild the package "
                           "(make install, or pip install . --no-build-isolation)")


def register_targets() -> None:
    global _registered
    if _registered:
        return
    check_table()
    for name, by_platform in TARGETS.items():
        for platform, capsule in by_platform.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)
    _registered = True
