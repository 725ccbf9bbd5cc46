#!/usr/bin/env bash
# Measures configurations of the affine kernel's tunables (src/copy/affine_cuda.cu: the
# AMEM_AFFINE_* macros) in one go on the GPU machine: benchmarks/affine_kernel.cu built once per
# configuration (the kernel compiled in parallel, the rest once), each run in turn, then one table:
# per pair the kernel's ms and its rate as % of cudaMemcpyAsync's, registers and spills (ptxas),
# and whether its output equals the CPU loop's and the default's bit for bit.
#
#   bash scripts/tune_affine.sh                  build and run every configuration below
#   bash scripts/tune_affine.sh NAME ...         only those (the default is always built and run first)
#   COMPILE_ONLY=1 bash scripts/tune_affine.sh   build and show registers and spills (no GPU needed)
#   JOBS=N: compilers at once (default: the cores)
#
# Logs go to ${OUT:-/tmp}/tune_affine, objects and binaries to ${BUILD:-/tmp/tune_affine_build}
# (kept out of $OUT: it comes back from the GPU machine). Exit status 1 when a configuration fails
# to build or run, or its output differs from the CPU loop's or the default's.
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

# name|flags. The first is today's library build; each other changes one thing unless its name
# says more. Shared memory of pattern 3: STAGES * IN_FLIGHT * THREADS * 16 bytes (<= 40 KiB).
CONFIGS=(
  "default|"
  "previous|-DAMEM_AFFINE_THREADS=256 -DAMEM_AFFINE_MIN_BLOCKS=4 -DAMEM_AFFINE_GRID=1"
  "pack|-DAMEM_AFFINE_PACK=1"
  "integer_bf16|-DAMEM_BF16_CVT=0"
  "float_mul_bf16|-DAMEM_BF16_MUL=0"
  "reuse|-DAMEM_AFFINE_REUSE=1"
  "warp_runs|-DAMEM_AFFINE_PATTERN=1"
  "pipelined|-DAMEM_AFFINE_PATTERN=2"
  "staged|-DAMEM_AFFINE_PATTERN=3 -DAMEM_AFFINE_IN_FLIGHT=2 -DAMEM_AFFINE_STAGES=2"
  "staged5_l2|-DAMEM_AFFINE_PATTERN=3 -DAMEM_AFFINE_IN_FLIGHT=2 -DAMEM_AFFINE_STAGES=5 -DAMEM_AFFINE_LOAD=2 -DAMEM_AFFINE_THREADS=256 -DAMEM_AFFINE_MIN_BLOCKS=4"
  "resident_grid|-DAMEM_AFFINE_GRID=1"
  "grid2|-DAMEM_AFFINE_GRID=2"
  "balanced|-DAMEM_AFFINE_GRID=1 -DAMEM_AFFINE_BALANCE=1"
  "streaming|-DAMEM_AFFINE_LOAD=1 -DAMEM_AFFINE_STORE=1"
  "l2_256|-DAMEM_AFFINE_LOAD=2"
  "regs128|-DAMEM_AFFINE_MIN_BLOCKS=1"
  "in_flight8|-DAMEM_AFFINE_IN_FLIGHT=8 -DAMEM_AFFINE_MIN_BLOCKS=1"
  "threads256|-DAMEM_AFFINE_THREADS=256 -DAMEM_AFFINE_MIN_BLOCKS=4"
  "threads1024|-DAMEM_AFFINE_THREADS=1024 -DAMEM_AFFINE_MIN_BLOCKS=1"
  "staged_all|-DAMEM_AFFINE_PATTERN=3 -DAMEM_AFFINE_IN_FLIGHT=2 -DAMEM_AFFINE_STAGES=2 -DAMEM_AFFINE_PACK=1 -DAMEM_AFFINE_REUSE=1 -DAMEM_AFFINE_STORE=1"
  "pack_reuse|-DAMEM_AFFINE_PACK=1 -DAMEM_AFFINE_REUSE=1"
)
# Runs of a built configuration with other arguments: the row pieces' size is the host's choice
# (jax_amem.affine_copy.MAX_PIECE_ELEMENTS, copy::kMaxPieceElements: 65536), no rebuild needed.
EXTRA_RUNS=(
  "default_p16K|default|--piece 16384"
  "default_p256K|default|--piece 262144"
  "default_p1M|default|--piece 1048576"
  "balanced_p256K|balanced|--piece 262144"
  "pack_reuse_p256K|pack_reuse|--piece 262144"
  "staged_all_p256K|staged_all|--piece 262144"
)

WANT=" $* "
chosen() { [ "$1" = default ] || [ "$WANT" = "  " ] || [[ "$WANT" == *" $1 "* ]]; }

start=$SECONDS
COMMON="bench:benchmarks/affine_kernel.cu affine:src/copy/affine.cc affine_cpu:src/copy/affine_cpu.cc segments:src/copy/segments.cc copy_cuda:src/copy/copy_cuda.cu"
rm -f "$B"/*.o "$B"/*.bin "$O"/*.log
for c in $COMMON; do
  "${NVCC[@]}" -c "${c#*:}" -o "$B/common_${c%%:*}.o" > "$O/common_${c%%:*}.log" 2>&1 &
done
for entry in "${CONFIGS[@]}"; do
  name=${entry%%|*} flags=${entry#*|}
  chosen "$name" || continue
  while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-$(nproc)}" ]; do wait -n; done
  # shellcheck disable=SC2086
  "${NVCC[@]}" $flags -Xptxas -v -c src/copy/affine_cuda.cu -o "$B/$name.o" > "$O/$name.compile.log" 2>&1 &
done
wait  # success is judged by the objects each left (below)
failed=0
for c in $COMMON; do
  [ -f "$B/common_${c%%:*}.o" ] || { echo "build of ${c#*:} failed:"; tail -20 "$O/common_${c%%:*}.log"; exit 1; }
done
echo "== compiled in $((SECONDS - start)) s (logs in $O)"

# ptxas on the kernel: "REGS regs, SPILL B spilled" (stores + loads).
kernel_use() {
  awk '/Function properties for .*AffineCopyKernel/ {k=1; next}
       k && /spill stores/ {s=$5 + $9} k && /Used [0-9]+ registers/ {print $5 " regs, " s " B spilled"; exit}' "$1"
}

declare -A BIN
for entry in "${CONFIGS[@]}"; do
  name=${entry%%|*}
  chosen "$name" || continue
  if [ -f "$B/$name.o" ] && "${NVCC[@]}" "$B"/common_*.o "$B/$name.o" -o "$B/$name.bin" >> "$O/$name.compile.log" 2>&1; then
    BIN[$name]="$B/$name.bin"
  else
    echo "-- $name: build failed"; grep -i "error" "$O/$name.compile.log" | head -5; failed=1
  fi
done
if [ -n "${COMPILE_ONLY:-}" ]; then
  for entry in "${CONFIGS[@]}"; do
    name=${entry%%|*}
    [ -n "${BIN[$name]:-}" ] && printf '%-14s %-28s %s\n' "$name" "$(kernel_use "$O/$name.compile.log")" "${entry#*|}"
  done
  exit $failed
fi

RUNS=()
for entry in "${CONFIGS[@]}"; do RUNS+=("${entry%%|*}|${entry%%|*}|"); done
RUNS+=("${EXTRA_RUNS[@]}")
run_start=$SECONDS
declare -A RC
for run in "${RUNS[@]}"; do
  IFS='|' read -r label name args <<< "$run"
  [ -n "${BIN[$name]:-}" ] || continue
  # shellcheck disable=SC2086
  timeout --kill-after=5 60 "${BIN[$name]}" $args > "$O/$label.log" 2>&1
  rc=$?
  RC[$label]=$rc
  echo "-- $label: rc=$rc"
  [ $rc -eq 0 ] || { failed=1; grep -v '^RESULT' "$O/$label.log" | tail -8; }
done
echo "== ran in $((SECONDS - run_start)) s"

# The table: per pair "ms (% of memcpy)"; "bits": each pair's sample hash against the default's.
PAIRS=("f32 -> f32" "bf16 -> bf16" "f32 -> bf16" "f16 -> f16")
printf '\n%-21s %-22s' config "ptxas"
for p in "${PAIRS[@]}"; do printf ' %-17s' "$p"; done
printf ' %s\n' "bits"
declare -A BASE
for run in "${RUNS[@]}"; do
  IFS='|' read -r label name args <<< "$run"
  [ -f "$O/$label.log" ] && [ -n "${BIN[$name]:-}" ] || continue
  printf '%-21s %-22s' "$label" "$(kernel_use "$O/$name.compile.log")"
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
printf 'cudaMemcpyAsync of the destination bytes (the plain swap of same-type pairs). Full tables: %s/<config>.log\n' "$O"
for entry in "${CONFIGS[@]}"; do printf '  %-14s %s\n' "${entry%%|*}" "${entry#*|}"; done
for run in "${EXTRA_RUNS[@]}"; do printf '  %-14s %s\n' "${run%%|*}" "the build of $(cut -d'|' -f2 <<< "$run"), run with $(cut -d'|' -f3 <<< "$run")"; done
echo "== total $((SECONDS - start)) s"
echo "a configuration into the library (its flags, quoted): CUDAFLAGS=\"FLAGS\" CXXFLAGS=\"FLAGS\" bash scripts/gpu_test.sh build"
exit $failed
