#!/usr/bin/env bash
# Builds the NCCL libraries the GPU machines lack, from the package registry (on a machine with
# network access): each version's libnccl.so.2 from the `nvidia-nccl-cu13` wheel, trimmed to what
# a Hopper GPU runs and compressed, for carrying to a GPU machine without network.
#
#   bash scripts/nccl_payload.sh [VERSION ...]     (default: 2.30.7 2.32.6; 2.29.7 is the first with
#                                                   ncclCommSuspend)
#
# Writes .nccl-VERSION/libnccl.so.2.xz and .nccl-VERSION/SHA256SUMS (of the unpacked library),
# git-ignored. The wheels hold GPU code for every architecture (344 MB for 2.32.3): every other
# architecture's code, in the linked modules and in the relocatable ones kept beside them, is
# zeroed in place by scripts/prune_fatbin.py, so xz removes it (24 MB for 2.32.6, 36 MB for
# 2.30.7: one per device call, back to back). On the GPU machine, scripts/gpu_test.sh's
# `nccl_payload` step checks and unpacks them and points the NCCL steps at them
# (docs/development.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSIONS=${*:-2.30.7 2.32.6}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source scripts/wheels.sh   # download DIR SPEC...
for version in $VERSIONS; do
  out=.nccl-$version
  echo "== nvidia-nccl-cu13==$version"
  download "$work/$version" "nvidia-nccl-cu13==$version"
  unzip -q -o "$work/$version"/nvidia_nccl_cu13-*.whl 'nvidia/nccl/lib/libnccl.so.2' -d "$work/$version"
  lib=$work/$version/nvidia/nccl/lib/libnccl.so.2
  python3 scripts/prune_fatbin.py --arch 90 --relocatable "$lib"
  mkdir -p "$out"
  (cd "$(dirname "$lib")" && sha256sum libnccl.so.2) > "$out/SHA256SUMS"
  xz -9 -T0 -c "$lib" > "$out/libnccl.so.2.xz"
  echo "   $out/libnccl.so.2.xz: $(du -h "$out/libnccl.so.2.xz" | cut -f1)"
done
