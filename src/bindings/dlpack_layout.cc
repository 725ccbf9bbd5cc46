// jax_amem_core._core.copy.DLPackLayout: a tensor's layout through the DLPack C exchange API
// (dlpack_layout.h).
#include "bindings/dlpack_layout.h"

#include <cstring>
#include <string>

namespace nb = nanobind;

namespace amem::bindings {
namespace {

// DLPack 1.x's DLPackExchangeAPI, in its field order (the fields this code does not call are
// untyped): a header (version, an older table or null), then five function pointers.
struct ExchangeHeader {
  uint32_t major;
  uint32_t minor;
  ExchangeHeader* older;
};
struct ExchangeTable {
  ExchangeHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* object, nb::dlpack::dltensor* out);
  void* current_work_stream;
};
constexpr uint32_t kMajor = 1;  // the layout above
constexpr const char* kCapsuleName = "dlpack_exchange_api";
constexpr const char* kAttribute = "__dlpack_c_exchange_api__";
constexpr const char* kEarlierAttribute = "__c_dlpack_exchange_api__";  // its name before DLPack 1.3

// The table behind `value`: a capsule of that name, or null. (An address given as a plain int, as
// some early producers gave it under the earlier name, is not taken: nothing tells it from any int.)
const ExchangeTable* TableOf(nb::handle value) {
  if (!PyCapsule_CheckExact(value.ptr())) return nullptr;
  void* pointer = PyCapsule_GetPointer(value.ptr(), kCapsuleName);
  if (pointer == nullptr) PyErr_Clear();
  return static_cast<const ExchangeTable*>(pointer);
}

}  // namespace

DLPackLayout::DLPackLayout(nb::handle tensor_type) {
  if (!PyType_Check(tensor_type.ptr())) throw nb::type_error("DLPackLayout: give the tensors' type");
  type_ = nb::borrow(tensor_type);
  const ExchangeTable* table = nullptr;
  for (const char* name : {kAttribute, kEarlierAttribute}) {
    if (!nb::hasattr(tensor_type, name)) continue;
    nb::object value = nb::getattr(tensor_type, name);
    table = TableOf(value);
    if (table != nullptr) {
      capsule_ = std::move(value);
      break;
    }
  }
  // A newer major version may chain the table this code knows.
  const ExchangeHeader* header = table == nullptr ? nullptr : &table->header;
  while (header != nullptr && header->major != kMajor) header = header->older;
  table = reinterpret_cast<const ExchangeTable*>(header);
  if (table == nullptr || table->dltensor_from_py_object_no_sync == nullptr) {
    throw nb::type_error((std::string("DLPackLayout: ") + nb::str(tensor_type).c_str() +
                          " has no DLPack 1.x C exchange table with a DLTensor export").c_str());
  }
  from_object_ = table->dltensor_from_py_object_no_sync;
}

bool DLPackLayout::Read(PyObject* tensor, nb::dlpack::dltensor* out) const {
  // The table serves objects of the type it was found on (its subclasses included) only.
  if (!PyObject_TypeCheck(tensor, reinterpret_cast<PyTypeObject*>(type_.ptr()))) {
    PyErr_Format(PyExc_TypeError, "DLPackLayout: a %s is not a %s", Py_TYPE(tensor)->tp_name,
                 reinterpret_cast<PyTypeObject*>(type_.ptr())->tp_name);
    return false;
  }
  if (from_object_(tensor, out) != 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_BufferError, "DLPackLayout: the framework refused the tensor");
    return false;
  }
  return true;
}

void DLPackLayout::Words(const nb::dlpack::dltensor& layout, std::vector<int64_t>* words) {
  words->assign({static_cast<int64_t>(reinterpret_cast<uintptr_t>(layout.data)), layout.device.device_type,
                 layout.device.device_id, layout.ndim,
                 static_cast<int64_t>(layout.dtype.code) | static_cast<int64_t>(layout.dtype.bits) << 8 |
                     static_cast<int64_t>(layout.dtype.lanes) << 16,
                 static_cast<int64_t>(layout.byte_offset)});
  for (int32_t d = 0; d < layout.ndim; ++d) words->push_back(layout.shape[d]);
  for (int32_t d = 0; d < layout.ndim; ++d) words->push_back(layout.strides != nullptr ? layout.strides[d] : -1);
}

bool DLPackLayout::Same(const nb::dlpack::dltensor& layout, const std::vector<int64_t>& words) {
  constexpr size_t kHead = 6;
  if (layout.ndim < 0 || words.size() != kHead + 2 * static_cast<size_t>(layout.ndim)) return false;
  if (words[0] != static_cast<int64_t>(reinterpret_cast<uintptr_t>(layout.data)) ||
      words[1] != layout.device.device_type || words[2] != layout.device.device_id || words[3] != layout.ndim ||
      words[4] != (static_cast<int64_t>(layout.dtype.code) | static_cast<int64_t>(layout.dtype.bits) << 8 |
                   static_cast<int64_t>(layout.dtype.lanes) << 16) ||
      words[5] != static_cast<int64_t>(layout.byte_offset)) {
    return false;
  }
  const int64_t* shape = words.data() + kHead;
  const int64_t* strides = shape + layout.ndim;
  const size_t bytes = sizeof(int64_t) * static_cast<size_t>(layout.ndim);
  if (layout.ndim > 0 && std::memcmp(shape, layout.shape, bytes) != 0) return false;
  for (int32_t d = 0; d < layout.ndim; ++d) {
    if (strides[d] != (layout.strides != nullptr ? layout.strides[d] : -1)) return false;
  }
  return true;
}

nb::tuple DLPackLayout::Call(nb::handle tensor) const {
  nb::dlpack::dltensor layout;
  if (!Read(tensor.ptr(), &layout)) throw nb::python_error();
  std::vector<int64_t> words;
  Words(layout, &words);
  nb::list out;
  for (int64_t word : words) out.append(word);
  return nb::tuple(out);
}

void BindDLPackLayout(nb::module_& m) {
  nb::class_<DLPackLayout>(m, "DLPackLayout",
                           "A tensor's layout read through its type's DLPack C exchange table (dlpack_layout.h).")
      .def(nb::init<nb::handle>(), nb::arg("tensor_type"),
           "The exchange table of tensor_type (TypeError where it has none this code can use).")
      .def("__call__", &DLPackLayout::Call, nb::arg("tensor").none(),
           "The tensor's layout: (address, device type, device id, ndim, dtype code | bits << 8 | lanes << 16, "
           "byte offset, *shape, *strides).");
}

}  // namespace amem::bindings
