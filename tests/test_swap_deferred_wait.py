"""One wait for many direct launches (jax_amem/swapping/in_process/deferred_wait.py): inside
`waits_deferred()` a direct launch returns once queued and the block waits for every launch
when it ends, on an error too; outside, each launch waits for itself. Real swaps on the CPU,
the wait recorded."""

import threading

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem.swapping.in_process import deferred_wait, direct
from jax_amem.swapping.in_process.direct import waits_deferred

torch = pytest.importorskip("torch")
from swap_probes import clean, raw  # noqa: E402,F401 - clean: an autouse fixture


def sources(count, salt=0):
    return {f"t{i}": jnp.arange(12, dtype=jnp.float32).reshape(3, 4) + 100 * i + salt for i in range(count)}


def holds(dst, src) -> bool:
    return all(np.array_equal(raw(dst[k]), np.asarray(v).reshape(-1).view(np.uint8)) for k, v in src.items())


@pytest.fixture
def waits(monkeypatch):
    """Every wait of the direct launch, as the list of streams it waited for."""
    seen = []
    synchronize = direct._synchronize
    monkeypatch.setattr(direct, "_synchronize", lambda launched: (seen.append(list(launched)), synchronize(launched)))
    return seen


def test_launches_in_the_block_are_waited_for_once_when_it_ends(waits):
    src = sources(3)
    dst = {k: torch.zeros(3, 4) for k in src}
    jax_amem.swap(src, dst, progress=False)
    assert waits == [[(-1, 0)]]   # outside a block: the launch waits for itself
    waits.clear()
    with waits_deferred() as pending:
        for salt in (1, 2):
            jax_amem.swap(sources(3, salt), dst, progress=False)
            assert waits == []
        assert deferred_wait.current() is pending
    assert waits == [[(-1, 0), (-1, 0)]]   # both swaps' streams, once
    assert deferred_wait.current() is None
    assert holds(dst, sources(3, 2))


def test_wait_inside_the_block_waits_for_what_was_launched_so_far(waits):
    dst = {k: torch.zeros(3, 4) for k in sources(2)}
    with waits_deferred() as pending:
        jax_amem.swap(sources(2, 1), dst, progress=False)
        pending.wait()
        assert waits == [[(-1, 0)]]
        jax_amem.swap(sources(2, 2), dst, progress=False)
    assert waits == [[(-1, 0)], [(-1, 0)]]


def test_an_error_in_the_block_waits_first_and_keeps_its_own_error(waits):
    dst = {k: torch.zeros(3, 4) for k in sources(2)}
    with pytest.raises(KeyError, match="the caller's"):
        with waits_deferred():
            jax_amem.swap(sources(2, 1), dst, progress=False)
            raise KeyError("the caller's")
    assert waits == [[(-1, 0)]]   # the copies were waited for before the error left
    assert deferred_wait.current() is None


def test_a_failed_wait_after_an_error_does_not_hide_the_error():
    def failing(launched):
        raise RuntimeError("the device failed")

    with pytest.raises(KeyError, match="the caller's"):
        with deferred_wait.deferred(failing) as pending:
            pending.add([(0, 1)])
            raise KeyError("the caller's")
    with pytest.raises(RuntimeError, match="the device failed"):   # without one, the wait's own
        with deferred_wait.deferred(failing) as pending:
            pending.add([(0, 1)])
    assert deferred_wait.current() is None


def test_kept_sources_live_until_the_wait():
    waited = []
    with deferred_wait.deferred(waited.append) as pending:
        kept = object()
        pending.keep(kept)
        assert pending._kept == [kept]
        pending.add([(0, 7)])
        pending.wait()
        assert pending._kept == [] and waited == [[(0, 7)]]
    assert waited == [[(0, 7)]]   # the block's end: nothing left to wait for


def test_disabled_blocks_change_nothing_and_blocks_do_not_nest(waits):
    dst = {k: torch.zeros(3, 4) for k in sources(1)}
    with waits_deferred(enabled=False) as pending:
        assert pending is None
        jax_amem.swap(sources(1, 1), dst, progress=False)
        assert waits == [[(-1, 0)]]
    with waits_deferred():
        with pytest.raises(RuntimeError, match="do not nest"):
            with waits_deferred():
                pass


def test_the_block_is_this_threads_own(waits):
    """A swap on another thread waits for itself while this thread's block is open."""
    dst = {k: torch.zeros(3, 4) for k in sources(1)}
    src = sources(1, 5)
    jax.block_until_ready(src)
    with waits_deferred():
        thread = threading.Thread(target=lambda: jax_amem.swap(src, dst, progress=False))
        thread.start()
        thread.join()
        assert waits == [[(-1, 0)]]
    assert holds(dst, src)


@pytest.mark.gpu
def test_gpu_work_queued_in_the_block_reads_the_new_values():
    """On a GPU the block's launches go on PyTorch's current stream: a kernel PyTorch queues
    after the swap, inside the block (before any host wait), reads the written values."""
    gpu = jax.devices("gpu")[0]
    cuda = torch.device("cuda", gpu.local_hardware_id)
    elements = (256 << 20) // 4   # a copy long enough for the host to run ahead of it
    src = {f"t{i}": jax.device_put(jnp.arange(elements, dtype=jnp.float32) * (i + 2), gpu) for i in range(2)}
    jax.block_until_ready(src)
    dst = {k: torch.full((elements,), float("nan"), device=cuda) for k in src}
    with waits_deferred() as pending:
        jax_amem.swap(src, dst, progress=False)
        pending.keep(src)
        sums = {k: t.double().sum() for k, t in dst.items()}   # queued after the copy, no host wait
    for i, (k, t) in enumerate(dst.items()):
        assert np.array_equal(t.cpu().numpy(), np.arange(elements, dtype=np.float32) * (i + 2))
        assert sums[k].item() == t.double().sum().item()
