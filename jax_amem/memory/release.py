"""The paused arrays' device memory, released deterministically: no garbage collection per pause.

`jax.Array.delete()` frees the array's device buffers at once, whatever Python objects still
refer to the array, so pause() needs no `gc.collect()` to free what it deleted. It deletes, then
checks: each device's bytes in use must have dropped by the bytes the deleted arrays held there.
Only a buffer kept alive past `delete()` by something outside the array object (a DLPack export,
such as a torch view left in a reference cycle) can fail that check, and only then does pause
collect: generation 0 first, a full collection only if that was not enough. Every collection is
counted (PauseInfo.collections).

Why it matters: with torch and transformers imported, a full `gc.collect()` walks ~10^6 objects,
0.17-0.33 s per pause on the H200 whatever the state's size.

The device probes are injected (`in_use`, `trim`, `collect`) so the logic runs without a GPU.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Callable, Iterable, Optional

# A generation-0 collection first (cheap: only objects made since the last one), then everything.
GENERATIONS = (0, 2)


@dataclasses.dataclass(frozen=True)
class Released:
    collections: int         # gc.collect() calls pause needed (0 when the arrays held the only reference)
    still_held: dict         # ordinal -> bytes in use beyond the expectation at the end (empty when all came back)


def release(ordinals: Iterable[int], limit: dict, in_use: Callable[[int], Optional[int]],
            trim: Callable[[int], None], collect: Callable[[int], object] = gc.collect,
            settle_attempts: int = 3, settle_s: float = 0.002) -> Released:
    """Trims each device and checks that its bytes in use fell to `limit[ordinal]`.

    Call after deleting the arrays. `in_use(o)` is the bytes buffers hold on device `o`, or None
    where the allocator cannot say (then nothing is checked and nothing collected). A short
    wait comes first (XLA may return a buffer a moment after delete()), then the collections.
    """
    ordinals = list(ordinals)

    def held() -> dict:
        for o in ordinals:
            trim(o)
        over = {}
        for o in ordinals:
            now = in_use(o)
            if now is not None and o in limit and now > limit[o]:
                over[o] = now - limit[o]
        return over

    over = held()
    for _ in range(settle_attempts):
        if not over:
            break
        time.sleep(settle_s)
        over = held()
    collections = 0
    for generation in GENERATIONS:
        if not over:
            break
        collect(generation)
        collections += 1
        over = held()
    return Released(collections, over)
