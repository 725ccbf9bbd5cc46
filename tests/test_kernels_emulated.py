"""The CUDA kernels of src/copy run on CPU threads (tests/native/cuda_emulation.h) against the CPU
loops, on random tables: the segment copy, the affine copy and the fused transpose-and-cast copy,
plain and with constant steps; and a DirectCopy made for device 0 with every kind of row, its
device table, driver copies and launches on the emulated device. The affine kernel again in its
compile-time variants (AFFINE_VARIANTS: what scripts/tune_affine.sh measures on the GPU). Built
here with g++ and CUDA's headers, under AddressSanitizer and UndefinedBehaviorSanitizer, so a read
or write outside a buffer, or a misaligned one, fails too.

This checks the kernels' own code (indices, tiles, bounds, the work-unit search, shared memory,
the arithmetic) where no GPU is: a kernel that runs on the H200 is still proved there
(scripts/gpu_test.sh); one that differs from its CPU loop here fails before it gets there."""

import concurrent.futures
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "tests" / "native"
KERNELS = ["copy_cuda", "affine_cuda", "transpose_cuda"]
# The CPU loops and the row checks; the direct launch, whose device path runs on the emulated
# device (tests/native/fake_driver.cc in place of the driver).
LOOPS = ["segments", "copy_cpu", "affine", "affine_cpu", "transpose", "direct_launch"]
CASES, SEEDS = 20, (1, 2)


def cuda_include() -> Path | None:
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "include" / "cuda_runtime.h").exists():
            return Path(root) / "include"
    return None


# The affine kernel's compile-time variants (the AMEM_AFFINE_* macros of src/copy/affine_cuda.cu,
# which scripts/tune_affine.sh measures on the GPU): every load pattern, thread count, loads in
# flight, grid and packing, each equal to the CPU loop too.
AFFINE_VARIANTS = {
    "warp runs, 128 threads, 8 in flight, a block per piece":
        ["-DAMEM_AFFINE_PATTERN=1", "-DAMEM_AFFINE_THREADS=128", "-DAMEM_AFFINE_IN_FLIGHT=8", "-DAMEM_AFFINE_GRID=0"],
    "pipelined, 2 in flight, balanced grid, packed bfloat16, programs kept":
        ["-DAMEM_AFFINE_PATTERN=2", "-DAMEM_AFFINE_IN_FLIGHT=2", "-DAMEM_AFFINE_BALANCE=1", "-DAMEM_AFFINE_PACK=1",
         "-DAMEM_AFFINE_REUSE=1"],
    "staged in shared memory, 3 stages, 2 blocks a slot, streaming hints":
        ["-DAMEM_AFFINE_PATTERN=3", "-DAMEM_AFFINE_IN_FLIGHT=2", "-DAMEM_AFFINE_STAGES=3", "-DAMEM_AFFINE_GRID=2",
         "-DAMEM_AFFINE_LOAD=1", "-DAMEM_AFFINE_STORE=1"],
}


class Builder:
    """Compiles the kernels and the CPU loops for the emulation (once), and links test binaries,
    one with the affine kernel compiled with given macros."""

    def __init__(self, out: Path):
        self.compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")
        include = cuda_include()
        if self.compiler is None or include is None:
            pytest.skip(f"needs g++ and CUDA's headers (found {self.compiler}, {include})")
        self.out = out
        self.flags = ["-std=c++20", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                      "-fno-omit-frame-pointer", "-Wno-unknown-pragmas", "-ffp-contract=off",
                      f"-I{ROOT / 'src'}", f"-I{include}", f"-I{NATIVE}"]
        jobs = {k: self.kernel_job(k) for k in KERNELS}
        jobs.update({name: [str(ROOT / "src" / "copy" / f"{name}.cc")] for name in LOOPS})
        jobs.update({name: [str(NATIVE / f"{name}.cc")]
                     for name in ("kernel_emulation", "cuda_emulation_runtime", "fake_driver")})
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            self.objects = dict(zip(jobs, pool.map(self.compile, jobs.values(), jobs)))

    @staticmethod
    def kernel_job(kernel: str) -> list:
        return ["-x", "c++", "-include", str(NATIVE / "cuda_emulation.h"), str(ROOT / "src" / "copy" / f"{kernel}.cu")]

    def compile(self, job, name) -> Path:
        obj = self.out / f"{name}.o"
        done = subprocess.run([self.compiler, *self.flags, *job, "-c", "-o", str(obj)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-4000:]
        return obj

    def link(self, name: str, affine_defines=()) -> Path:
        binary = self.out / name
        if binary.exists():
            return binary
        objects = dict(self.objects)
        if affine_defines:
            objects["affine_cuda"] = self.compile([*affine_defines, *self.kernel_job("affine_cuda")], f"affine_{name}")
        linked = subprocess.run([self.compiler, "-fsanitize=address,undefined", *map(str, objects.values()), "-o",
                                 str(binary), "-lpthread"], capture_output=True, text=True)
        assert linked.returncode == 0, linked.stderr[-4000:]
        return binary


@pytest.fixture(scope="module")
def builder(tmp_path_factory) -> Builder:
    return Builder(tmp_path_factory.mktemp("kernel_emulation"))


def run_emulator(binary: Path, seed: int, *suite: str) -> str:
    run = subprocess.run([str(binary), str(CASES), str(seed), *suite], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
    said = run.stdout + run.stderr
    assert run.returncode == 0, said[-6000:]
    return said


@pytest.mark.parametrize("seed", SEEDS)
def test_every_kernel_writes_what_its_cpu_loop_writes(builder, seed):
    said = run_emulator(builder.link("kernel_emulation"), seed)
    for suite in ("segment copy", "affine copy", "transpose copy", "transpose copy with programs", "direct launch"):
        assert f"{suite:<30} {CASES} of {CASES} cases equal" in said, said[-6000:]


@pytest.mark.parametrize("variant", AFFINE_VARIANTS)
def test_every_affine_kernel_variant_writes_what_the_cpu_loop_writes(builder, variant):
    binary = builder.link("variant_" + str(list(AFFINE_VARIANTS).index(variant)), AFFINE_VARIANTS[variant])
    said = run_emulator(binary, SEEDS[0], "affine copy")
    assert f"{'affine copy':<30} {CASES} of {CASES} cases equal" in said, said[-6000:]
    assert "transpose" not in said, said[-6000:]  # the one suite ran
