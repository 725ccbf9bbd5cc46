"""Test set-up: 8 XLA CPU devices when no GPU, and clean skips for `gpu` / `multigpu` tests."""

import os

# Before JAX starts: 8 CPU devices make sharding real on machines without a GPU.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest

import jax_amem  # noqa: E402  (first, as users do: before JAX starts a backend)


def _gpu_count() -> int:
    status = jax_amem.gpu_status()
    return status.device_count if status.usable else 0


def pytest_collection_modifyitems(config, items):
    count = _gpu_count()
    why = jax_amem.gpu_status().why_not() or "no GPU"
    for item in items:
        if "multigpu" in item.keywords and count < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2+ GPUs, found {count}: {why}"))
        elif "gpu" in item.keywords and count < 1:
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {why}"))


@pytest.fixture
def never_left_paused():
    """Fails a test that leaves the process paused (and resumes, so later tests run)."""
    yield
    if jax_amem.is_paused():
        jax_amem.resume()
        pytest.fail("the test left the process paused")
