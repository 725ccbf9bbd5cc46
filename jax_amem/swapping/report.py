"""SwapReport: what one swap did (version, bytes per transport, time, bandwidth)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    launches: int                   # copy custom calls: one segment_copy per transfer ("per-transfer"),
                                    # one segment_copy_many / segment_copy_to_addresses per chunk otherwise
    calls: int                      # jitted calls dispatched (groups of destination buffers)
    buffers: int                    # destination buffers written
    transports: dict[str, int] = field(default_factory=dict)  # bytes per transport
    staging_bytes: int = 0          # source bytes moved to another device before copying
    verified: bool = False
    plan_key: str = ""
    dst: Any = None                 # JAX destinations: the new pytree (the old arrays were donated)
    route: str = "per-transfer"     # "addresses" (PyTorch), "per-transfer" or "batched" (JAX): swap/program.py

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
