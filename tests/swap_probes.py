"""What the swap tests read of a swap: its one remembered program, a destination's bytes; and
a fixture that starts each test from a first swap (the swap's program and plan caches forgotten
before and after). Imported by test modules that need PyTorch, after they skip without it."""

import sys

import numpy as np
import pytest
import torch

from jax_amem.swapping import forget
from jax_amem.swapping.in_process import run


@pytest.fixture(autouse=True)
def clean():
    forget()
    yield
    forget()


def the_program():
    """The one program the test's swaps made (more than one is a failure of the test)."""
    (program,) = run._programs.values()
    return program


def raw(tensor) -> np.ndarray:
    """A PyTorch tensor's bytes, on the host, in row-major order."""
    return tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy().copy()


def python_work(call) -> dict:
    """Python function calls ("call") and C calls made from Python code ("c_call") while
    `call()` runs (sys.setprofile; C calls inside map() are not seen: the per-item work a
    native pass is allowed)."""
    seen = {"call": 0, "c_call": 0}

    def count_events(frame, event, arg):
        if event in seen:
            seen[event] += 1

    sys.setprofile(count_events)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen
