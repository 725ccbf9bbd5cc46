"""What the two-process IPC tests and benchmark swap: shared by the rollout and the trainer
worker so both sides build the same names, shapes and values (numpy only)."""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parent.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))  # test_swap_llama: the model helpers and the oracle


def emit(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def many_specs(count: int = 600) -> dict:
    """Mixed dtypes and sizes, a few large: {name: (shape, numpy dtype name)}."""
    rng = np.random.default_rng(11)
    kinds = ["float32", "bfloat16", "int8", "float32"]
    specs = {f"t{i:04d}": ((int(rng.integers(1, 17)), int(rng.integers(1, 300))), kinds[i % 4]) for i in range(count)}
    specs.update({f"big{i}": ((1024, 2048 + i), "float32") for i in range(3)})  # 8 MiB each: bulk copies
    return specs


def many_values(seed: int) -> dict:
    """Any bit pattern (NaN payloads included) per tensor: the swap must copy bytes, not values."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in many_specs().items():
        dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
        raw = rng.integers(0, 256, int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
        out[name] = raw.view(dt).reshape(shape)
    return out


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
