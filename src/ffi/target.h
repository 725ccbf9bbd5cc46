// Self-registration of the XLA FFI targets. Each src/ffi/<target>.cc ends with
//   AMEM_FFI_TARGET(segment_copy, kSegmentCopyCpu, kSegmentCopyCuda);
// which adds "jax_amem_segment_copy" to the registry; the module lists the registry
// (jax_amem._core.ffi.targets()) and jax_amem/_ffi.py registers what it is given with JAX.
// So a target's name is written once, in its own file.
//
// The library holding the target files is a CMake OBJECT library: a static archive would let
// the linker drop object files nothing refers to, and with them their registrars.
#pragma once

#include <vector>

#include "xla/ffi/api/c_api.h"

namespace amem::ffi_adapter {

struct Target {
  const char* name;       // the custom call's name, "jax_amem_<name>"
  XLA_FFI_Handler* cpu;   // nullptr: no handler for XLA:CPU (NCCL has no CPU path)
  XLA_FFI_Handler* cuda;  // nullptr: no handler for CUDA
};

// Every target registered so far, in registration order. Complete once static
// initialisation of the module is done, i.e. whenever Python can ask.
const std::vector<Target>& Targets();

// Adds a target; returns true so that a namespace-scope constant can call it.
bool AddTarget(const Target& target);

}  // namespace amem::ffi_adapter

#define AMEM_FFI_TARGET(name, cpu_handler, cuda_handler)                         \
  [[maybe_unused]] static const bool amem_ffi_target_##name =                    \
      ::amem::ffi_adapter::AddTarget({"jax_amem_" #name, cpu_handler, cuda_handler})
