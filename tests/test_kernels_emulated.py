"""The CUDA kernels of src/copy run on CPU threads (tests/native/cuda_emulation.h) against the CPU
loops, on random tables: the segment copy, the affine copy and the fused transpose-and-cast copy,
plain and with constant steps; and a DirectCopy made for device 0 with every kind of row, its
device table, driver copies and launches on the emulated device; again in the compile-time
variants of the transpose kernel (VARIANTS) and of the affine kernel (AFFINE_VARIANTS), which
scripts/tune_transpose.sh and scripts/tune_affine.sh measure on the GPU. Built here with g++ and
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
# The files that see the transpose kernel's tunables (src/copy/transpose_tuning.h): built again,
# all with the same flags, for each configuration below; the others once.
TRANSPOSE_TUNED = {"transpose_cuda", "transpose", "direct_launch", "kernel_emulation"}
# Configurations other than the defaults that scripts/tune_transpose.sh times: each must write
# what the CPU loops write too (the vector tiles, the row hint, a 32-element tile of 128 threads,
# a block per unit, cast units in several passes).
T = "-DAMEM_TRANSPOSE_"
VARIANTS = {
    "default": [],
    "vector": [f"{T}VECTOR=1", f"{T}ROW_HINT=1", f"{T}BLOCKS_PER_SM=6", f"{T}CAST_WORDS=4"],
    "tile32": [f"{T}VECTOR=1", f"{T}TILE=32", f"{T}THREADS_Y=4", f"{T}GRID_PER_SM=0", f"{T}CAST_WORDS=2"],
    # A bfloat16 tile times an exact scale by the float32 multiply and rounding, not the default's
    # one bfloat16 multiply an element (src/copy/affine_math.h).
    "float_mul_bf16": ["-DAMEM_BF16_MUL=0"],
    # Rows with a program of scalar steps on the vector tiles too (transpose_tuning.h).
    "stepped_vector": [f"{T}STEPPED_VECTOR=1"],
}
# The affine kernel's (the AMEM_AFFINE_* macros of src/copy/affine_cuda.cu, seen by that file
# alone): every load pattern, thread count, loads in flight, grid and packing, each run on the
# affine suite.
A = "-DAMEM_AFFINE_"
AFFINE_VARIANTS = {
    "warp runs, 128 threads, 8 in flight, a block per piece":
        [f"{A}PATTERN=1", f"{A}THREADS=128", f"{A}IN_FLIGHT=8", f"{A}GRID=0"],
    "pipelined, 2 in flight, a balanced grid of the resident blocks, packed bfloat16, programs kept":
        [f"{A}PATTERN=2", f"{A}IN_FLIGHT=2", f"{A}GRID=1", f"{A}BALANCE=1", f"{A}PACK=1", f"{A}REUSE=1"],
    "staged in shared memory, 256 threads, 3 stages, 2 blocks a slot, streaming hints":
        [f"{A}PATTERN=3", f"{A}THREADS=256", f"{A}MIN_BLOCKS=4", f"{A}IN_FLIGHT=2", f"{A}STAGES=3", f"{A}GRID=2",
         f"{A}LOAD=1", f"{A}STORE=1"],
    "bfloat16 pairs times an exact scale by the float32 multiply and rounding": ["-DAMEM_BF16_MUL=0"],
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


def run_emulator(binary: Path, seed: int, *suite: str) -> str:
    run = subprocess.run([str(binary), str(CASES), str(seed), *suite], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
    said = run.stdout + run.stderr
    assert run.returncode == 0, said[-6000:]
    return said


@pytest.mark.parametrize("seed", SEEDS)
def test_every_kernel_writes_what_its_cpu_loop_writes(emulator, seed):
    said = run_emulator(emulator, seed)
    for suite in ("segment copy", "affine copy", "transpose copy", "transpose copy with programs", "direct launch"):
        assert f"{suite:<30} {CASES} of {CASES} cases equal" in said, said[-6000:]


@pytest.mark.parametrize("variant", AFFINE_VARIANTS)
def test_every_affine_kernel_variant_writes_what_the_cpu_loop_writes(builder, variant):
    name = "affine" + str(list(AFFINE_VARIANTS).index(variant))
    said = run_emulator(builder.binary(name, AFFINE_VARIANTS[variant], {"affine_cuda"}), SEEDS[0], "affine copy")
    assert f"{'affine copy':<30} {CASES} of {CASES} cases equal" in said, said[-6000:]
    assert "transpose" not in said, said[-6000:]  # the one suite ran
