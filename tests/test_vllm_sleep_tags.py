"""Which of an engine's sleep-mode memory is asleep (jax_amem_vllm/sleep.py), against a stand-in
for vLLM's CuMemAllocator: its pool is one per process and keeps the allocations of an engine
shut down asleep, which must not make the next engine of the process look asleep. The real pool
runs in tests/test_vllm_gpu.py (the colocated loop, then an engine without sleep mode)."""

import sys
import types
from dataclasses import dataclass

import pytest

from jax_amem_vllm.sleep import asleep_tags


@dataclass
class Allocation:   # what vLLM's pool keeps per allocation: (device, size, address, handle), tag
    handle: tuple
    tag: str
    is_asleep: bool = False


def pool_with(monkeypatch, *allocations):
    pool = types.SimpleNamespace(pointer_to_data={a.handle[2]: a for a in allocations})
    module = types.ModuleType("vllm.device_allocator.cumem")
    module.CuMemAllocator = types.SimpleNamespace(instance=pool)
    for name in ("vllm", "vllm.device_allocator"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.device_allocator.cumem", module)


def allocation(address, size, tag, asleep):
    return Allocation((0, size, address, 0), tag, asleep)


def test_nothing_asleep_never_asks_for_the_engines_addresses(monkeypatch):
    pool_with(monkeypatch, allocation(0x1000, 0x1000, "weights", False))

    def own():
        raise AssertionError("asked for addresses with nothing asleep")
    assert asleep_tags(own) == []


def test_another_engines_sleeping_allocations_are_not_this_ones(monkeypatch):
    # An engine shut down asleep left 0x10000..0x20000 (weights) and 0x30000.. (kv) asleep; this
    # engine's weights are at 0x50000.. (awake) and its caches at 0x70000.. (awake).
    pool_with(monkeypatch, allocation(0x10000, 0x10000, "weights", True), allocation(0x30000, 0x10000, "kv_cache", True),
              allocation(0x50000, 0x10000, "weights", False), allocation(0x70000, 0x10000, "kv_cache", False))
    own = lambda: {"weights": [0x50000, 0x50100], "kv_cache": [0x70000]}  # noqa: E731
    assert asleep_tags(own) == []
    assert asleep_tags() == ["kv_cache", "weights"]   # the whole pool, as vLLM sees it


def test_this_engines_sleeping_allocations_are_told_by_address(monkeypatch):
    pool_with(monkeypatch, allocation(0x10000, 0x10000, "weights", True), allocation(0x50000, 0x10000, "weights", True),
              allocation(0x70000, 0x10000, "kv_cache", True))
    # A parameter inside an allocation (not at its start) counts; the end is exclusive.
    assert asleep_tags(lambda: {"weights": [0x5fff0], "kv_cache": [0x80000]}) == ["weights"]
    assert asleep_tags(lambda: {"weights": [0x60000]}) == ["kv_cache"]   # a tag not named counts wherever it sleeps


@pytest.mark.parametrize("addresses", [[], [0x0fff], [0x20000]])
def test_addresses_outside_every_sleeping_allocation(monkeypatch, addresses):
    pool_with(monkeypatch, allocation(0x10000, 0x10000, "weights", True))
    assert asleep_tags(lambda: {"weights": addresses}) == []
