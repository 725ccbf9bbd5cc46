// jax_amem_core._core: the native core. Each submodule mirrors a folder of src/.
#include <nanobind/nanobind.h>

#include "bindings/bindings.h"

NB_MODULE(_core, m) {
  m.doc() = "jax-amem native core (nanobind)";
  amem::bindings::BindCuda(m);
  amem::bindings::BindCopy(m);
  amem::bindings::BindFfi(m);
  amem::bindings::BindReshard(m);
  amem::bindings::BindMemory(m);
  amem::bindings::BindTransport(m);
  amem::bindings::BindIpc(m);
}
