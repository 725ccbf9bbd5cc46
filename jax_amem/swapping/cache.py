"""The swap's one cache policy: least recently used, ENTRIES entries per cache.

Every cache of the swap (the in-process programs, the cross-host packings, sender and
receiver programs and device tables) is an `Lru` made here, so one rule bounds them all and
`forget()` (jax_amem.swapping.forget) empties every one of them; per-array facts read
thousands of times a swap (layouts, shard positions, tree names) are a `Memoized` function or
a `Table` (lookups with no Python frame), which `forget()` empties too. Plans are the
planner's alone (jax_amem.reshard's cache), and `forget()` empties that as well. What a cache
holds: compiled programs (a program of the address route holds its tensors' addresses,
never the tensors), plans, packings, device tables (freed with their entry).
"""

from __future__ import annotations

import atexit
import functools
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
    """Empties every cache of the swap, and the planner's plans (the swap keeps none of its own)."""
    from ..reshard import clear_cache

    for c in _every:
        c.clear()
    clear_cache()


@atexit.register
def _empty_at_exit() -> None:
    # The entries hold native objects (compiled copies, layouts, address tables): freed while
    # the interpreter still runs, not left to its teardown, where nanobind counts whatever is
    # still alive as leaked and says so on stderr.
    for c in _every:
        c.clear()


class Memoized:
    """A pure function of hashable arguments, cached least recently used (functools' cache,
    so a hit costs no Python frame: for per-array facts read thousands of times a swap), and
    emptied by `forget()` like every `Lru`."""

    def __init__(self, name: str, function, entries: int):
        self.name = name
        self.call = functools.lru_cache(maxsize=entries)(function)
        _every.append(self)

    def clear(self) -> None:
        self.call.cache_clear()

    def __len__(self) -> int:
        return self.call.cache_info().currsize

    def __repr__(self):
        return f"Memoized({self.name!r}, {len(self)} of {self.call.cache_info().maxsize})"


def memoized(name: str, entries: int = ENTRIES):
    """Decorator: the function as a `Memoized` cache's call."""
    def wrap(function):
        return Memoized(name, function, entries).call
    return wrap


class Table(dict):
    """A plain dict (its lookups cost no Python frame) of per-array facts, emptied by
    `forget()` like every `Lru`, and emptied whole once it would hold more than `entries`
    (`add` is called on a miss only)."""

    def __init__(self, name: str, entries: int = ENTRIES):
        super().__init__()
        self.name, self.entries = name, entries
        _every.append(self)

    def add(self, key, value):
        """Stores and returns `value`."""
        if len(self) >= self.entries:
            self.clear()
        self[key] = value
        return value
