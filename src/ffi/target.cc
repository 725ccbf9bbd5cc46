#include "ffi/target.h"

namespace amem::ffi_adapter {
namespace {

// A function-local static: registrars in other files may run before this file's globals.
std::vector<Target>& Registry() {
  static auto* targets = new std::vector<Target>();
  return *targets;
}

}  // namespace

const std::vector<Target>& Targets() { return Registry(); }

bool AddTarget(const Target& target) {
  Registry().push_back(target);
  return true;
}

}  // namespace amem::ffi_adapter
