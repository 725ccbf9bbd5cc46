// The XLA FFI targets, in one table (src/ffi/targets.cc). Each src/ffi/<target>.cc defines its
// handlers and ends with
//   AMEM_FFI_HANDLERS(segment_copy_many, kSegmentCopyManyCpu, kSegmentCopyManyCuda);
// which defines `Handlers segment_copy_many_handlers()`; targets.cc lists every target by name
// with its handlers, the module hands the table to Python (jax_amem_core._core.ffi.targets()), and
// jax_amem/_ffi.py names each target literally and registers the table with JAX, checking that
// the two lists agree.
#pragma once

#include <vector>

#include "xla/ffi/api/c_api.h"

namespace amem::ffi_adapter {

struct Handlers {
  XLA_FFI_Handler* cpu;   // nullptr: no handler for XLA:CPU (NCCL has no CPU path)
  XLA_FFI_Handler* cuda;  // nullptr: no handler for CUDA
};

struct Target {
  const char* name;       // the custom call's name, "jax_amem_<name>"
  Handlers handlers;
};

// Every target of this build, in the order of the table.
const std::vector<Target>& Targets();

// One per target file (AMEM_FFI_HANDLERS).
Handlers segment_copy_many_handlers();
Handlers segment_copy_to_addresses_handlers();
Handlers nccl_send_bucket_handlers();
Handlers nccl_recv_bucket_handlers();
Handlers affine_copy_many_handlers();
Handlers affine_copy_to_addresses_handlers();

}  // namespace amem::ffi_adapter

#define AMEM_FFI_HANDLERS(name, cpu_handler, cuda_handler) \
  Handlers name##_handlers() { return {cpu_handler, cuda_handler}; }
