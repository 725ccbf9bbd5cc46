#!/usr/bin/env bash
# Builds the vLLM GPU payload from the package registries (on a machine with network access):
# vLLM 0.26.0 (the newest release that pins the GPU image's torch, 2.11.0) trimmed to what a
# Hopper GPU runs, and the small wheels the image lacks, as one tar.xz split into pieces that
# each travel in one device call. scripts/gpu_test.sh's `vllm_payload` step puts the pieces back
# together, checks them by sha256 and unpacks them into $VLLM_SITE (docs/development.md).
#
#   bash scripts/vllm_gpu_payload.sh [DIR]     (default DIR: .vllm-payload, git-ignored)
#
# What is left out of vLLM's wheel, and why (the GPU machines are Hopper, sm_90):
#   vllm_flash_attn/_vllm_fa2_C   FlashAttention 2, imported behind a guard; Hopper runs FA3
#   vllm-rs                       the opt-in Rust frontend
#   deep_gemm/_C for Pythons other than 3.12, and the CUTLASS headers of deep_gemm and fmha_sm100
#   (compiled at run time for FP8 and Blackwell kernels only)
#   other architectures' GPU code in _C and _moe_C: zeroed by scripts/prune_fatbin.py, so xz
#   removes it (the files keep their size and layout)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.vllm-payload}
VLLM=0.26.0
PIECE=${PIECE:-56M}   # a device call carries 64 MiB with the working tree (one piece today)
# Beyond the GPU image (Python 3.12, torch 2.11.0+cu130, transformers 5.17): what vLLM's engine
# imports on the way to serving a model with load_format="dummy" and no tokenizer.
# apache-tvm-ffi: newer than vLLM's pin (0.1.10), which the newest xgrammar on the registry does not load with.
SMALL="annotated-types==0.7.0 apache-tvm-ffi httpx2 blake3 cachetools cbor2 fastapi<0.137 jiter
llguidance msgspec openai openai-harmony partial-json-parser pybase64 pydantic>=2.12,<2.13
pydantic-core==2.41.5 pyzmq setproctitle sniffio starlette typing-inspection xgrammar<1 ijson
depyf==0.20.0 astor dill lark==1.2.2 python-json-logger diskcache gguf prometheus-client
prometheus-fastapi-instrumentator watchfiles anyio h11 httpcore httpx distro py-cpuinfo cloudpickle
einops compressed-tensors==0.17.0 lm-format-enforcer==0.11.3 interegular msgpack"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source scripts/wheels.sh   # download DIR SPEC...
echo "== downloading vllm==$VLLM (about 300 MB)"
download "$work/vllm" "vllm==$VLLM"
echo "== downloading the small wheels"
# shellcheck disable=SC2086
download "$work/small" $SMALL
site="$work/site"
mkdir -p "$site"
echo "== unpacking vLLM, less what Hopper does not run"
unzip -q "$work"/vllm/vllm-*.whl -d "$site"
rm -f "$site"/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$site"/vllm/vllm-rs \
      "$site"/vllm/third_party/deep_gemm/_C.cpython-3{10,11,13,14}-*.so
rm -rf "$site"/vllm/third_party/fmha_sm100 "$site"/vllm/third_party/deep_gemm/include
python3 scripts/prune_fatbin.py --arch 90 "$site"/vllm/_C_stable_libtorch.abi3.so "$site"/vllm/_moe_C_stable_libtorch.abi3.so
for wheel in "$work"/small/*.whl; do unzip -q -o "$wheel" -d "$site"; done
# apache-tvm-ffi's sources and headers: for building extensions, not for running them (its core links its test library)
rm -rf "$site"/tvm_ffi/src "$site"/tvm_ffi/include "$site"/tvm_ffi/3rdparty "$site"/tvm_ffi/cython \
       "$site"/tvm_ffi/lib/*.a
echo "== compressing (a few minutes)"
mkdir -p "$OUT"
rm -f "$OUT"/vllm-gpu.tar.xz.* "$OUT"/SHA256SUMS
tar -C "$site" -cf - . | xz -T0 -6 | split -b "$PIECE" -d - "$OUT/vllm-gpu.tar.xz."
(cd "$OUT" && sha256sum vllm-gpu.tar.xz.* > SHA256SUMS && cat SHA256SUMS && du -ch vllm-gpu.tar.xz.* | tail -1)
