"""The worker's batched commit copy (jax_amem_vllm/copies.py): every parameter gets its staged
tensor's exact bytes, in one call for many tensors of mixed dtypes and shapes; a list that does
not match is refused before anything is written. No vLLM needed: the module imports torch only."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from jax_amem_vllm import copies  # noqa: E402


def tensors(seed: int):
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 5), (7,), (2, 3, 4), (1,), (64, 8)]
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float32, torch.bfloat16]
    return [torch.randn(s, generator=g).to(d) for s, d in zip(shapes, dtypes)]


def raw(t):
    return t.reshape(-1).view(torch.uint8).numpy().copy()


@pytest.mark.parametrize("foreach", [True, False])
def test_every_parameter_gets_its_staged_bytes(monkeypatch, foreach):
    if not foreach:
        monkeypatch.setattr(copies, "_FOREACH_COPY", None)   # the per-tensor loop of an older torch
    staged, params = tensors(1), [torch.zeros_like(t) for t in tensors(2)]
    staged[1] = staged[1].new_tensor([float("nan"), -0.0, float("inf"), 1e-40, 3, 4, 5])  # bits, not values
    copies.copy_all(params, staged)
    for p, s in zip(params, staged):
        assert np.array_equal(raw(p), raw(s))
    copies.copy_all([], [])   # nothing to commit: nothing happens


def test_a_mismatch_is_refused_before_anything_is_written():
    staged, params = tensors(1), [torch.zeros_like(t) for t in tensors(2)]
    with pytest.raises(ValueError, match="5 parameters for 4 staged tensors"):
        copies.copy_all(params, staged[:4])
    wrong = staged[:4] + [staged[4].reshape(8, 64)]
    with pytest.raises(ValueError, match=r"parameter 4 has shape \(64, 8\) but its staged tensor \(8, 64\); nothing"):
        copies.copy_all(params, wrong)
    assert all(not p.any() for p in params)   # no parameter was written
