"""The swap's one cache policy (jax_amem.swapping.cache) and its one `forget()`, and the
Destination protocol every kind of destination implements (the front door's only contract)."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem import reshard
from jax_amem.reshard import Layout
from jax_amem.swapping import cache, forget
from jax_amem.swapping.cross_host import Link, pairs
from jax_amem.swapping.destinations import Destination, JaxTree, TorchDestination, describe, is_destination
from jax_amem.swapping.same_host.ipc import RemoteTensors

# The caches of the swap, by what they hold: in process (programs, repeats, per-array facts), cross host.
CACHES = {"in-process programs", "repeat swaps (in process)", "layouts of arrays", "shard positions", "tree names",
          "cross-host packings", "cross-host sender programs", "cross-host receiver programs (JAX)",
          "cross-host unpack tables (PyTorch receiver, on the device)"}


def test_least_recently_used_goes_first(monkeypatch):
    monkeypatch.setattr(cache, "ENTRIES", 3)
    lru = cache.Lru("test")
    try:
        for k in "abc":
            lru.put(k, k.upper())
        assert lru.get("a") == "A"          # a is now the most recently used
        lru.put("d", "D")                   # evicts b, the least recently used
        assert [lru.get(k) for k in "abcd"] == ["A", None, "C", "D"] and len(lru) == 3
        lru.put("c", "C2")                  # a new value for a key: no eviction, now the newest
        lru.put("e", "E")                   # evicts a (c and d were used after it)
        assert [lru.get(k) for k in "acde"] == [None, "C2", "D", "E"]
    finally:
        cache._every.remove(lru)


def test_every_cache_of_the_swap_is_one_policy_and_forget_empties_them_all():
    assert CACHES <= set(cache.sizes())
    forget()
    src = {"w": jnp.arange(12.0).reshape(3, 4)}
    jax_amem.swap(src, {"w": jnp.zeros((3, 4))})
    trainer, rollout = (0, jax.devices("cpu")[0].id), (1, 0)
    plan = reshard.plan({"w": Layout.single((3, 4), np.float32, trainer)},
                        {"w": Layout.single((3, 4), np.float32, rollout)})
    pairs.packing(plan, plan.owner_id(trainer), plan.owner_id(rollout), 4096)
    filled = {name for name, n in cache.sizes().items() if n}
    assert {"in-process programs", "layouts of arrays", "shard positions", "tree names",
            "cross-host packings"} <= filled
    assert reshard.cache_info()["entries"]  # the swap's plans are reshard's, cached there alone
    forget()
    assert {name: n for name, n in cache.sizes().items() if n} == {}
    assert reshard.cache_info()["entries"] == 0


def test_every_kind_of_destination_is_a_destination():
    """The front door dispatches on the protocol alone: each kind implements it, and what is
    not one (a pytree, a mapping of tensors) is described as one."""
    torch = pytest.importorskip("torch")
    for kind in (TorchDestination, JaxTree, RemoteTensors, Link):
        assert issubclass(kind, Destination), kind
    assert not isinstance({"w": jnp.zeros(3)}, Destination)
    assert isinstance(describe({"w": jnp.zeros(3)}), JaxTree)
    assert isinstance(describe({"w": torch.zeros(3)}), TorchDestination)


def test_the_front_door_says_what_the_protocol_says_of_any_object():
    """describe's quick check (is_destination) against isinstance on the protocol itself: one
    of the kinds, an object of a user's class with both methods, one with a method missing, one
    whose attribute is not callable, and what users pass."""
    torch = pytest.importorskip("torch")

    class Both:
        def swap_from(self, *a, **k): ...
        def verify_from(self, *a, **k): ...

    class OnlySwap:
        def swap_from(self, *a, **k): ...

    class NotCallable(Both):
        verify_from = 3

    cases = [TorchDestination({"w": torch.zeros(3)}), Both(), OnlySwap(), NotCallable(), {"swap_from": 1},
             {"w": torch.zeros(3)}, [torch.zeros(3)], None, 3]
    assert [is_destination(c) for c in cases] == [True, True, False, False, False, False, False, False, False]
    for c in cases[:3] + cases[4:]:  # (3.11's isinstance takes a non-callable attribute for a method)
        assert is_destination(c) == isinstance(c, Destination), c
    both = Both()
    assert describe(both) is both


@pytest.mark.parametrize("first_is_tensor", [True, False])
@pytest.mark.parametrize("after_a_swap", [False, True])
def test_a_mapping_that_mixes_tensors_with_other_values_is_refused_by_name(first_is_tensor, after_a_swap):
    """describe looks at the first value only; every other value is checked before the full
    path reads the tensors, and a repeat matches values by identity: a mapping of tensors and
    something else is refused naming the odd one, whether it comes first or later, on the first
    swap or after swaps of the same tensors, with nothing written."""
    from jax_amem.swapping import SwapError

    torch = pytest.importorskip("torch")
    src = {f"t{i}": jnp.full((4,), i + 1.0) for i in range(3)}
    dst = {name: torch.zeros(4) for name in src}
    if after_a_swap:
        for _ in range(2):
            jax_amem.swap(src, dst, progress=False)
    before = {name: t.clone() for name, t in dst.items()}
    odd = np.zeros(4, np.float32)
    mixed = {"t0": odd, **{k: v for k, v in dst.items() if k != "t0"}} if not first_is_tensor else dict(dst, t2=odd)
    bad = "t0" if not first_is_tensor else "t2"
    with pytest.raises(SwapError, match=f"destination '{bad}' is a ndarray; the others are torch tensors"):
        jax_amem.swap(src, mixed, progress=False)
    for name, t in before.items():
        assert torch.equal(dst[name], t), name
