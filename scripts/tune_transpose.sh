#!/usr/bin/env bash
# The fused transpose-and-cast kernel under several configurations of its tunables
# (src/copy/transpose_tuning.h), each built into benchmarks/transpose_kernel.cu and timed on the
# real-size case (Qwen3-1.7B, 310 rows, 10.3 GB moved) against cudaMemcpyAsync of the same bytes;
# every run also checks its output bits (a mismatch marks the row MISMATCH). On the GPU machine,
# from the repository root (about a minute of compiling, 5-10 s a run):
#
#   bash scripts/tune_transpose.sh              (every configuration, today's default first)
#   bash scripts/tune_transpose.sh NAME ...     (only those)
#   TUNE_BUILD_ONLY=1 bash scripts/tune_transpose.sh   (compile, and report registers and spills)
#
# Summary: per configuration, the kernel's ms and its rate as % of memcpy's for the swap's 310
# rows, for the transposed rows alone and for the same bytes as casts; the F32->BF16 kernel's
# registers and spill bytes (ptxas). Binaries and logs in ${OUT:-/tmp}/tune_transpose.
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
# name|flags: today's default first; each a hypothesis about what holds the kernel below HBM's
# rate (see transpose_tuning.h for each knob).
# Every configuration names each of the four knobs the defaults set (ROW_HINT, VECTOR, THREADS_Y,
# BLOCKS_PER_SM), so that its row means the same whatever the defaults are; "before" is the
# defaults the library had until vector_y4_b8 measured fastest (H100: 90% -> 102% of memcpy).
K="-D${T}_ROW_HINT=1 -D${T}_VECTOR=1"
CONFIGS=(
  "default|"
  "before|-D${T}_ROW_HINT=0 -D${T}_VECTOR=0 -D${T}_THREADS_Y=8 -D${T}_BLOCKS_PER_SM=4"
  "hint|-D${T}_ROW_HINT=1 -D${T}_VECTOR=0 -D${T}_THREADS_Y=8 -D${T}_BLOCKS_PER_SM=4"  # the row search's dependent loads
  "vector|$K -D${T}_THREADS_Y=8 -D${T}_BLOCKS_PER_SM=4"          # a quarter of the memory instructions
  "b6|-D${T}_ROW_HINT=1 -D${T}_VECTOR=0 -D${T}_THREADS_Y=8 -D${T}_BLOCKS_PER_SM=6 -D${T}_CAST_WORDS=4"  # more tiles in flight per SM
  "vector_b6|$K -D${T}_THREADS_Y=8 -D${T}_BLOCKS_PER_SM=6 -D${T}_CAST_WORDS=4"
  "b8|-D${T}_ROW_HINT=1 -D${T}_VECTOR=0 -D${T}_THREADS_Y=8 -D${T}_BLOCKS_PER_SM=8 -D${T}_CAST_WORDS=4"  # 2048 threads/SM, 32 registers
  "vector_y4_b8|$K -D${T}_THREADS_Y=4 -D${T}_BLOCKS_PER_SM=8"
  "vector_y4_b6|$K -D${T}_THREADS_Y=4 -D${T}_BLOCKS_PER_SM=6"
  "vector_unit|-D${T}_ROW_HINT=0 -D${T}_VECTOR=1 -D${T}_THREADS_Y=8 -D${T}_BLOCKS_PER_SM=4 -D${T}_GRID_PER_SM=0"  # a block per tile, no loop, no search state
  "tile32_b6|$K -D${T}_TILE=32 -D${T}_THREADS_Y=8 -D${T}_BLOCKS_PER_SM=6 -D${T}_CAST_WORDS=4"
  "tile32_b8|$K -D${T}_TILE=32 -D${T}_THREADS_Y=8 -D${T}_BLOCKS_PER_SM=8 -D${T}_CAST_WORDS=4"
)

chosen=()
for c in "${CONFIGS[@]}"; do
  name=${c%%|*}
  if [ $# -eq 0 ] || [[ " $* " == *" $name "* ]]; then chosen+=("$c"); fi
done
[ ${#chosen[@]} -gt 0 ] || { echo "no configuration named $*"; exit 2; }

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

# ptxas's registers and spill bytes of the F32->BF16 kernel: the line after its entry's name.
registers() {
  awk '/Compiling entry function .*TransposeKernel.*F32ToBF16/ {on = 1; next}
       on && /spill stores/ {split($0, a, ","); spill = a[2]; gsub(/^ +| bytes spill stores/, "", spill)}
       on && /Used [0-9]+ registers/ {match($0, /Used [0-9]+/); print substr($0, RSTART + 5, RLENGTH - 5) "/" spill; exit}' "$1"
}

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" "$2"; }

printf "\n%-14s %9s %9s %6s %9s %6s %9s %6s  %s\n" config regs/spl swap_ms %mcpy tiles_ms %mcpy casts_ms %mcpy bits
for c in "${chosen[@]}"; do
  name=${c%%|*}
  regs=$(registers "$O/$name.build.log")
  if [ ! -x "$O/$name" ]; then
    printf "%-14s %9s  build failed: %s\n" "$name" "-" "$(grep -m1 -i error "$O/$name.build.log")"
    continue
  fi
  if [ -n "${TUNE_BUILD_ONLY:-}" ]; then
    printf "%-14s %9s  (built: %s)\n" "$name" "$regs" "${c#*|}"
    continue
  fi
  timeout 90 "$O/$name" >"$O/$name.run.log" 2>&1
  rc=$?
  log=$O/$name.run.log
  bits=ok
  [ $rc -eq 0 ] || bits="rc=$rc"
  grep -q MISMATCH "$log" && bits=MISMATCH
  printf "%-14s %9s %9s %6s %9s %6s %9s %6s  %s\n" "$name" "$regs" "$(field swap_ms "$log")" "$(field swap_pct "$log")" \
    "$(field tiles_ms "$log")" "$(field tiles_pct "$log")" "$(field casts_ms "$log")" "$(field casts_pct "$log")" "$bits"
done
echo "total $((SECONDS - start)) s; per-configuration output: $O/NAME.run.log"
echo "a configuration into the library (its flags, quoted): CUDAFLAGS=\"FLAGS\" CXXFLAGS=\"FLAGS\" bash scripts/gpu_test.sh build"
