"""What this machine offers: the CUDA driver, GPUs, and this build's CUDA kernels.

Nothing here starts JAX's backends, so it is safe to call before JAX is used.
"""

from __future__ import annotations

import dataclasses

from ._native import core
from .errors import GpuUnavailableError


@dataclasses.dataclass(frozen=True)
class GpuStatus:
    driver_available: bool
    driver_message: str
    device_count: int
    cuda_kernels_built: bool

    @property
    def usable(self) -> bool:
        return self.driver_available and self.device_count > 0 and self.cuda_kernels_built

    def why_not(self) -> str:
        if not self.driver_available:
            return self.driver_message
        if self.device_count == 0:
            return "the CUDA driver sees no GPU (check CUDA_VISIBLE_DEVICES)"
        if not self.cuda_kernels_built:
            return (
                "jax-amem was built without CUDA kernels (nvcc was not found at build time); "
                "reinstall it where the CUDA toolkit is installed"
            )
        return ""


def gpu_status() -> GpuStatus:
    """Never raises: reports whether GPU features can run here, and if not, why."""
    available, message = core.cuda.driver_status()
    count = core.cuda.device_count() if available else 0
    return GpuStatus(available, message, count, core.copy.have_cuda_kernels())


def require_gpu(feature: str) -> GpuStatus:
    """Raises GpuUnavailableError naming `feature` and what is missing."""
    status = gpu_status()
    if not status.usable:
        raise GpuUnavailableError(f"{feature} needs an NVIDIA GPU: {status.why_not()}.")
    return status


__all__ = ["GpuStatus", "gpu_status", "require_gpu"]
