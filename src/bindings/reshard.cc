#include "bindings/bindings.h"

namespace nb = nanobind;

namespace amem::bindings {

void BindReshard(nb::module_& root) {
  root.def_submodule("reshard", "Resharding planner (native part)");
}

}  // namespace amem::bindings
