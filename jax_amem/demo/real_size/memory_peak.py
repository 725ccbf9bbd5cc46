"""Peak device memory over a stretch of the loop, sampled on a thread.

The figure is the driver's: total minus free bytes of one GPU (cuMemGetInfo), so it counts
JAX, PyTorch, NCCL and the CUDA contexts together, as a second model sharing the GPU would
see them. Sampled every `period` seconds (5 ms: what a train step or a generation holds for
longer than that is seen; a shorter spike may not be). Without a GPU every peak is None.
"""

from __future__ import annotations

import threading

from ..._native import core


class Window:
    """One stretch of the loop; `peak` is the most bytes in use seen inside it (None: no GPU)."""

    def __init__(self):
        self.peak: int | None = None

    def see(self, used: int) -> None:
        self.peak = used if self.peak is None else max(self.peak, used)


class PeakSampler:
    """`with sampler.window() as w: ...` then `w.peak`. Start it with `with PeakSampler(ordinal):`."""

    def __init__(self, ordinal: int | None, period: float = 0.005):
        self.ordinal, self.period = ordinal, period
        self._open: list[Window] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def _used(self) -> int:
        free, total = core.cuda.mem_get_info(self.ordinal)
        return total - free

    def _sample(self) -> None:
        if self.ordinal is None:
            return
        used = self._used()
        with self._lock:
            for window in self._open:
                window.see(used)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def __enter__(self) -> "PeakSampler":
        if self.ordinal is not None:
            self._thread = threading.Thread(target=self._run, name="jax-amem peak memory sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> bool:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return False

    def window(self) -> "_Opened":
        return _Opened(self)


class _Opened:
    def __init__(self, sampler: PeakSampler):
        self.sampler, self.window = sampler, Window()

    def __enter__(self) -> Window:
        with self.sampler._lock:
            self.sampler._open.append(self.window)
        self.sampler._sample()
        return self.window

    def __exit__(self, *exc_info) -> bool:
        self.sampler._sample()
        with self.sampler._lock:
            self.sampler._open.remove(self.window)
        return False
