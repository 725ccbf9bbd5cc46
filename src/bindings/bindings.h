// Each concern exposes its Python-facing part through one Bind* function;
// module.cc calls them all. Keeps module.cc a table of contents.
#pragma once

#include <nanobind/nanobind.h>

namespace amem::bindings {

void BindCuda(nanobind::module_& m);
void BindCopy(nanobind::module_& m);
void BindDirectCopy(nanobind::module_& copy_module);  // called by BindCopy
void BindRepeatCheck(nanobind::module_& copy_module);  // called by BindDirectCopy
void BindFfi(nanobind::module_& m);
void BindReshard(nanobind::module_& m);
void BindMemory(nanobind::module_& m);
void BindTransport(nanobind::module_& m);
void BindIpc(nanobind::module_& m);

}  // namespace amem::bindings
