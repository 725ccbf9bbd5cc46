"""Whole-process memory: the allocator choice, the host staging pool, offload/reload, the report."""

from .allocator import AllocatorStatus, allocator_status, configure_allocator
from .report import DeviceMemory, MemoryReport, memory_report
from .staging import PoolStats, StagingPool, pool_stats, release_pinned_pool

__all__ = [
    "AllocatorStatus",
    "DeviceMemory",
    "MemoryReport",
    "PoolStats",
    "StagingPool",
    "allocator_status",
    "configure_allocator",
    "memory_report",
    "pool_stats",
    "release_pinned_pool",
]
