"""What a swap reports: SwapReport for a swap this process writes itself (version, bytes per
transport, time, bandwidth), NcclSwapReport for one side of a swap over an NCCL link; and the
version numbering both share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import SwapError

# Transports, as the report names them.
DEVICE_LOCAL = "device-local"      # source shard and destination on one device: one batched copy
CROSS_DEVICE = "cross-device"      # source shard moved to the destination's device first (NVLink, PCIe)
NOT_IN_PLACE = "not-in-place"      # JAX destinations XLA could not write in place (new memory, same values)


@dataclass
class SwapReport:
    version: int
    bytes: int                      # destination bytes written (each once)
    seconds: float
    segments: int                   # (src_offset, dst_offset, bytes) rows copied
    launches: int                   # copy custom calls: one segment_copy_many / segment_copy_to_addresses
                                    # per chunk, and one per copy PyTorch makes; launched directly
                                    # (outside XLA): its driver copies and kernels (DirectCopy.launches)
    calls: int                      # jitted calls dispatched (groups of destination buffers)
    buffers: int                    # destination buffers written
    transports: dict[str, int] = field(default_factory=dict)  # bytes per transport
    staging_bytes: int = 0          # source bytes moved to another device before copying
    verified: bool = False
    plan_key: str = ""
    dst: Any = None                 # JAX destinations: the new pytree (the old arrays were donated)
    route: str = "batched"          # "addresses" (written by address) or "batched" (JAX, donated): in_process/routes.py

    @property
    def batched(self) -> bool:
        return self.route == "batched"

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        per = ", ".join(f"{name} {n / 2**20:.2f} MiB" for name, n in self.transports.items()) or "nothing"
        checked = ", verified" if self.verified else ""
        return (f"swap v{self.version}: {self.bytes / 2**20:.2f} MiB into {self.buffers} buffers in "
                f"{self.seconds * 1e3:.2f} ms ({self.gb_per_s:.2f} GB/s); {self.segments} segments, "
                f"{self.launches} copy launches ({self.route}) in {self.calls} calls; {per}; staging "
                f"{self.staging_bytes / 2**20:.2f} MiB{checked}")


_last_version = 0


def number_version(version) -> int:
    """The version a swap reports: `version` as given (a non-negative int), or one more than
    the last swap's of this process when None; every transport numbers through here."""
    global _last_version
    if version is None:
        version = _last_version + 1
    elif not isinstance(version, (int, np.integer)) or isinstance(version, bool) or version < 0:
        raise SwapError(f"version must be a non-negative int, got {version!r}")
    _last_version = int(version)
    return int(version)


@dataclass
class NcclSwapReport:
    """What one side of a swap over an NCCL link did (jax_amem.swapping.cross_host)."""
    role: str
    version: int
    bytes: int          # payload: destination bytes written (each once)
    wire_bytes: int     # bytes over the network, alignment padding included
    buckets: int
    peers: list[int]    # communicator ranks
    staging_bytes: int  # device memory of this side's staging slots
    seconds: float
    dst: object = None  # rollout: the destinations as they are now (JAX: the new pytree)

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")

    def __str__(self):
        return (f"nccl swap v{self.version} ({self.role}): {self.bytes / 2**20:.1f} MiB in {self.buckets} "
                f"bucket(s) with peers {self.peers} in {self.seconds * 1e3:.1f} ms ({self.gb_per_s:.2f} GB/s); "
                f"{self.wire_bytes / 2**20:.1f} MiB on the wire; staging {self.staging_bytes / 2**20:.1f} MiB")
