"""The swap's one cache policy: least recently used, ENTRIES entries per cache.

Every cache of the swap (the in-process plans and programs, the cross-host packings,
sender and receiver programs and device tables) is an `Lru` made here, so one rule bounds
them all and `forget()` (jax_amem.swapping.forget) empties every one of them. What a cache
holds: compiled programs (a program of the address route holds its tensors' addresses,
never the tensors), plans, packings, device tables (freed with their entry).
"""

from __future__ import annotations

from collections import OrderedDict

ENTRIES = 256  # per cache: a training run meets a handful of signatures; this bounds a sweep

_every: list["Lru"] = []


class Lru:
    """A bounded mapping: `get` marks an entry recently used, `put` evicts the least recently
    used once there are more than `ENTRIES`. `name` says what it holds (in `sizes()`)."""

    def __init__(self, name: str):
        self.name = name
        self._entries: OrderedDict = OrderedDict()
        _every.append(self)

    def get(self, key):
        """The value for `key` (now the most recently used), or None."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key, value):
        """Stores and returns `value`."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > ENTRIES:
            self._entries.popitem(last=False)
        return value

    def values(self):
        return list(self._entries.values())

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self):
        return f"Lru({self.name!r}, {len(self)} of {ENTRIES})"


def sizes() -> dict[str, int]:
    """{cache name: entries}: what the swap holds now."""
    return {c.name: len(c) for c in _every}


def forget() -> None:
    """Empties every cache of the swap."""
    for c in _every:
        c.clear()
