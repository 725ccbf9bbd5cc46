"""What of this process's vLLM memory is asleep (an engine started with enable_sleep_mode=True).

vLLM's sleep mode allocates the weights and the KV cache from its own pool (CuMemAllocator),
each under a tag ("weights", "kv_cache"); `llm.sleep()` unmaps both, `llm.wake_up(tags=[...])`
maps back the tags named. An address of a tag that sleeps is unmapped: a write there faults
the GPU (vLLM itself crashes on an update while it sleeps), so the backend asks first.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping


def asleep_tags(own: Callable[[], Mapping[str, Iterable[int]]] | None = None) -> list[str]:
    """The tags with memory asleep in this process, sorted ([] without sleep mode or vLLM's pool).

    `own()`: per tag, the addresses of one engine's memory of that tag (its parameters, its KV
    caches); an allocation of such a tag counts only where it holds one of them. The pool is one
    per process: an engine of this process shut down asleep can leave its allocations there,
    asleep, and they are not this engine's. A tag not in `own()` counts wherever it sleeps.
    `own` is called only where something sleeps (an update's start asks every time)."""
    try:
        from vllm.device_allocator.cumem import CuMemAllocator
    except Exception:  # noqa: BLE001 - no CUDA build of vLLM, no pool: nothing sleeps
        return []
    pool = getattr(CuMemAllocator, "instance", None)   # never made here: only a sleep-mode engine has one
    if pool is None:
        return []
    asleep = [(pointer, data) for pointer, data in pool.pointer_to_data.items() if getattr(data, "is_asleep", False)]
    if not asleep:
        return []
    wanted = {tag: sorted(set(addresses)) for tag, addresses in (own() if own else {}).items()}
    asleep = [(pointer, data) for pointer, data in asleep
              if data.tag not in wanted or _holds_any(pointer, data.handle[1], wanted[data.tag])]
    return sorted({data.tag for _, data in asleep})


def _holds_any(start: int, size: int, addresses: list[int]) -> bool:
    """Whether [start, start + size) holds one of the sorted `addresses`."""
    i = bisect.bisect_left(addresses, start)
    return i < len(addresses) and addresses[i] < start + size
