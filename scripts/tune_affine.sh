#!/usr/bin/env bash
# Times the library's affine kernel (src/copy/affine_cuda.cu) on the GPU machine:
# benchmarks/affine_kernel.cu built once, then run with the row pieces the swap's tables use and
# with other piece sizes (the host's choice: jax_amem.affine_copy.MAX_PIECE_ELEMENTS,
# copy::kMaxPieceElements, 65536), then one table: per pair the kernel's ms and its rate as % of
# cudaMemcpyAsync's, its registers and spills (ptxas), and whether its output equals the CPU
# loop's and the first run's bit for bit. The kernel's shape (512 threads, 2 blocks a
# multiprocessor, a block per piece, 4 loads in flight) is what this measured fastest on an H200;
# the other layouts it timed are in docs/benchmarks.md. A new shape to time: change the constants
# at the top of affine_cuda.cu and run this again.
#
#   bash scripts/tune_affine.sh                  build and run every piece size below
#   bash scripts/tune_affine.sh NAME ...         only those (the default is always run first)
#   COMPILE_ONLY=1 bash scripts/tune_affine.sh   build and show registers and spills (no GPU needed)
#
# Logs go to ${OUT:-/tmp}/tune_affine, objects and the binary to ${BUILD:-/tmp/tune_affine_build}
# (kept out of $OUT: it comes back from the GPU machine). Exit status 1 when the build or a run
# fails, or an output differs from the CPU loop's or the default run's.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp}/tune_affine
B=${BUILD:-/tmp/tune_affine_build}
mkdir -p "$O" "$B"
for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
  command -v nvcc >/dev/null || { [ -x $d/nvcc ] && export PATH=$PATH:$d; }
done
command -v nvcc >/dev/null || { echo "nvcc not found (PATH, /usr/local/cuda/bin)"; exit 1; }
# The system compiler, as scripts/gpu_test.sh builds with (the image's default links its own libstdc++).
HOST=()
[ -x /usr/bin/g++ ] && HOST=(-ccbin /usr/bin/g++)
NVCC=(nvcc "${HOST[@]}" -O3 -std=c++17 -arch=sm_90 -Isrc -Xcompiler -ffp-contract=off)

# label|--piece: the runs of the one build; the first is the swap's own pieces.
RUNS=(
  "default|"
  "p16K|--piece 16384"
  "p256K|--piece 262144"
  "p1M|--piece 1048576"
)

WANT=" $* "
chosen() { [ "$1" = default ] || [ "$WANT" = "  " ] || [[ "$WANT" == *" $1 "* ]]; }

start=$SECONDS
SOURCES="src/copy/affine_cuda.cu benchmarks/affine_kernel.cu src/copy/affine.cc src/copy/affine_cpu.cc
         src/copy/segments.cc src/copy/copy_cuda.cu"
rm -f "$B"/*.o "$B"/*.bin "$O"/*.log
for file in $SOURCES; do  # JOBS=N compilers at once (default: the cores)
  while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-$(nproc)}" ]; do wait -n; done
  name=$(basename "${file%.*}")
  "${NVCC[@]}" -Xptxas -v -c "$file" -o "$B/$name.o" > "$O/$name.compile.log" 2>&1 &
done
wait  # success is judged by the objects each left
for file in $SOURCES; do
  name=$(basename "${file%.*}")
  [ -f "$B/$name.o" ] || { echo "build of $file failed:"; tail -20 "$O/$name.compile.log"; exit 1; }
done
"${NVCC[@]}" "$B"/*.o -o "$B/affine_kernel.bin" >> "$O/affine_cuda.compile.log" 2>&1 ||
  { echo "link failed:"; tail -20 "$O/affine_cuda.compile.log"; exit 1; }
echo "== compiled in $((SECONDS - start)) s (logs in $O)"

# ptxas on the kernel: "REGS regs, SPILL B spilled" (stores + loads).
kernel_use() {
  awk '/Function properties for .*AffineCopyKernel/ {k=1; next}
       k && /spill stores/ {s=$5 + $9} k && /Used [0-9]+ registers/ {print $5 " regs, " s " B spilled"; exit}' "$1"
}
USE=$(kernel_use "$O/affine_cuda.compile.log")
if [ -n "${COMPILE_ONLY:-}" ]; then
  echo "AffineCopyKernel: $USE"
  exit 0
fi

failed=0
run_start=$SECONDS
declare -A RC
for run in "${RUNS[@]}"; do
  IFS='|' read -r label args <<< "$run"
  chosen "$label" || continue
  # shellcheck disable=SC2086
  timeout --kill-after=5 60 "$B/affine_kernel.bin" $args > "$O/$label.log" 2>&1
  rc=$?
  RC[$label]=$rc
  echo "-- $label: rc=$rc"
  [ $rc -eq 0 ] || { failed=1; grep -v '^RESULT' "$O/$label.log" | tail -8; }
done
echo "== ran in $((SECONDS - run_start)) s"

# The table: per pair "ms (% of memcpy)"; "bits": each pair's sample hash against the default run's.
PAIRS=("f32 -> f32" "bf16 -> bf16" "f32 -> bf16" "f16 -> f16")
printf '\nAffineCopyKernel: %s\n%-10s' "$USE" run
for p in "${PAIRS[@]}"; do printf ' %-17s' "$p"; done
printf ' %s\n' "bits"
declare -A BASE
for run in "${RUNS[@]}"; do
  IFS='|' read -r label args <<< "$run"
  [ -f "$O/$label.log" ] || continue
  printf '%-10s' "$label"
  bits="same as default"
  [ "${RC[$label]}" = 0 ] || bits="FAILED (rc=${RC[$label]})"
  for p in "${PAIRS[@]}"; do
    line=$(grep -m1 "^RESULT $p|" "$O/$label.log")
    if [ -z "$line" ]; then printf ' %-17s' "-"; bits="INCOMPLETE"; continue; fi
    IFS='|' read -r _ ms _ pct hash check <<< "${line#RESULT }"
    printf ' %-17s' "$(printf '%.3f (%.1f%%)' "$ms" "$pct")"
    [ "$label" = default ] && BASE[$p]=$hash
    [ "$check" = ok ] || bits="MISMATCH (CPU loop)"
    [ "$bits" = "same as default" ] && [ "${BASE[$p]:-}" != "$hash" ] && bits="DIFFERS from default"
  done
  printf ' %s\n' "$bits"
  [[ "$bits" == "same as default" ]] || failed=1
done
printf '\nms: the kernel, 4 x 2^27 elements, x * 0.3, median of 20; %%: its bytes read + written per second against\n'
printf 'cudaMemcpyAsync of the destination bytes (the plain swap of same-type pairs). Full tables: %s/<run>.log\n' "$O"
for run in "${RUNS[@]}"; do printf '  %-10s %s\n' "${run%%|*}" "${run#*|}"; done
echo "== total $((SECONDS - start)) s"
exit $failed
