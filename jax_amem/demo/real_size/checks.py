"""The loop's two correctness checks.

exact: after a swap, every rollout parameter holds, bit for bit, what an independent numpy
    conversion (conversion.py) of the trainer's parameters gives, cast to the rollout's dtype
    by numpy (round to nearest even, as XLA's convert). Names, shapes and bytes all compared.
logits: the rollout's logits against the JAX policy's (float32, full-precision matmuls) on
    the same tokens, max |difference| / max |logit| within a tolerance that depends on the
    rollout's dtype (see LOGITS_TOLERANCE: 1e-1 for bf16, whose rounding alone measured 2.8e-2
    at the 1.7B size).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..config import PolicyConfig
from ..loop import LogitsCheck, check_logits
from .conversion import hf_arrays

# max |jax - torch| / max |logit| allowed, by the rollout's dtype. float32: both sides compute
# in float32, only the order of sums differs (the small demo's 1e-4). bfloat16: the rollout
# rounds every weight and activation to 8 significant bits (relative step 2^-8 = 3.9e-3), and
# the error grows with depth and width. Measured on CPU (torch 2.13, random init): 4.5e-3 at
# qwen3-tiny (2 layers, d=64), 1.6e-2 at 28 layers d=512, 2.8e-2 at qwen3-1.7b's own sizes.
# 1e-1 leaves 3.5x for the GPU's kernels (flash attention rounds its probabilities to bf16).
# A wiring fault measured at 28 layers d=512 moved the logits by 0.1 (the last layer's MLP
# rows reversed) to 0.6 (the first layer's query heads rolled): the check catches gross
# faults; the exact check, bit for bit on every weight, is what proves the swap.
LOGITS_TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-1}


@dataclasses.dataclass(frozen=True)
class ExactCheck:
    iteration: int
    tensors: int                 # rollout parameters compared
    bytes: int
    mismatched: tuple = ()       # names whose bytes (or shape) differ, or that one side lacks
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.tensors > 0 and not self.mismatched


def _bits(array: np.ndarray) -> np.ndarray:
    return array.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[array.dtype.itemsize])


def _numpy_dtype(tensor):
    """The numpy dtype of a torch tensor's elements (bfloat16: JAX's, i.e. ml_dtypes')."""
    name = str(tensor.dtype).removeprefix("torch.")
    return jnp.bfloat16 if name == "bfloat16" else np.dtype(name)


def _torch_bits(tensor) -> np.ndarray:
    import torch

    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return _bits(tensor.detach().cpu().contiguous().view(width).numpy())


def exact_check(params, model, config: PolicyConfig, iteration: int) -> ExactCheck:
    """Compares the rollout model's parameters with the numpy conversion of `params`."""
    start = time.perf_counter()
    host = jax.device_get(params)
    tensors = dict(model.named_parameters())
    mismatched, compared, nbytes = [], 0, 0
    for name, value in hf_arrays(host, config):
        tensor = tensors.pop(name, None)
        if tensor is None:
            mismatched.append(f"{name} (not a parameter of the rollout)")
            continue
        expected = value.astype(_numpy_dtype(tensor))
        got = _torch_bits(tensor)
        compared += 1
        nbytes += got.nbytes
        if got.shape != expected.shape or not np.array_equal(got, _bits(expected)):
            mismatched.append(name)
    mismatched += [f"{name} (not written by the conversion)" for name in tensors]
    return ExactCheck(iteration, compared, nbytes, tuple(mismatched), time.perf_counter() - start)


def logits_check(trainer, roll, tokens: np.ndarray, iteration: int, dtype: str) -> LogitsCheck:
    check = check_logits(trainer, roll, tokens, iteration)
    return dataclasses.replace(check, tolerance=LOGITS_TOLERANCE[dtype])
