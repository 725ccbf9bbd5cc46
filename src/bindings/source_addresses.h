// The source arrays' buffer addresses of a swap launched directly (src/copy/direct_launch.h), kept
// between swaps: one slot per operand with the address last read and a weak reference to the array
// it was read from. A slot whose array is the same live array keeps its address (a jax.Array's
// buffer never moves; the callers refuse deleted arrays first); only the others are awaited, all in
// one call, and read again. One implementation for both users: the direct launch of a full swap
// (core.copy.refresh_sources, jax_amem/swapping/in_process/direct.py) and the repeat swap's native
// check (repeat_check.cc).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace amem::bindings {

struct SourceSlot {
  nanobind::object reference;  // weak reference to the array `pointer` was read from, or none
  int64_t pointer = 0;
};

// Whether `array` (held alive by the caller) is the array `slot` was read from.
bool Holds(const SourceSlot& slot, PyObject* array);

// The stale slots' new arrays awaited together (one call of `wait` with a list of them), then their
// buffer addresses read (`unsafe_buffer_pointer()`); an invalid `wait` handle: arrays already awaited. The slots change only after every read
// succeeded; a failure raises (nanobind::python_error) with every slot as it was.
void Refresh(const std::vector<std::pair<SourceSlot*, PyObject*>>& stale, nanobind::handle wait);

void BindSourceAddresses(nanobind::module_& copy_module);  // called by BindRepeatCheck

}  // namespace amem::bindings
