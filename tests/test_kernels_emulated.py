"""The CUDA kernels of src/copy run on CPU threads (tests/native/cuda_emulation.h) against the CPU
loops, on random tables: the segment copy, the affine copy and the fused transpose-and-cast copy,
plain and with constant steps; and a DirectCopy made for device 0 with every kind of row, its
device table, driver copies and launches on the emulated device; again with the transpose
kernel's two options left to measure (VARIANTS: src/copy/transpose_tuning.h), which
scripts/tune_transpose.sh times on the GPU. Built here with g++ and
CUDA's headers, under AddressSanitizer and UndefinedBehaviorSanitizer, so a read or write outside
a buffer, or a misaligned one, fails too.

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
NATIVES = ["kernel_emulation", "cuda_emulation_runtime", "fake_driver"]
# The file that sees the transpose kernel's options (src/copy/transpose_tuning.h): built again for
# each configuration below; the others once.
TRANSPOSE_TUNED = {"transpose_cuda"}
# The configurations scripts/tune_transpose.sh times: each must write what the CPU loops write too
# (rows with a program of scalar steps on the vector tiles; the same with the stepped kernels'
# grid capped at 4 blocks a multiprocessor).
T = "-DAMEM_TRANSPOSE_"
VARIANTS = {
    "default": [],
    "stepped_vector": [f"{T}STEPPED_VECTOR=1"],
    "stepped_vector_b4": [f"{T}STEPPED_VECTOR=1", f"{T}STEPPED_BLOCKS_PER_SM=4"],
}
CASES, SEEDS = 20, (1, 2)


def cuda_include() -> Path | None:
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "include" / "cuda_runtime.h").exists():
            return Path(root) / "include"
    return None


def source(name: str) -> list[str]:
    if name in KERNELS:
        return ["-x", "c++", "-include", str(NATIVE / "cuda_emulation.h"), str(ROOT / "src" / "copy" / f"{name}.cu")]
    return [str((NATIVE if name in NATIVES else ROOT / "src" / "copy") / f"{name}.cc")]


class Builder:
    """Objects under sanitizers, the untuned ones shared by every configuration."""

    def __init__(self, out: Path):
        compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")
        include = cuda_include()
        if compiler is None or include is None:
            pytest.skip(f"needs g++ and CUDA's headers (found {compiler}, {include})")
        self.compiler, self.out, self.shared = compiler, out, {}
        self.flags = ["-std=c++20", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                      "-fno-omit-frame-pointer", "-Wno-unknown-pragmas", "-ffp-contract=off",
                      f"-I{ROOT / 'src'}", f"-I{include}", f"-I{NATIVE}"]

    def compile(self, jobs: list[tuple[str, list[str], Path]]) -> None:
        def one(job):
            name, extra, obj = job
            return subprocess.run([self.compiler, *self.flags, *extra, *source(name), "-c", "-o", str(obj)],
                                  capture_output=True, text=True)

        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            for done in pool.map(one, jobs):
                assert done.returncode == 0, done.stderr[-4000:]

    def binary(self, variant: str, flags: list[str], tuned: set[str]) -> Path:
        """The emulation linked with the files `tuned` built with `flags` (named `variant`)."""
        names = KERNELS + LOOPS + NATIVES
        jobs = [(n, flags, self.out / f"{variant}-{n}.o") for n in names if n in tuned]
        jobs += [(n, [], self.out / f"{n}.o") for n in names if n not in tuned and n not in self.shared]
        self.compile(jobs)
        self.shared.update({n: self.out / f"{n}.o" for n in names if n not in tuned})
        objects = [self.out / f"{variant}-{n}.o" if n in tuned else self.shared[n] for n in names]
        binary = self.out / f"kernel_emulation-{variant}"
        linked = subprocess.run([self.compiler, "-fsanitize=address,undefined", *map(str, objects), "-o", str(binary),
                                 "-lpthread"], capture_output=True, text=True)
        assert linked.returncode == 0, linked.stderr[-4000:]
        return binary


@pytest.fixture(scope="module")
def builder(tmp_path_factory) -> Builder:
    return Builder(tmp_path_factory.mktemp("kernel_emulation"))


@pytest.fixture(scope="module", params=list(VARIANTS))
def emulator(builder, request) -> Path:
    return builder.binary(request.param, VARIANTS[request.param], TRANSPOSE_TUNED)


def run_emulator(binary: Path, seed: int) -> str:
    run = subprocess.run([str(binary), str(CASES), str(seed)], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
    said = run.stdout + run.stderr
    assert run.returncode == 0, said[-6000:]
    return said


@pytest.mark.parametrize("seed", SEEDS)
def test_every_kernel_writes_what_its_cpu_loop_writes(emulator, seed):
    said = run_emulator(emulator, seed)
    for suite in ("segment copy", "affine copy", "transpose copy", "transpose copy with programs", "direct launch"):
        assert f"{suite:<30} {CASES} of {CASES} cases equal" in said, said[-6000:]
