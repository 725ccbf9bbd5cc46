"""The two ways the switch is compared with, run in the same process on the same model.

host: what users do today to get JAX weights into a PyTorch model: `jax.device_get` of the
    parameters (JAX's device -> host copy into numpy), the conversion in numpy (conversion.py:
    transposes), `model.load_state_dict` (PyTorch casts to the rollout's dtype and copies in).
resident: no pause at all: the rollout generates while the trainer's parameters and Adam
    state stay on the device. If that does not fit, the out-of-memory error is recorded, not
    raised: the summary says the baseline could not run.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from ..config import PolicyConfig
from .conversion import hf_arrays


@dataclasses.dataclass(frozen=True)
class HostBaseline:
    get_seconds: float        # jax.device_get of the parameters
    convert_seconds: float    # numpy conversion into torch tensors (CPU)
    load_seconds: float       # model.load_state_dict (host -> device copies and the cast)
    bytes_fetched: int        # parameter bytes copied to the host

    @property
    def seconds(self) -> float:
        return self.get_seconds + self.convert_seconds + self.load_seconds


@dataclasses.dataclass
class ResidentBaseline:
    iterations: int = 0
    rollout_seconds: list = dataclasses.field(default_factory=list)
    peak_iteration: int | None = None   # device bytes in use, whole iteration (None: no GPU)
    peak_rollout: int | None = None     # during the generation
    error: str | None = None            # why it could not run (out of memory), None when it ran

    @property
    def fitted(self) -> bool:
        return self.error is None


def _sync(model) -> None:
    import torch

    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_copy_and_load(params, model, config: PolicyConfig) -> HostBaseline:
    """Baseline (a), timed in its three parts; leaves `model` holding `params`."""
    import torch

    jax.block_until_ready(params)
    _sync(model)
    start = time.perf_counter()
    host = jax.device_get(params)
    fetched = time.perf_counter()
    # np.require: contiguous and writable (device_get's arrays are read-only; torch wants to own them)
    state = {name: torch.from_numpy(np.require(value, requirements=("C", "W")))
             for name, value in hf_arrays(host, config, with_tied=True)}
    converted = time.perf_counter()
    model.load_state_dict(state, strict=True)
    _sync(model)
    loaded = time.perf_counter()
    nbytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(host))
    return HostBaseline(fetched - start, converted - fetched, loaded - converted, nbytes)


def is_out_of_memory(error: BaseException) -> bool:
    """PyTorch's OutOfMemoryError, or XLA's RESOURCE_EXHAUSTED."""
    text = f"{type(error).__name__}: {error}"
    return "OutOfMemoryError" in text or "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()
