"""The CMake option JAX_AMEM_CUDA (AUTO | ON | OFF, from -D or the environment) decides whether
the CUDA kernels are compiled: AUTO only where a GPU driver is found. Configure-only runs of
CMake on this repository (no compile), each in a fresh build folder."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or not (ROOT / "CMakeLists.txt").exists(),
                                reason="needs cmake and the source tree")


def configure(tmp_path, *defines, env=None):
    environment = {k: v for k, v in os.environ.items() if k != "JAX_AMEM_CUDA"}
    environment.update(env or {})
    done = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"),
                           f"-DPython_EXECUTABLE={sys.executable}", *defines],
                          capture_output=True, text=True, timeout=300, env=environment)
    return done.returncode, done.stdout + done.stderr


def kernels(output: str) -> str:
    match = re.search(r"jax-amem: CUDA kernels (ON|OFF)", output)
    assert match, output[-3000:]
    return match.group(1)


def driver_present() -> bool:
    import jax_amem

    return jax_amem.gpu_status().driver_available


def test_a_bad_value_is_refused_naming_the_choices(tmp_path):
    code, out = configure(tmp_path, "-DJAX_AMEM_CUDA=maybe")
    assert code != 0 and "JAX_AMEM_CUDA is 'maybe': use AUTO, ON or OFF" in out


def test_auto_compiles_the_kernels_only_where_a_driver_is(tmp_path):
    pytest.importorskip("nanobind")
    code, out = configure(tmp_path)
    assert code == 0, out[-3000:]
    if driver_present():
        assert kernels(out) == "ON" or "nvcc was not found" in out
    else:
        assert kernels(out) == "OFF" and "no GPU driver (libcuda.so.1)" in out


def test_the_environment_variable_wins_over_the_cache(tmp_path):
    pytest.importorskip("nanobind")
    code, out = configure(tmp_path, "-DJAX_AMEM_CUDA=AUTO", env={"JAX_AMEM_CUDA": "OFF"})
    assert code == 0 and kernels(out) == "OFF" and "(JAX_AMEM_CUDA=OFF)" in out
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc: ON cannot compile kernels here")
    code, out = configure(tmp_path, env={"JAX_AMEM_CUDA": "ON"})  # same folder, cached AUTO/OFF
    assert code == 0 and kernels(out) == "ON", out[-3000:]
