// A tensor's layout read through its framework's DLPack C exchange API (DLPack 1.3: a capsule named
// "dlpack_exchange_api" under `__dlpack_c_exchange_api__` on the tensor's type, holding a table of C
// functions; PyTorch has it since 2.10). One C call fills a DLTensor (address, device, dtype,
// shape, strides, byte offset) without Python's call protocol or a new object, where reading the
// same through the tensor's Python methods takes one call each.
//
// The repeat swap's native check (repeat_check.cc) reads it per destination tensor: a callable
// `core.copy.DLPackLayout(tensor_type)` in a reader chain is called through the table directly.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <vector>

namespace amem::bindings {

class DLPackLayout {
 public:
  // The exchange table of `tensor_type` (looked up on the type, as the protocol says); a TypeError
  // where the type has none this code can use (no attribute, not the capsule, another major
  // version, no DLTensor export).
  explicit DLPackLayout(nanobind::handle tensor_type);

  // Reads `tensor`'s layout into `out`: false, with a Python error set, where the tensor is not of
  // the type the table came from or the framework refuses it.
  bool Read(PyObject* tensor, nanobind::dlpack::dltensor* out) const;

  // The layout as words: address, device type and id, ndim, dtype (code | bits << 8 | lanes << 16),
  // byte offset, the shape, then the strides (none: -1 words). What a fact remembers.
  static void Words(const nanobind::dlpack::dltensor& layout, std::vector<int64_t>* words);
  // Whether `layout` is the one `words` remember (no allocation).
  static bool Same(const nanobind::dlpack::dltensor& layout, const std::vector<int64_t>& words);

  nanobind::tuple Call(nanobind::handle tensor) const;  // __call__: the words, as a tuple

 private:
  using FromObject = int (*)(void* object, nanobind::dlpack::dltensor* out);
  nanobind::object type_;
  nanobind::object capsule_;  // keeps the table's owner alive
  FromObject from_object_ = nullptr;
};

void BindDLPackLayout(nanobind::module_& copy_module);  // called by BindRepeatCheck

}  // namespace amem::bindings
