"""The pause API: bookkeeping, the context manager, the NCCL seam and every error path (CPU)."""

import sys
import types

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem import process_pause
from jax_amem._native import core


pytestmark = pytest.mark.usefixtures("never_left_paused")


def live(*arrays):
    return all(not a.is_deleted() for a in arrays)


def test_pause_deletes_what_it_was_given_and_resume_returns_new_arrays():
    keep, drop = {"w": jnp.arange(4.0)}, [jnp.ones(3)]
    info = jax_amem.pause(keep=keep, drop=drop)
    assert jax_amem.is_paused() and process_pause.current_pause() is info
    assert keep["w"].is_deleted() and drop[0].is_deleted()
    with pytest.raises(RuntimeError, match="Array has been deleted"):
        keep["w"] + 1
    restored = jax_amem.resume()
    assert not jax_amem.is_paused() and process_pause.current_pause() is None
    assert restored.keep["w"] is not keep["w"] and live(restored.keep["w"], restored.drop[0])
    assert restored.bytes_reloaded == 16 and not restored.nccl_resumed


def test_pause_with_nothing_tagged_is_allowed():
    info = jax_amem.pause()
    assert info.arrays_kept == info.arrays_dropped == 0
    restored = jax_amem.resume()
    assert restored.keep is None and restored.drop is None


def test_pause_twice_is_refused_and_the_first_pause_stays_intact():
    first, second = jnp.arange(3.0), jnp.arange(5.0)
    jax_amem.pause(keep=[first])
    with pytest.raises(jax_amem.PauseError, match="already paused.*resume"):
        jax_amem.pause(keep=[second])
    assert live(second)
    np.testing.assert_array_equal(np.asarray(jax_amem.resume().keep[0]), np.arange(3.0))


def test_resume_without_pause_is_refused():
    with pytest.raises(jax_amem.PauseError, match="not paused"):
        jax_amem.resume()


@pytest.mark.parametrize("leaf, kind", [(np.ones(3), "numpy.ndarray"), (0.1, "float"),
                                        ("text", "str")])
def test_a_non_array_leaf_is_named_and_nothing_changes(leaf, kind):
    good = jnp.ones(2)
    with pytest.raises(jax_amem.PauseError, match=rf"keep\['lr'\] is a .*{kind}, not a jax.Array"):
        jax_amem.pause(keep={"good": good, "lr": leaf})
    assert live(good) and not jax_amem.is_paused()


def test_an_array_both_kept_and_dropped_is_refused():
    x, y = jnp.ones(2), jnp.zeros(2)
    with pytest.raises(jax_amem.PauseError, match=r"keep\[0\] and drop\['c'\].*either kept or dropped"):
        jax_amem.pause(keep=[x], drop={"c": x, "y": y})
    assert live(x, y) and not jax_amem.is_paused()


def test_an_array_deleted_before_pause_is_named():
    x, y = jnp.ones(2), jnp.ones(2)
    x.delete()
    with pytest.raises(jax_amem.PauseError, match=r"keep\['x'\] has been deleted.*before pause"):
        jax_amem.pause(keep={"x": x, "y": y})
    assert live(y) and not jax_amem.is_paused()


def test_an_array_donated_before_pause_is_named():
    params = jnp.ones(4)
    step = jax.jit(lambda p: p + 1, donate_argnums=0)
    new_params = step(params)
    with pytest.raises(jax_amem.PauseError, match=r"drop\[0\] has been deleted.*donated"):
        jax_amem.pause(drop=[params])
    assert live(new_params)


def test_pause_inside_jit_is_refused():
    with pytest.raises(jax_amem.PauseError, match="tracer.*inside jax.jit"):
        jax.jit(lambda x: jax_amem.pause(keep=[x]) and x)(jnp.ones(2))
    assert not jax_amem.is_paused()


def test_arrays_in_host_memory_kinds_are_refused():
    pinned = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
    host = jax.device_put(jnp.ones(2), pinned)
    with pytest.raises(jax_amem.PauseError, match="memory kind 'pinned_host'"):
        jax_amem.pause(keep=[host])


def test_a_failed_offload_changes_nothing(monkeypatch):
    x = jnp.arange(8.0)

    def broken(_table):
        raise RuntimeError("cuMemcpyDtoHAsync (offload): CUDA error 700")

    monkeypatch.setattr(core.memory, "start_copy_to_host", broken)
    with pytest.raises(jax_amem.PauseError, match="could not copy.*Nothing was paused or deleted"):
        jax_amem.pause(keep=[x])
    assert live(x) and not jax_amem.is_paused()
    assert jax_amem.memory.pool_stats().in_use_bytes == 0


def test_a_failed_allocation_on_resume_stays_paused_and_can_be_retried(monkeypatch):
    x = jnp.arange(8.0)
    jax_amem.pause(keep=[x])
    real = process_pause.array_io.allocate

    def out_of_memory(specs):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 32 bytes")

    monkeypatch.setattr(process_pause.array_io, "allocate", out_of_memory)
    message = "Still paused, nothing lost.*torch.cuda.empty_cache.*resume\\(\\) again"
    with pytest.raises(jax_amem.PauseError, match=message):
        jax_amem.resume()
    assert jax_amem.is_paused()
    monkeypatch.setattr(process_pause.array_io, "allocate", real)
    np.testing.assert_array_equal(np.asarray(jax_amem.resume().keep[0]), np.arange(8.0))


def test_a_failed_reload_stays_paused_and_can_be_retried(monkeypatch):
    x = jnp.arange(8.0)
    jax_amem.pause(keep=[x])
    real = core.memory.start_copy_to_device
    monkeypatch.setattr(core.memory, "start_copy_to_device",
                        lambda table: (_ for _ in ()).throw(RuntimeError("copy failed")))
    with pytest.raises(jax_amem.PauseError, match="could not copy the kept arrays back"):
        jax_amem.resume()
    assert jax_amem.is_paused()
    monkeypatch.setattr(core.memory, "start_copy_to_device", real)
    np.testing.assert_array_equal(np.asarray(jax_amem.resume().keep[0]), np.arange(8.0))


def test_the_pinned_pool_cannot_be_released_while_paused():
    jax_amem.pause(keep=[jnp.ones(1000)])
    with pytest.raises(RuntimeError, match="pause is in progress.*resume"):
        jax_amem.memory.release_pinned_pool()
    jax_amem.resume()
    stats = jax_amem.memory.release_pinned_pool()
    assert stats.reserved_bytes == 0 and stats.chunk_count == 0


def test_the_context_manager_pauses_inside_and_restores_after():
    state = {"w": jnp.arange(4.0)}
    with jax_amem.paused(keep=state, drop=[jnp.ones(2)]) as p:
        assert jax_amem.is_paused() and p.info.arrays_kept == 1
        with pytest.raises(jax_amem.PauseError, match="once the .* block has ended"):
            p.keep
    assert not jax_amem.is_paused()
    np.testing.assert_array_equal(np.asarray(p.keep["w"]), np.arange(4.0))
    np.testing.assert_array_equal(np.asarray(p.drop[0]), np.zeros(2))


def test_the_context_manager_resumes_when_the_block_raises():
    with pytest.raises(KeyError, match="rollout failed"):
        with jax_amem.paused(keep=[jnp.arange(3)]) as p:
            raise KeyError("rollout failed")
    assert not jax_amem.is_paused()
    np.testing.assert_array_equal(np.asarray(p.keep[0]), np.arange(3))


# ------------------------------------------------------------------ NCCL seam

class FakeNccl(types.ModuleType):
    """Stands in for jax_amem.nccl: records when it is paused and resumed."""

    def __init__(self, communicators=("comm",), fail_pause=False):
        super().__init__("jax_amem.nccl")
        self.calls, self._comms, self._fail = [], list(communicators), fail_pause
        self.watched = []

    def is_installed(self):
        return True

    def communicators(self):
        return self._comms

    def in_a_job(self):
        return False  # no jax.distributed peers

    def pause(self):
        self.calls.append(("pause", [a.is_deleted() for a in self.watched]))
        if self._fail:
            raise RuntimeError("rank 1 did not take part")

    def resume_owed(self):
        return bool(self._comms)

    def resume(self):
        self.calls.append(("resume", jax_amem.memory.pool_stats().in_use_bytes))


@pytest.fixture
def fake_nccl(monkeypatch):
    def install(**kwargs):
        fake = FakeNccl(**kwargs)
        monkeypatch.setattr(jax_amem, "nccl", fake, raising=False)
        monkeypatch.setitem(sys.modules, "jax_amem.nccl", fake)
        return fake
    return install


def test_nccl_is_paused_before_memory_is_freed_and_resumed_after_restoring(fake_nccl):
    nccl = fake_nccl()
    x = jnp.arange(4.0)
    nccl.watched = [x]
    info = jax_amem.pause(keep=[x])
    assert info.nccl_paused and nccl.calls == [("pause", [False])]
    restored = jax_amem.resume()
    assert restored.nccl_resumed and nccl.calls[1] == ("resume", 0)


def test_nccl_false_or_no_communicators_leaves_nccl_alone(fake_nccl):
    nccl = fake_nccl()
    jax_amem.pause(keep=[jnp.ones(2)], nccl=False)
    jax_amem.resume()
    quiet = fake_nccl(communicators=())
    assert not jax_amem.pause().nccl_paused
    jax_amem.resume()
    assert nccl.calls == [] and quiet.calls == []


def test_a_failed_nccl_pause_leaves_the_arrays_alive(fake_nccl):
    fake_nccl(fail_pause=True)
    x = jnp.arange(4.0)
    with pytest.raises(RuntimeError, match="rank 1 did not take part"):
        jax_amem.pause(keep=[x])
    assert live(x) and not jax_amem.is_paused()
    assert jax_amem.memory.pool_stats().in_use_bytes == 0
