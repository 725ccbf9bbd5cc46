"""Registers the core's XLA FFI targets with JAX, for the "cpu" and "CUDA" platforms.

Registration only records handler addresses; it does not start a backend, so
it is safe at import time.
"""

from __future__ import annotations

import jax

from ._native import core

SEGMENT_COPY = "jax_amem_segment_copy"
SEGMENT_COPY_MANY = "jax_amem_segment_copy_many"
SEGMENT_COPY_TO_ADDRESSES = "jax_amem_segment_copy_to_addresses"
NCCL_SEND_BUCKET = "jax_amem_nccl_send_bucket"  # swapping/cross_host/send.py
NCCL_RECV_BUCKET = "jax_amem_nccl_recv_bucket"  # swapping/cross_host/receive_jax.py

_registered = False


def register_targets() -> None:
    global _registered
    if _registered:
        return
    for name, by_platform in core.ffi.targets().items():
        for platform, capsule in by_platform.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)
    _registered = True
