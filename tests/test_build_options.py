"""The CMake option JAX_AMEM_CUDA (AUTO | ON | OFF, from -D or the environment) decides whether
the CUDA kernels are compiled: AUTO only where a GPU driver is found. Configure-only runs of
CMake on this repository (no compile), each in a fresh build folder.

And the kernels' compile-time options (KERNEL_OPTIONS: the two of src/copy/transpose_tuning.h
that scripts/tune_transpose.sh times, the only ones left): each one's other value compiles with
nvcc for sm_90, and a value the kernel refuses fails on its static_assert, which proves the
option reaches the kernel's code (a misspelt or unread one would compile to the default)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None or not (ROOT / "CMakeLists.txt").exists(),
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


@needs_cmake
def test_a_bad_value_is_refused_naming_the_choices(tmp_path):
    code, out = configure(tmp_path, "-DJAX_AMEM_CUDA=maybe")
    assert code != 0 and "JAX_AMEM_CUDA is 'maybe': use AUTO, ON or OFF" in out


@needs_cmake
def test_auto_compiles_the_kernels_only_where_a_driver_is(tmp_path):
    pytest.importorskip("nanobind")
    code, out = configure(tmp_path)
    assert code == 0, out[-3000:]
    if driver_present():
        assert kernels(out) == "ON" or "nvcc was not found" in out
    else:
        assert kernels(out) == "OFF" and "no GPU driver (libcuda.so.1)" in out


@needs_cmake
def test_the_environment_variable_wins_over_the_cache(tmp_path):
    pytest.importorskip("nanobind")
    code, out = configure(tmp_path, "-DJAX_AMEM_CUDA=AUTO", env={"JAX_AMEM_CUDA": "OFF"})
    assert code == 0 and kernels(out) == "OFF" and "(JAX_AMEM_CUDA=OFF)" in out
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc: ON cannot compile kernels here")
    code, out = configure(tmp_path, env={"JAX_AMEM_CUDA": "ON"})  # same folder, cached AUTO/OFF
    assert code == 0 and kernels(out) == "ON", out[-3000:]


# option: (the file that reads it, its other value, a value the kernel refuses, the refusal's text).
KERNEL_OPTIONS = {
    "AMEM_TRANSPOSE_STEPPED_VECTOR": ("src/copy/transpose_cuda.cu", "1", "2",
                                      "AMEM_TRANSPOSE_STEPPED_VECTOR is 0 or 1"),
    "AMEM_TRANSPOSE_STEPPED_BLOCKS_PER_SM": ("src/copy/transpose_cuda.cu", "4", "0",
                                             "AMEM_TRANSPOSE_STEPPED_BLOCKS_PER_SM is 1 to 16"),
}
# An option: a macro with a numeric default that a -D flag overrides.
OPTION = re.compile(r"^#ifndef (AMEM_\w+)\n#define \1 \d+$", re.MULTILINE)


def nvcc() -> str | None:
    for found in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if found and Path(found).exists():
            return found
    return None


def compile_kernel(tmp_path, source: str, *defines: str):
    compiler = nvcc()
    if compiler is None or not (ROOT / source).exists():
        pytest.skip("needs nvcc (the CUDA toolkit) and the source tree")
    done = subprocess.run([compiler, "-c", "-std=c++17", "-O3", "-arch=sm_90", f"-I{ROOT / 'src'}",
                           "-Xcompiler", "-ffp-contract=off", *defines, str(ROOT / source),
                           "-o", str(tmp_path / "kernel.o")], capture_output=True, text=True, timeout=900)
    return done.returncode, done.stdout + done.stderr


def test_every_kernel_option_in_the_sources_is_one_this_file_builds():
    found = {name for path in (ROOT / "src").rglob("*") if path.suffix in (".h", ".cu", ".cc")
             for name in OPTION.findall(path.read_text())}
    assert found == set(KERNEL_OPTIONS), "a kernel option without its build test here, or one gone from src/"


@pytest.mark.parametrize("option", KERNEL_OPTIONS)
def test_each_kernel_option_compiles_and_reaches_the_kernel(tmp_path, option):
    source, other, refused, refusal = KERNEL_OPTIONS[option]
    code, out = compile_kernel(tmp_path, source, f"-D{option}={refused}")
    assert code != 0 and refusal in out, out[-3000:]
    code, out = compile_kernel(tmp_path, source, f"-D{option}={other}")
    assert code == 0 and (tmp_path / "kernel.o").stat().st_size > 0, out[-3000:]
