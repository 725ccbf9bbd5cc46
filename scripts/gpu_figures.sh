#!/usr/bin/env bash
# On the GPU machine: build, then the GPU tests that are quick and every benchmark whose
# figures go into docs/benchmarks.md, each into its own log under $OUT (or /tmp). About 20
# minutes in all: split it over two device calls (each call runs 10 minutes at most), e.g.
# STEPS="gpu_tests swap_tests ipc_tests nccl_swap_tests" bash scripts/gpu_figures.sh, then
# STEPS="swap_bench swap_ipc_bench swap_nccl_bench swap_dispatch nccl_bench pause_bench demo".
# Usage: bash scripts/gpu_figures.sh
set -u
R=$(cd "$(dirname "$0")/.." && pwd)
O=${OUT:-/tmp}
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++  # see scripts/gpu_test.sh
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
(cd "$R" && python3 -m pip install -q --no-build-isolation --no-deps .) > "$O/build.log" 2>&1 || { tail -30 "$O/build.log"; exit 1; }
cd /tmp
step() { local name=$1 limit=$2; shift 2
  if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then return; fi
  echo "== $name"; timeout "$limit" "$@" > "$O/$name.txt" 2>&1; echo "rc=$?"; grep -v '^[EW][0-9]\{4\} \|^=== \|^external/\|^Additional GRPC\|^:UNAVAILABLE\|^:CANCELLED' "$O/$name.txt" | tail -${TAIL:-14}; }
step gpu_tests 200 python3 -P -m pytest -q -m gpu "$R/tests/test_swap_llama.py" "$R/tests/test_segment_copy.py" "$R/tests/test_nccl_gpu.py" -k "not hundred"
step swap_tests 150 python3 -P -m pytest -q -m gpu "$R/tests/test_copy_to_addresses.py" "$R/tests/test_swap_addresses.py" "$R/tests/test_swap_batched.py" "$R/tests/test_segment_copy_many.py"
# Two-process tests and benchmarks: each in a process of its own (no JAX GPU backend in the parent).
step ipc_tests 150 python3 -P -m pytest -q "$R/tests/test_swap_ipc.py"
step nccl_swap_tests 150 python3 -P -m pytest -q "$R/tests/test_swap_nccl.py"
step swap_bench 150 python3 -P "$R/benchmarks/swap.py"
step swap_ipc_bench 120 python3 -P "$R/benchmarks/swap_ipc.py"
step swap_nccl_bench 120 python3 -P "$R/benchmarks/swap_nccl.py"
step swap_dispatch 100 python3 -P "$R/scripts/profile_dispatch.py"
step nccl_bench 400 python3 -P "$R/benchmarks/nccl_pause.py" --processes 2 --cycles 1000 --timeout 360
step pause_bench 100 python3 -P "$R/benchmarks/pause_resume.py" --gib 8
TAIL=30 step demo 150 python3 -P -m jax_amem demo --quick
