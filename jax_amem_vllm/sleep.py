"""What of this process's vLLM memory is asleep (an engine started with enable_sleep_mode=True).

vLLM's sleep mode allocates the weights and the KV cache from its own pool (CuMemAllocator),
each under a tag ("weights", "kv_cache"); `llm.sleep()` unmaps both, `llm.wake_up(tags=[...])`
maps back the tags named. An address of a tag that sleeps is unmapped: a write there faults
the GPU (vLLM itself crashes on an update while it sleeps), so the backend asks first.
"""

from __future__ import annotations


def asleep_tags() -> list[str]:
    """The tags with memory asleep in this process, sorted ([] without sleep mode or vLLM's pool)."""
    try:
        from vllm.device_allocator.cumem import CuMemAllocator
    except Exception:  # noqa: BLE001 - no CUDA build of vLLM, no pool: nothing sleeps
        return []
    pool = getattr(CuMemAllocator, "instance", None)   # never made here: only a sleep-mode engine has one
    if pool is None:
        return []
    return sorted({data.tag for data in pool.pointer_to_data.values() if getattr(data, "is_asleep", False)})
