"""The ready/done protocol of a swap into another process on this host (CUDA IPC, ipc.py), over
a store (store.py: the rollout's TCPStore or the jax.distributed key-value store).

Rollout rank r (PyTorch):                       Trainer:
    end = RolloutIpc(store, tensors, rank=r)        end = TrainerIpc(store, rank=r)
      -> handles/r = descriptor (generation g)
    end.ready(v)  # after its stream is idle         end.swap(params, v, rules=...)
      -> ready/r/v = {generation}                      <- ready/r/v (reopens handles if g changed)
                                                       writes through the mapping, waits for the GPU
    end.wait(v)   # before its next forward            -> done/r/v = {ok, bytes, seconds}
      <- done/r/v

At the end `TrainerIpc.close()` unmaps and sets closed/r; `RolloutIpc.wait_closed()` waits for it
before the rollout frees its tensors or exits.

Keys are `jax_amem/swap/{group}/{handles|ready|done|closed}/{rank}[/{version}]`. Versions make a
stale message harmless: each side waits for the key of exactly its version, and deletes
the keys it consumed. After a reload (tensors at new addresses) the rollout calls
`publish(tensors)` (the next generation); the trainer maps the new handles before its next
swap and unmaps the old ones, so the old memory may be freed once that swap's `done` came.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ..errors import SwapError
from ..front_door import swap
from ..store import DEFAULT_TIMEOUT, as_store, key
from .ipc import export_tensors, open_remote


def _rank(rank) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise SwapError(f"rank={rank!r:.60}: give the rollout rank, an int >= 0")
    return rank


def _named(tensors, what: str) -> dict:
    if not isinstance(tensors, Mapping):
        raise SwapError(f"{what} is {type(tensors).__name__}: give a dict of names to tensors")
    return dict(tensors)


class RolloutIpc:
    """The rollout's end for one rank: publishes its tensors' handles, says when the trainer
    may write (`ready`) and waits until it has (`wait`). Holds the tensors, so their memory
    stays alive while the trainer may map it."""

    def __init__(self, store, tensors, *, rank: int = 0, group: str = "rollout", timeout: float = DEFAULT_TIMEOUT,
                 descriptor: dict | None = None):
        self.store, self.rank, self.group, self.timeout = as_store(store), _rank(rank), group, timeout
        self.generation = 0
        self.tensors = None
        self.publish(tensors, descriptor)

    def publish(self, tensors, descriptor: dict | None = None) -> dict:
        """Exports `tensors` (ipc.export_tensors; or gives `descriptor`, their export made
        already) under handles/{rank} as the next generation."""
        tensors = _named(tensors, "RolloutIpc: tensors")
        descriptor = _named(export_tensors(tensors) if descriptor is None else descriptor, "RolloutIpc: descriptor")
        try:
            text = json.dumps({**descriptor, "generation": self.generation + 1}).encode()
        except (TypeError, ValueError) as error:
            raise SwapError(f"RolloutIpc: the descriptor is not the JSON export_tensors makes ({error})") from None
        self.generation += 1
        descriptor["generation"] = self.generation
        self.tensors = tensors
        self.store.set(key(self.group, "handles", self.rank), text)
        return descriptor

    def ready(self, version: int) -> None:
        """After the rollout's GPU work is done (synchronised here): the trainer may write."""
        import torch

        for device in sorted({t.device.index or 0 for t in self.tensors.values() if t.device.type == "cuda"}):
            torch.cuda.synchronize(device)
        message = {"generation": self.generation}
        self.store.set(key(self.group, "ready", self.rank, int(version)), json.dumps(message).encode())

    def wait(self, version: int, timeout: float | None = None) -> dict:
        """Blocks until the trainer's swap `version` is written; returns its summary
        ({ok, version, bytes, seconds}); SwapError when the trainer's swap failed."""
        done = key(self.group, "done", self.rank, int(version))
        message = json.loads(self.store.get(done, self.timeout if timeout is None else timeout))
        self.store.delete(done)
        if not message.get("ok"):
            raise SwapError(f"the trainer's swap {version} into rank {self.rank} failed (the tensors hold the "
                            f"previous weights or a partial write only if the error says so): {message.get('error')}")
        return message

    def wait_closed(self, timeout: float | None = None) -> None:
        """Blocks until the trainer unmapped this rank's tensors (TrainerIpc.close): after
        that the rollout may free them or exit."""
        closed = key(self.group, "closed", self.rank)
        self.store.get(closed, self.timeout if timeout is None else timeout)
        self.store.delete(closed)


class TrainerIpc:
    """The trainer's end for one rollout rank: maps its published tensors and swaps into them
    when the rollout says it is ready."""

    def __init__(self, store, *, rank: int = 0, group: str = "rollout", timeout: float = DEFAULT_TIMEOUT,
                 mapper=None):
        self.store, self.rank, self.group, self.timeout = as_store(store), _rank(rank), group, timeout
        self.mapper = mapper
        self.remote = None
        self.generation = None

    def open(self, generation: int | None = None):
        """Maps the rank's published tensors (waiting for them); the previous mapping is closed."""
        descriptor = json.loads(self.store.get(key(self.group, "handles", self.rank), self.timeout))
        # The previous generation is unmapped first, whatever happens next: the `done` that
        # follows (even a failed one) lets the rollout free it.
        self._unmap()
        if generation is not None and descriptor.get("generation") != generation:
            raise SwapError(f"rank {self.rank} said it is ready with handles of generation {generation}, but the "
                            f"store holds generation {descriptor.get('generation')}: publish before ready")
        self.remote = open_remote(descriptor, self.mapper)
        self.generation = descriptor.get("generation")
        return self.remote

    def swap(self, params, version: int, **swap_kwargs):
        """Waits for ready/{rank}/{version}, swaps `params` into the rank's tensors (rules=,
        plan=, verify=... as jax_amem.swap), publishes done/{rank}/{version}; the SwapReport."""
        ready = key(self.group, "ready", self.rank, int(version))
        message = json.loads(self.store.get(ready, self.timeout))
        self.store.delete(ready)
        done = key(self.group, "done", self.rank, int(version))
        try:
            if self.remote is None or message.get("generation") != self.generation:
                self.open(message.get("generation"))
            report = swap(params, self.remote, version=int(version), **swap_kwargs)
        except Exception as error:
            self.store.set(done, json.dumps({"ok": False, "version": int(version), "error": str(error)}).encode())
            raise
        self.store.set(done, json.dumps({"ok": True, "version": report.version, "bytes": report.bytes,
                                         "seconds": report.seconds}).encode())
        return report

    def close(self) -> None:
        """Unmaps the rank's tensors (they stay the rollout's) and tells the rollout
        (closed/{rank}, RolloutIpc.wait_closed)."""
        # Set even when nothing is mapped (never swapped, or the last open failed): the rollout's
        # wait_closed would otherwise wait out its timeout for a mapping that does not exist.
        try:
            self._unmap()
        finally:
            self.store.set(key(self.group, "closed", self.rank), b"1")

    def _unmap(self) -> None:
        remote, self.remote, self.generation = self.remote, None, None
        if remote is not None:
            remote.close()
