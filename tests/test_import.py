"""The package imports everywhere; GPU-only features name what is missing."""

import subprocess
import sys

import pytest

import jax_amem


def test_import_does_not_start_a_jax_backend():
    code = (
        "import jax_amem, jax._src.xla_bridge as xb; "
        "print(len(xb._backends))"
    )
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "0"


def test_gpu_status_never_raises_and_explains():
    status = jax_amem.gpu_status()
    assert isinstance(status.usable, bool)
    if not status.usable:
        assert status.why_not()


def test_require_gpu_raises_a_clear_error_without_gpu():
    status = jax_amem.gpu_status()
    if status.usable:
        pytest.skip("a GPU is present")
    with pytest.raises(jax_amem.errors.GpuUnavailableError, match=r"my_feature needs an NVIDIA GPU: .+"):
        jax_amem.platform.require_gpu("my_feature")


def test_cuda_helpers_raise_runtime_error_without_driver():
    status = jax_amem.gpu_status()
    if status.driver_available:
        pytest.skip("a CUDA driver is present")
    with pytest.raises(RuntimeError, match="libcuda.so.1"):
        jax_amem._core.cuda.mem_get_info(0)
