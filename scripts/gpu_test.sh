#!/usr/bin/env bash
# On the GPU machine (no network): named steps, each well inside one 10-minute device call,
# each with its own time limit and a one-line summary; a summary table at the end.
#
#   bash scripts/gpu_test.sh [STEP ...]          (no step: all of them, in this order)
#   make gpu-test STEPS="build nccl nccl_new"
#
# Steps:
#   build          pip install . (the image's compilers; see below). The transpose kernel's two options
#                  left to measure (src/copy/transpose_tuning.h) are built into the library by
#                  scripts/tune_transpose.sh, which passes their flags to CMake's CUDA compiles:
#                  CUDAFLAGS="$F" bash scripts/gpu_test.sh build swap_scale
#   gpu            the in-process GPU tests (one pytest process; no multi-process test in it)
#   swap_ipc       tests/test_swap_ipc.py          (two processes: a pytest process of its own)
#   swap_nccl      tests/test_swap_nccl.py -m gpu  (two processes)
#   vllm_nccl      tests/test_vllm_nccl.py -m gpu  (the vLLM backend's NCCL transport: a trainer and two
#                  TP rank processes on one GPU, each its own NCCL_HOSTID; benchmarks/vllm_ipc.py --transport nccl)
#   swap_multigpu  tests/test_swap_multigpu.py     (needs 2+ GPUs: skips on one)
#   nccl           NCCL pause/resume of XLA's communicators, 2 and 4 JAX processes, the image's NCCL
#   nccl_new       the same with the NCCL in $NCCL_NEW (e.g. NCCL_NEW=/tmp/libnccl.so.2, 2.30.7)
#   bench          benchmarks/nccl_pause.py (with $NCCL_NEW when set), benchmarks/nccl_agreement.py and
#                  `python -m jax_amem bench`
#   nccl_scale     benchmarks/nccl_pause.py --scale: 10.5 GB of NCCL device memory per process (64-channel
#                  communicators of our own, two processes on one GPU) paused and resumed with $NCCL_NEW
#                  (when set) and the image's NCCL, against the naive rebuild; then 4 communicators at
#                  NCCL's default buffers over 100 cycles (memory flat); about 4 minutes; not in the
#                  default list: name it
#   nccl_strategies every pause strategy side by side (benchmarks/nccl_pause.py --strategies): auto on its
#                  starting and on its measured rates, suspend, recreate and the naive rebuild on the first
#                  4, 8 and 32 communicators of our own, at NCCL's default buffers and at 16 channels, for
#                  the image's NCCL and each of $NCCL_NEW and $NCCL_NEWER that is set (e.g. 2.30.7, 2.32.3),
#                  or the libraries in $STRATEGY_LIBS ("image" for the image's); $STRATEGY_CHANNELS ("0 16"),
#                  $STRATEGY_METHODS (three cycles of each, one naive), $STRATEGY_LIMIT (280 s a step); on an
#                  H100 about 1 minute per NCCL at default buffers and 2.5 at 16 channels (the naive rebuild
#                  of 32 does not finish in 165 s): one device call per channel setting; not in the default list
#   nccl_payload   the NCCL libraries carried in .nccl-VERSION/ (made here by scripts/nccl_payload.sh), checked
#                  by sha256 and unpacked into /tmp/nccl-VERSION/ (kept by a warm machine: a later call
#                  needs no carry), each loaded and its version read; sets $NCCL_NEW and $NCCL_NEWER to
#                  the oldest and newest of them for the steps after it (unless set); not in the default list
#   nccl_rss       the long cycles: host RSS per 100 cycles over 500 cycles of each strategy and the naive
#                  rebuild over 150 ($RSS_METHODS; the controls that tell whose a growth is, named there:
#                  the naive rebuild initialised in one group as recreate does (naive_group), recreate
#                  without the teardown's threads (recreate_inturn) and without giving free host memory
#                  back (recreate_notrim)), $RSS_COUNT (4) communicators at NCCL's default buffers,
#                  for the image's NCCL and $NCCL_NEW / $NCCL_NEWER; each method of each NCCL in processes
#                  of its own, all at once; at most $RSS_LIMIT (560) s, each method's cycles stopping
#                  2 minutes before it (the cycles run are reported); the image's NCCL once more under
#                  MALLOC_ARENA_MAX=$RSS_ARENA (empty, the default: not run) for $RSS_ARENA_METHODS (default: the
#                  recreate of $RSS_METHODS); not in the default list: name it
#   demo_real      `python -m jax_amem demo --preset qwen3-1.7b` (the real-size switch; ~3-4 min;
#                  not in the default list: name it); its figures in $OUT/h200_qwen3_1.7b.json
#   hostile_demo   the hostile suite's case that runs the whole tiny demo with JAX on CPU on a GPU host
#                  (about 9 minutes; not in the default list)
#   multigpu       the multi-GPU group (2+ GPUs; skips on one): swaps across GPUs, the pause on every
#                  GPU, XLA's communicators with one process per GPU (nccl_pause.py --gpus), NUMA placement
#   numa           benchmarks/staging_numa.py: the pinned copy through a pool on the GPU's own NUMA node
#                  against each other node (one line where the host has one node); not in the default list
#   swap_sweep     benchmarks/swap.py's cases, then its tensor-size sweep
#                  ($OUT/h200_swap_sweep.json: what the notebooks plot); not in the default list
#   swap_scale     benchmarks/swap_scale.py (a fused constant scale against the same swap without it,
#                  4 x 512 MiB, both launched directly), then the GPU tests of constant steps (the
#                  direct launch's, transposed ones included, and the custom call's); not in the default list
#   vllm_ipc       benchmarks/vllm_ipc.py (CUDA IPC into two TP rank processes holding a Qwen3-0.6B's slices):
#                  the update in batches (the default budget) and one group per commit (--staging-bytes 0),
#                  then scripts/profile_vllm_update.py (about 3 minutes; not in the default list)
#   tune_affine    scripts/tune_affine.sh: the affine kernel against cudaMemcpyAsync, with several row
#                  piece sizes, bit-checked (about a minute; not in the default list)
#   vllm_payload   scripts/vllm_gpu_install.sh: the vLLM 0.26 payload carried in .vllm-payload (made here by
#                  scripts/vllm_gpu_payload.sh), checked and unpacked into $VLLM_SITE (/tmp/vllm-site); the
#                  vLLM steps below put it first on PYTHONPATH; not in the default list
#   vllm_gpu       tests/test_vllm_gpu.py: real vLLM GPU engines updated by the backend (in process, in vLLM's
#                  engine-core process over CUDA IPC, the colocated loop with sleep mode); not in the default list
#   vllm_bench     benchmarks/vllm_update.py on the GPU (a Qwen3-0.6B-shaped bf16 engine, the update against one
#                  device copy of its bytes and against device_get + vLLM's reload), in process and with the
#                  engine core in its own process; from a float32 and a bfloat16 trainer; $VLLM_BENCH_ARGS
#                  (e.g. "--trace 12": the update's kernels) go to the in-process run; needs vllm_payload;
#                  not in the default list
#   vllm_colocated benchmarks/vllm_colocated.py: the colocated switch at real size (a Qwen3-1.7B-shaped float32
#                  trainer with Adam, a bf16 engine with sleep mode, levels 1 and 2) against its bound and two
#                  baselines; figures in $OUT/vllm_colocated.json; needs vllm_payload; not in the default list
#   vllm_demo      `python -m jax_amem demo --preset qwen3-1.7b --rollout vllm` (the real-size loop with a vLLM
#                  engine colocated by sleep mode); figures in $OUT/vllm_demo_qwen3_1.7b.json; needs
#                  vllm_payload; not in the default list
#   tune_transpose scripts/tune_transpose.sh: the same for the fused transpose-and-cast kernel on the
#                  real-size preset's rows (about a minute; not in the default list; its stepped
#                  configurations are run by name: bash scripts/tune_transpose.sh stepped_vector)
#
# Multi-process tests never share a pytest process that already started JAX's GPU backend
# (they hung there): each such file runs in a pytest process of its own, whose JAX stays
# on no backend (the workers are separate processes). Logs go to $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
O=${OUT:-/tmp}
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0  # never NVLink multicast on shared machines
# The image's default CXX (/opt/gcc) links its own libstdc++ statically into the
# module, which then clashes with the system libstdc++ that jaxlib/ml_dtypes load
# (a segfault in std::ostream at `import jax`). Build with the system compiler.
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
# On the GPU machine the CUDA kernels are the point: compile them or fail the build (AUTO would
# skip them quietly where nvcc is not on PATH, as it is not in the image's default PATH).
for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
  command -v nvcc >/dev/null || { [ -x $d/nvcc ] && export PATH=$PATH:$d; }
done
export JAX_AMEM_CUDA=${JAX_AMEM_CUDA:-ON}
export VLLM_SITE=${VLLM_SITE:-/tmp/vllm-site}   # the vLLM payload, unpacked by the vllm_payload step
# The payload leaves out FlashInfer (it compiles its kernels at run time); vLLM's sampler would import it.
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
ALL="build gpu swap_ipc swap_nccl vllm_nccl swap_multigpu nccl nccl_new bench"
STEPS=${*:-${STEPS:-$ALL}}
MULTI_PROCESS="tests/test_nccl_gpu.py tests/test_nccl_xla_mesh.py tests/test_swap_ipc.py tests/test_swap_nccl.py tests/test_swap_multigpu.py tests/test_vllm_nccl.py"
SUMMARY=()
failed=0

# step NAME LIMIT_S COMMAND...: runs it under `timeout`, logs to $O/NAME.log, prints a summary line.
step() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$O/$name.log" 2>&1
  local rc=$?
  local seconds=$((SECONDS - start))
  # The last pytest summary line, or the log's last line.
  local said
  said=$(grep -E "[0-9]+ (passed|failed|skipped|error)|no tests ran" "$O/$name.log" | tail -1)
  [ -n "$said" ] || said=$(grep -v '^\s*$' "$O/$name.log" | tail -1)
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && said="TIMED OUT after ${limit}s; $said"
  grep -v '^[EW][0-9]\{4\} \|^=== \|^external/\|^Additional GRPC\|^:UNAVAILABLE\|^:CANCELLED' "$O/$name.log" | tail -${TAIL:-12}
  echo "-- $name: rc=$rc in ${seconds}s: $said"
  SUMMARY+=("$(printf '%-14s rc=%-3s %5ss  %s' "$name" "$rc" "$seconds" "$said")")
  [ $rc -eq 0 ] || failed=1
}

# The NCCL steps' library: "image" (the image's NCCL) or a libnccl.so.2; its tag is the name of the
# folder that holds it (e.g. .nccl-2.30.7/libnccl.so.2: nccl-2.30.7).
nccl_tag() {
  if [ "$1" = image ]; then echo image
  elif [ -f "$1" ]; then local d; d=$(basename "$(dirname "$1")"); echo "${d#.}"
  else echo "-- $1 not found" >&2; return 1; fi
}
nccl_env() { if [ "$1" = image ]; then echo "env -u JAX_AMEM_NCCL_LIBRARY"; else echo "env JAX_AMEM_NCCL_LIBRARY=$1"; fi; }

ignore_multi() { for f in $MULTI_PROCESS; do printf -- '--ignore=%s ' "$f"; done; }

nccl_tests() {  # the NCCL files, each in a pytest process of its own ($NCCL_TEST_FILES: a subset)
  local rc=0
  for f in ${NCCL_TEST_FILES:-tests/test_nccl_gpu.py tests/test_nccl_xla_mesh.py}; do
    $PY -P -m pytest -q -rs -m "gpu or multigpu" "$f" || rc=1
  done
  return $rc
}

for name in $STEPS; do
  case $name in
    build)
      rm -rf build
      step build 300 $PY -m pip install -q --no-build-isolation --no-deps . ;;
    gpu)
      # shellcheck disable=SC2046
      # Two tests are not for this process: the affine NCCL test starts two processes (run by
      # swap_nccl), and the hostile suite's whole-demo case takes most of a call (hostile_demo).
      step gpu 540 $PY -P -m pytest -q -m "gpu or multigpu" tests $(ignore_multi) \
        -k "not over_nccl and not gpu_demo" ;;
    hostile_demo)
      step hostile_demo 560 $PY -P -m pytest -q -rs -m gpu tests/test_hostile_inputs.py -k gpu_demo ;;
    swap_ipc)
      step swap_ipc 300 $PY -P -m pytest -q tests/test_swap_ipc.py ;;
    swap_nccl)
      # Only its GPU tests: the others stand CPU devices in for the link's GPU (CI runs them), and
      # on the GPU machine they would start JAX's GPU backend in this pytest process, which the
      # two-process GPU tests after them cannot share (they hung there).
      step swap_nccl 400 $PY -P -m pytest -q -rs -m gpu tests/test_swap_nccl.py tests/test_swap_affine.py -k "not test_gpu_ or over_nccl" ;;
    vllm_nccl)
      step vllm_nccl 540 $PY -P -m pytest -q -rs -m gpu tests/test_vllm_nccl.py ;;
    swap_multigpu)
      step swap_multigpu 540 $PY -P -m pytest -q -rs -m multigpu tests/test_swap_multigpu.py ;;
    nccl)
      step nccl 540 env -u JAX_AMEM_NCCL_LIBRARY bash -c "$(declare -f nccl_tests); PY=$PY nccl_tests" ;;
    nccl_new)
      if [ -z "${NCCL_NEW:-}" ] || [ ! -f "${NCCL_NEW}" ]; then
        echo "-- nccl_new: skipped (set NCCL_NEW to a libnccl.so.2 >= 2.29.7, e.g. /tmp/libnccl.so.2)"
        SUMMARY+=("$(printf '%-14s skipped: NCCL_NEW not set' nccl_new)")
        continue
      fi
      step nccl_new 540 env JAX_AMEM_NCCL_LIBRARY="$NCCL_NEW" bash -c "$(declare -f nccl_tests); PY=$PY nccl_tests" ;;
    bench)
      if [ -n "${NCCL_NEW:-}" ] && [ -f "${NCCL_NEW}" ]; then
        step bench_nccl 400 env JAX_AMEM_NCCL_LIBRARY="$NCCL_NEW" $PY -P benchmarks/nccl_pause.py --processes 2 4 --cycles 1000
      else
        step bench_nccl 400 $PY -P benchmarks/nccl_pause.py --processes 2 4 --cycles 100
      fi
      step bench_agreement 200 $PY -P benchmarks/nccl_agreement.py --processes 2 4  # the store's floor on this host
      step bench 300 $PY -P -m jax_amem bench ;;
    nccl_scale)
      SCALE="$PY -P benchmarks/nccl_pause.py --scale 10.5G --buffsize 4M --channels 64 --use 2 --naive --timeout 200"
      CYCLES="$PY -P benchmarks/nccl_pause.py --scale 4 --buffsize 4M --channels 0 --naive --timeout 100"
      if [ -n "${NCCL_NEW:-}" ] && [ -f "${NCCL_NEW}" ]; then
        TAIL=16 step nccl_scale_new 220 env JAX_AMEM_NCCL_LIBRARY="$NCCL_NEW" $SCALE --methods auto:3,auto@group:1,recreate:2
        TAIL=16 step nccl_cycles_new 110 env JAX_AMEM_NCCL_LIBRARY="$NCCL_NEW" $CYCLES --methods auto:100,recreate:20
      else
        echo "-- nccl_scale: NCCL_NEW not set: the image's NCCL alone (no suspend)"
      fi
      TAIL=16 step nccl_scale 220 env -u JAX_AMEM_NCCL_LIBRARY $SCALE --methods recreate:2
      TAIL=16 step nccl_cycles 110 env -u JAX_AMEM_NCCL_LIBRARY $CYCLES --methods recreate:20 ;;
    nccl_payload)
      for xz in .nccl-*/libnccl.so.2.xz; do   # carried now: checked and unpacked (else a warm machine's)
        [ -f "$xz" ] || continue
        dir=/tmp/$(basename "$(dirname "$xz")" | sed 's/^\.//'); mkdir -p "$dir"
        xz -dc "$xz" > "$dir/libnccl.so.2" && (cd "$dir" && sha256sum -c --quiet "$OLDPWD/$(dirname "$xz")/SHA256SUMS") \
          || { echo "-- nccl_payload: $xz does not unpack to the library its SHA256SUMS names"; failed=1; rm -f "$dir/libnccl.so.2"; }
      done
      libs=$(ls -d /tmp/nccl-*/libnccl.so.2 2>/dev/null | sort -V)
      for lib in $libs; do
        $PY -c "import ctypes,sys; v=ctypes.c_int(); ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v)); print(sys.argv[1], 'NCCL', v.value)" "$lib" \
          || { echo "-- nccl_payload: $lib does not load"; failed=1; }
      done
      NCCL_NEW=${NCCL_NEW:-$(echo "$libs" | head -1)}
      NCCL_NEWER=${NCCL_NEWER:-$(echo "$libs" | sed -n '2,$p' | tail -1)}
      SUMMARY+=("$(printf '%-14s NCCL_NEW=%s NCCL_NEWER=%s' nccl_payload "${NCCL_NEW:-none}" "${NCCL_NEWER:-none}")")
      echo "-- nccl_payload: NCCL_NEW=${NCCL_NEW:-none} NCCL_NEWER=${NCCL_NEWER:-none}" ;;
    vllm_payload)
      step vllm_payload 240 bash scripts/vllm_gpu_install.sh .vllm-payload ;;
    vllm_gpu)
      TAIL=${TAIL:-40} step vllm_gpu ${VLLM_LIMIT:-560} env PYTHONPATH="$VLLM_SITE${PYTHONPATH:+:$PYTHONPATH}" \
        $PY -P -m pytest -v -rs ${VLLM_TESTS:-tests/test_vllm_gpu.py} ;;
    vllm_bench)
      TAIL=${TAIL:-12} step vllm_bench 240 env PYTHONPATH="$VLLM_SITE${PYTHONPATH:+:$PYTHONPATH}" \
        $PY -P benchmarks/vllm_update.py --repeats 5 --trainer-dtypes float32,bfloat16 ${VLLM_BENCH_ARGS:-}
      TAIL=${TAIL:-12} step vllm_bench_process 240 env PYTHONPATH="$VLLM_SITE${PYTHONPATH:+:$PYTHONPATH}" \
        $PY -P benchmarks/vllm_update.py --repeats 5 --engine-process ;;
    vllm_colocated)
      TAIL=${TAIL:-40} step vllm_colocated 300 env PYTHONPATH="$VLLM_SITE${PYTHONPATH:+:$PYTHONPATH}" \
        $PY -P benchmarks/vllm_colocated.py --json "$O/vllm_colocated.json" ;;
    vllm_demo)
      # The whole summary (about 30 lines), not the last 12.
      TAIL=${TAIL:-40} step vllm_demo 420 env PYTHONPATH="$VLLM_SITE${PYTHONPATH:+:$PYTHONPATH}" \
        $PY -P -m jax_amem demo --preset qwen3-1.7b --rollout vllm --json "$O/vllm_demo_qwen3_1.7b.json" ;;
    nccl_strategies)
      for lib in ${STRATEGY_LIBS:-image ${NCCL_NEW:-} ${NCCL_NEWER:-}}; do
        tag=$(nccl_tag "$lib") || continue
        STRAT="$PY -P benchmarks/nccl_pause.py --strategies 4,8,32 --methods ${STRATEGY_METHODS:-auto0:3,suspend:3,recreate:3,auto:3,naive:1} --timeout $((${STRATEGY_LIMIT:-280} - 20))"
        for ch in ${STRATEGY_CHANNELS:-0 16}; do  # 0: NCCL's default buffers
          name="strategies_${tag}$([ "$ch" = 0 ] || echo "_${ch}ch")"
          TAIL=40 step "$name" "${STRATEGY_LIMIT:-280}" $(nccl_env "$lib") $STRAT --channels "$ch" --json "$O/$name.json"
        done
      done ;;
    nccl_rss)
      # One bench per NCCL and method, each in a pair of processes of its own, all at once (the RSS
      # slope does not depend on the speed): what a method's first cycles open (threads, glibc's
      # arenas, NCCL's caches) is its own, not the method run before it. Each log apart.
      rss_one() {  # LIB TAG METHODS
        $(nccl_env "$1") $PY -P benchmarks/nccl_pause.py --strategies 1 --methods "" --channels 0 --rss ${RSS_COUNT:-4} \
          --rss-methods "$3" --timeout $((${RSS_LIMIT:-560} - 20)) --rss-seconds $((${RSS_LIMIT:-560} - 120)) \
          --json "$O/rss_$2.json"
      }
      rss_start() {  # LIB TAG METHODS: in the background, logged apart
        rss_one "$@" > "$O/rss_$2.log" 2>&1 &
        pids+=($!)
      }
      methods=${RSS_METHODS:-naive:150,recreate:500,suspend:500,auto:500}  # 11 pairs with three NCCLs
      pids=()
      for lib in image ${NCCL_NEW:-} ${NCCL_NEWER:-}; do
        tag=$(nccl_tag "$lib") || continue
        for spec in ${methods//,/ }; do
          [ "$tag" = image ] && [ "${spec%%:*}" = suspend ] && continue   # 2.28 has no suspend
          rss_start "$lib" "${tag}_${spec%%:*}" "$spec"
        done
      done
      # The image's NCCL again with glibc held to $RSS_ARENA malloc arenas (unset or empty: not run), for the
      # methods in $RSS_ARENA_METHODS (default: the recreate of $RSS_METHODS): whether a growth is
      # per-thread arenas opened by NCCL's and the teardown's threads.
      arenas=${RSS_ARENA:-}
      arena_methods=${RSS_ARENA_METHODS:-$(tr ',' '\n' <<< "$methods" | grep '^recreate:' || true)}
      if [ -n "$arenas" ]; then
        for spec in ${arena_methods//,/ }; do
          MALLOC_ARENA_MAX=$arenas rss_start image "image_arena${arenas}_${spec%%:*}" "$spec"
        done
      fi
      TAIL=${TAIL:-80} step nccl_rss "${RSS_LIMIT:-560}" bash -c "wait_all() { for p in ${pids[*]}; do while kill -0 \$p 2>/dev/null; do sleep 1; done; done; }; wait_all; for f in $O/rss_*.log; do echo \"== \$f\"; grep -A3 'host RSS over the cycles' \$f | grep 'rank' || tail -6 \$f; done; true" ;;
    tune_affine)
      TAIL=${TAIL:-40} step tune_affine 540 bash scripts/tune_affine.sh ;;
    tune_transpose)
      TAIL=${TAIL:-40} step tune_transpose 540 bash scripts/tune_transpose.sh ;;
    demo_real)
      # The whole summary (about 40 lines), not the last 12.
      TAIL=${TAIL:-60} step demo_real 480 $PY -P -m jax_amem demo --preset qwen3-1.7b --json "$O/h200_qwen3_1.7b.json" ;;
    numa)
      step numa 120 $PY -P benchmarks/staging_numa.py --gib 2 ;;
    multigpu)
      # The multi-GPU group, one device call: swaps across GPUs, XLA's communicators with one
      # process per GPU (2 or 4 of them: the mesh worker's shapes), the pause on every GPU,
      # the staging pool's NUMA placement. Skips with fewer than two GPUs.
      gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
      if [ "${gpus:-0}" -lt 2 ]; then
        echo "-- multigpu: skipped ($gpus GPU)"; SUMMARY+=("$(printf '%-14s skipped: %s GPU' multigpu "$gpus")"); continue
      fi
      mesh=$([ "$gpus" -ge 4 ] && echo 4 || echo 2)
      step swap_multigpu 200 $PY -P -m pytest -q -rs -m multigpu tests/test_swap_multigpu.py
      step pause_multigpu 100 $PY -P -m pytest -q -rs -m multigpu tests/test_pause_gpu.py
      if [ -n "${NCCL_NEW:-}" ] && [ -f "${NCCL_NEW}" ]; then
        step nccl_multigpu 150 env JAX_AMEM_NCCL_LIBRARY="$NCCL_NEW" $PY -P benchmarks/nccl_pause.py --processes 2 $mesh --gpus $gpus --cycles 200
      else
        step nccl_multigpu 150 $PY -P benchmarks/nccl_pause.py --processes 2 $mesh --gpus $gpus --cycles 200
      fi
      step numa 60 $PY -P benchmarks/staging_numa.py --gib 2 ;;
    swap_sweep)
      TAIL=${TAIL:-20} step swap_cases 200 $PY -P benchmarks/swap.py --repeats 20
      TAIL=${TAIL:-20} step swap_sweep 300 $PY -P benchmarks/swap.py --sweep --repeats 15 --json "$O/h200_swap_sweep.json" ;;
    swap_scale)
      TAIL=${TAIL:-20} step swap_scale 240 $PY -P benchmarks/swap_scale.py
      step affine_gpu 300 $PY -P -m pytest -q -m gpu tests/test_swap_direct_affine.py tests/test_swap_affine.py \
        tests/test_swap_transpose_steps.py -k "not over_nccl" ;;
    vllm_ipc)
      TAIL=${TAIL:-14} step vllm_ipc 240 $PY -P benchmarks/vllm_ipc.py --repeats 5
      TAIL=${TAIL:-14} step vllm_ipc_groups 240 $PY -P benchmarks/vllm_ipc.py --repeats 5 --staging-bytes 0
      TAIL=${TAIL:-12} step vllm_profile 120 $PY -P scripts/profile_vllm_update.py --repeats 5 ;;
    *)
      echo "unknown step '$name' (steps: $ALL nccl_scale nccl_strategies nccl_rss demo_real swap_sweep swap_scale vllm_ipc vllm_payload vllm_gpu vllm_bench vllm_colocated vllm_demo numa multigpu hostile_demo)"; exit 2 ;;
  esac
done

echo "== summary (logs in $O)"
printf '%s\n' "${SUMMARY[@]}"
exit $failed
