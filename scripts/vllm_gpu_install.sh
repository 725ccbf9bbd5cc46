#!/usr/bin/env bash
# On the GPU machine: gathers the vLLM payload's pieces (scripts/vllm_gpu_payload.sh) from the
# carried folder into /tmp, where a warm machine keeps them between calls, checks each by sha256
# and, once every piece is there, unpacks them into $VLLM_SITE (once). Prints what is missing.
#
#   bash scripts/vllm_gpu_install.sh [CARRIED]      (default CARRIED: .vllm-payload)
#   export PYTHONPATH=$VLLM_SITE:$PYTHONPATH        (what scripts/gpu_test.sh's vLLM steps do)
set -uo pipefail
CARRIED=${1:-.vllm-payload}
PIECES=${VLLM_PIECES:-/tmp/vllm-payload}
SITE=${VLLM_SITE:-/tmp/vllm-site}
extras() {  # wheels carried beside the payload (CARRIED/extra/*.whl), unpacked over it
  for wheel in "$CARRIED"/extra/*.whl; do
    [ -f "$wheel" ] && python3 -m zipfile -e "$wheel" "$SITE/" && echo "vLLM payload: added $(basename "$wheel")"
  done
  return 0
}
if [ -f "$SITE/.complete" ]; then
  echo "vLLM payload: already unpacked in $SITE"; extras; exit 0
fi
mkdir -p "$PIECES"
[ -d "$CARRIED" ] && cp -n "$CARRIED"/SHA256SUMS "$CARRIED"/vllm-gpu.tar.xz.* "$PIECES"/ 2>/dev/null
[ -f "$CARRIED/SHA256SUMS" ] && cp "$CARRIED/SHA256SUMS" "$PIECES/SHA256SUMS"
if [ ! -f "$PIECES/SHA256SUMS" ]; then
  echo "vLLM payload: no SHA256SUMS in $CARRIED or $PIECES (carry .vllm-payload: scripts/vllm_gpu_payload.sh makes it)"
  exit 1
fi
missing=$(cd "$PIECES" && awk '{print $2}' SHA256SUMS | while read -r f; do [ -f "$f" ] || echo "$f"; done)
if [ -n "$missing" ]; then
  echo "vLLM payload: waiting for" $missing; exit 3
fi
(cd "$PIECES" && sha256sum --quiet -c SHA256SUMS) || { echo "vLLM payload: a piece is damaged"; exit 1; }
rm -rf "$SITE" && mkdir -p "$SITE"
start=$SECONDS
(cd "$PIECES" && cat $(awk '{print $2}' SHA256SUMS)) | xz -dc -T0 | tar -C "$SITE" -xf - || exit 1
extras
touch "$SITE/.complete"
echo "vLLM payload: unpacked into $SITE in $((SECONDS - start)) s: $(PYTHONPATH=$SITE python3 -c 'import importlib.metadata as m; print("vllm", m.version("vllm"))' 2>&1 | tail -1)"
