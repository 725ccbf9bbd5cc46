// jax_amem_core._core.ffi: the XLA FFI targets of this build (the table in src/ffi/targets.cc).
#include "bindings/bindings.h"
#include "ffi/target.h"

namespace nb = nanobind;

namespace amem::bindings {

void BindFfi(nb::module_& root) {
  nb::module_ m = root.def_submodule("ffi", "XLA FFI handlers as capsules");
  m.def(
      "targets",
      [] {
        nb::dict targets;
        for (const ffi_adapter::Target& target : ffi_adapter::Targets()) {
          nb::dict by_platform;
          const ffi_adapter::Handlers& handlers = target.handlers;
          if (handlers.cpu != nullptr) by_platform["cpu"] = nb::capsule(reinterpret_cast<void*>(handlers.cpu));
          if (handlers.cuda != nullptr) by_platform["CUDA"] = nb::capsule(reinterpret_cast<void*>(handlers.cuda));
          targets[target.name] = by_platform;
        }
        return targets;
      },
      "The FFI targets this build provides: {name: {platform: handler capsule}}; "
      "jax_amem._ffi registers them with JAX.");
}

}  // namespace amem::bindings
