#!/usr/bin/env bash
# On the GPU machine (no network): build against the image's packages, run the
# tests marked gpu/multigpu, run the benchmarks, print a short summary.
# Usage: bash scripts/gpu_test.sh [extra pytest args]   (logs go to $OUT when set)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG=${OUT:-/tmp}/gpu_test.log
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0  # never NVLink multicast on shared machines
# The image's default CXX (/opt/gcc) links its own libstdc++ statically into the
# module, which then clashes with the system libstdc++ that jaxlib/ml_dtypes load
# (a segfault in std::ostream at `import jax`). Build with the system compiler.
for c in /usr/bin/gcc /usr/bin/g++; do [ -x $c ] || { echo "missing $c"; exit 1; }; done
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
now() { $PY -c 'import time; print(f"{time.time():.1f}")'; }
: > "$LOG"

start=$(now)
rm -rf build
$PY -m pip install -q --no-build-isolation --no-deps . >>"$LOG" 2>&1
build_rc=$?
build_s=$($PY -c "print(f\"{$(now) - $start:.1f}\")")
echo "build: rc=$build_rc in ${build_s}s" | tee -a "$LOG"
[ $build_rc -eq 0 ] || { tail -40 "$LOG"; exit $build_rc; }

$PY -P -c "import jax_amem, jax; print(jax_amem.gpu_status()); print(jax.devices())" 2>&1 | tee -a "$LOG"
$PY -P -m pytest -q -m "gpu or multigpu" tests "$@" 2>&1 | tee -a "$LOG" | tail -25
test_rc=${PIPESTATUS[0]}
$PY -P -m jax_amem bench 2>&1 | tee -a "$LOG"
echo "summary: build ${build_s}s rc=$build_rc; gpu tests rc=$test_rc" | tee -a "$LOG"
exit $test_rc
