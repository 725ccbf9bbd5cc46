"""The interposer's own host memory stays flat over pause/resume cycles, for every strategy.

Against the fake NCCL (tests/nccl_support/fake_nccl.cc), whose communicators are freed when
destroyed, what can grow per cycle is ours alone: the registry's records, the plan and
agreement arrays, the reports. Two counts are read, both exact rather than sampled pages, over
cycles of their own: malloc's bytes in use (glibc's `mallinfo2().uordblks`: the C++ core and
every native allocation), then Python's (tracemalloc, whose own tables are malloc'd). The
process's resident set also moves by what the allocators keep, which is not a leak. What the
real NCCL's own calls grow is measured on the GPU (`benchmarks/nccl_pause.py --rss`,
docs/nccl.md "Host memory over the cycles")."""

import ctypes

import pytest

from nccl_support.fixtures import fake_with_suspend  # noqa: F401 (fixture)
from nccl_support.harness import run_scenario

# glibc gives threads arenas of their own (up to 8 per core), each about 2.2 KiB of header
# counted as in use: the threads of the strategies (overlapped suspends, teardowns) would then
# add steps of it now and then over thousands of cycles. One arena (MALLOC_ARENA_MAX=1, glibc's
# policy only) leaves what the cycles themselves allocate; measured flat to 20000 cycles. The
# warm-up makes the caches, then a long window is read. A leak of one record per communicator
# and cycle would be >= 8 x 16 bytes a cycle here; a container that doubles as it leaks (a
# record a cycle) grows by half its size within the window.
WARM_UP, CYCLES, PYTHON_CYCLES = 1000, 3000, 1000
MAX_BYTES_PER_CYCLE = 8


def _has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _has_mallinfo2(), reason="needs glibc >= 2.33 (mallinfo2)")
@pytest.mark.parametrize("strategy", ["recreate", "suspend", "auto"])
def test_pause_resume_cycles_grow_no_memory_of_ours(fake_with_suspend, strategy):  # noqa: F811
    seen = run_scenario(fake_with_suspend, f"""
        STRATEGY, WARM_UP, CYCLES, PYTHON_CYCLES = {strategy!r}, {WARM_UP}, {CYCLES}, {PYTHON_CYCLES}
        import gc, tracemalloc

        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                "fordblks", "keepcost")]
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2

        lib = interposer()
        comms = [init_config(lib, make_id(f"c{{i}}"), 2, split_share=1) for i in range(4)]
        clear_log = ctypes.CDLL(os.environ["JAX_AMEM_NCCL_LIBRARY"], mode=os.RTLD_NOLOAD).fake_nccl_clear_log

        def cycles(count):
            for _ in range(count):
                nccl.pause(STRATEGY)
                nccl.resume()
                clear_log()   # the fake's call log is the fake's growth, not ours

        cycles(WARM_UP)       # caches, ctypes array types, learned rates: made once
        gc.collect()
        native = libc.mallinfo2().uordblks
        cycles(CYCLES)
        gc.collect()
        native = libc.mallinfo2().uordblks - native
        tracemalloc.start()   # after: its own tables are malloc'd
        python = tracemalloc.get_traced_memory()[0]
        cycles(PYTHON_CYCLES)
        gc.collect()
        python = tracemalloc.get_traced_memory()[0] - python
        out(native=native, python=python, live=len(nccl.communicators()),
            strategies=sorted({{c.last_strategy for c in nccl.communicators()}}))
    """, env={"FAKE_NCCL_VERSION": "23007", "MALLOC_ARENA_MAX": "1"}, timeout=300)
    assert seen["live"] == 8
    assert seen["strategies"] == (["recreate"] if strategy == "recreate" else ["suspend"])
    assert seen["native"] <= MAX_BYTES_PER_CYCLE * CYCLES, seen
    assert seen["python"] <= MAX_BYTES_PER_CYCLE * PYTHON_CYCLES, seen
