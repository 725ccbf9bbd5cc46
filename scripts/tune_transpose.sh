#!/usr/bin/env bash
# The fused transpose-and-cast kernel (src/copy/transpose_cuda.cu) on the GPU machine, from the
# repository root.
#
# The plain kernel as the library builds it: benchmarks/transpose_kernel.cu timed on the real-size
# case (Qwen3-1.7B, 310 rows, 10.3 GB moved) against cudaMemcpyAsync of the same bytes, its output
# bits checked (a mismatch marks the row MISMATCH). Its shape (64x64 tiles, 4 warps, 8 blocks a
# multiprocessor, the row hint, four-element vector tiles) is what this measured fastest on an
# H100; the other shapes it timed are in docs/benchmarks.md. A new shape to time: change the
# constants at the top of transpose_cuda.cu and run this again.
#
# The kernels of rows with a program of constant steps, under the two options left to measure
# (src/copy/transpose_tuning.h, docs/roadmap.md): the benchmark has no such rows, so each of these
# configurations is built into the library (scripts/gpu_test.sh build, its flags in CUDAFLAGS: only
# transpose_cuda.cu reads them) and timed by benchmarks/swap_scale.py, whose GPU tests of constant steps check
# its bits (scripts/gpu_test.sh swap_scale); the library is built again with the defaults after.
#
#   bash scripts/tune_transpose.sh                     the plain kernel (default)
#   bash scripts/tune_transpose.sh stepped_vector      a stepped configuration (CONFIGS below), or several
#   TUNE_BUILD_ONLY=1 bash scripts/tune_transpose.sh default stepped_vector stepped_vector_b4
#                                                      compile each, and report registers and spills
#
# Binaries and logs in ${OUT:-/tmp}/tune_transpose. A library build and its swap_scale take a few
# minutes: name one stepped configuration a device call.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp}/tune_transpose
mkdir -p "$O"
for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
  command -v nvcc >/dev/null || { [ -x $d/nvcc ] && export PATH=$PATH:$d; }
done
command -v nvcc >/dev/null || { echo "nvcc not found (PATH, /usr/local/cuda/bin)"; exit 2; }
# The system compiler, as scripts/gpu_test.sh builds (the image's default CXX is another).
export CC=/usr/bin/gcc CXX=/usr/bin/g++
ARCH=${ARCH:-sm_90}

T=AMEM_TRANSPOSE
# name|flags: the library's build first; then the stepped configurations of docs/roadmap.md
# (the stepped vector tiles; the same with 4 resident blocks, at which the stepped kernels spill
# nothing).
CONFIGS=(
  "default|"
  "stepped_vector|-D${T}_STEPPED_VECTOR=1"
  "stepped_vector_b4|-D${T}_STEPPED_VECTOR=1 -D${T}_STEPPED_BLOCKS_PER_SM=4"
)

chosen=()
for c in "${CONFIGS[@]}"; do
  name=${c%%|*}
  if [[ " ${*:-default} " == *" $name "* ]]; then chosen+=("$c"); fi
done
[ ${#chosen[@]} -gt 0 ] || { echo "no configuration named $* (default, stepped_vector, stepped_vector_b4)"; exit 2; }

build() {  # name flags: the benchmark and the library's copy files, all with the same flags
  local name=$1 flags=$2
  rm -f "$O/$name"
  # shellcheck disable=SC2086
  nvcc -O3 -std=c++17 -arch="$ARCH" -ccbin "$CXX" -Isrc -Xptxas -v $flags benchmarks/transpose_kernel.cu \
    src/copy/transpose_cuda.cu src/copy/transpose.cc -o "$O/$name" >"$O/$name.build.log" 2>&1
}

start=$SECONDS
for c in "${chosen[@]}"; do build "${c%%|*}" "${c#*|}" & done
wait
echo "compiled ${#chosen[@]} configurations in $((SECONDS - start)) s (logs: $O)"

# ptxas's registers and spill bytes of a kernel (the line after its entry's name): REGS/SPILL.
registers() {  # log pattern
  awk -v pattern="$2" '$0 ~ "Compiling entry function .*TransposeKernel.*" pattern {on = 1; next}
       on && /spill stores/ {split($0, a, ","); spill = a[2]; gsub(/^ +| bytes spill stores/, "", spill)}
       on && /Used [0-9]+ registers/ {match($0, /Used [0-9]+/); print substr($0, RSTART + 5, RLENGTH - 5) "/" spill; exit}' "$1"
}

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" "$2"; }

printf "\n%-18s %9s %9s %9s %6s %9s %6s %9s %6s  %s\n" config plain stepped swap_ms %mcpy tiles_ms %mcpy \
  casts_ms %mcpy bits
failed=0
for c in "${chosen[@]}"; do
  name=${c%%|*} flags=${c#*|}
  plain=$(registers "$O/$name.build.log" F32ToBF16)
  # The first stepped kernel with a bfloat16 side (mangled: Stepped, then its two types).
  stepped=$(registers "$O/$name.build.log" 'Stepped.*Bf16')
  if [ ! -x "$O/$name" ]; then
    printf "%-18s %9s  build failed: %s\n" "$name" "-" "$(grep -m1 -i error "$O/$name.build.log")"
    failed=1
    continue
  fi
  if [ -n "${TUNE_BUILD_ONLY:-}" ]; then
    printf "%-18s %9s %9s  (built: %s)\n" "$name" "$plain" "$stepped" "${flags:-the defaults}"
    continue
  fi
  if [ "$name" != default ]; then  # measured on the library: the stepped rows are the swap's
    printf "%-18s %9s %9s  swap_scale on the library built with it: %s\n" "$name" "$plain" "$stepped" "$O/$name.run.log"
    CUDAFLAGS="$flags" bash scripts/gpu_test.sh build swap_scale >"$O/$name.run.log" 2>&1 || failed=1
    bash scripts/gpu_test.sh build >"$O/$name.rebuild.log" 2>&1 || failed=1
    tail -25 "$O/$name.run.log"
    continue
  fi
  timeout 90 "$O/$name" >"$O/$name.run.log" 2>&1
  rc=$?
  log=$O/$name.run.log
  bits=ok
  [ $rc -eq 0 ] || { bits="rc=$rc"; failed=1; }
  grep -q MISMATCH "$log" && { bits=MISMATCH; failed=1; }
  printf "%-18s %9s %9s %9s %6s %9s %6s %9s %6s  %s\n" "$name" "$plain" "$stepped" "$(field swap_ms "$log")" \
    "$(field swap_pct "$log")" "$(field tiles_ms "$log")" "$(field tiles_pct "$log")" "$(field casts_ms "$log")" \
    "$(field casts_pct "$log")" "$bits"
done
echo "plain, stepped: registers/spill bytes (ptxas) of the f32 -> bf16 kernel and of the first stepped one with a bf16 side"
echo "total $((SECONDS - start)) s; per configuration: $O/NAME.build.log (compile), $O/NAME.run.log (run)"
exit $failed
