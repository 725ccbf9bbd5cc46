# Sourced by the payload scripts (scripts/vllm_gpu_payload.sh, scripts/nccl_payload.sh):
#   download DIR SPEC...   wheels for the GPU machines' Python (CPython 3.12, x86-64 Linux, every
#                          manylinux tag it takes) into DIR, without their dependencies.
WHEEL_PLATFORMS="manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
manylinux_2_18_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64"
download() {
  local dir=$1 platform platforms=(); shift
  for platform in $WHEEL_PLATFORMS; do platforms+=(--platform "$platform"); done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$dir" "$@"
}
