// jax_amem_core._core.copy.SourceAddresses and refresh_sources: the direct launch's source addresses,
// read again only for the arrays that changed (source_addresses.h).
#include "bindings/source_addresses.h"

#include <nanobind/ndarray.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace amem::bindings {
namespace {

using PointerArray = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

PyObject* Referent(PyObject* reference) {
  if (reference == nullptr) return nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* object = nullptr;
  if (PyWeakref_GetRef(reference, &object) < 0) {
    PyErr_Clear();
    return nullptr;
  }
  Py_XDECREF(object);  // only compared by identity; the caller holds the candidate alive
  return object;
#else
  PyObject* object = PyWeakref_GetObject(reference);
  return object == Py_None ? nullptr : object;
#endif
}

// One group's slots and the int64 array the launch reads its addresses from.
class SourceAddresses {
 public:
  explicit SourceAddresses(PointerArray pointers) : pointers_(std::move(pointers)), slots_(pointers_.shape(0)) {}

  size_t size() const { return slots_.size(); }
  std::vector<SourceSlot>& slots() { return slots_; }

  void Publish() {
    int64_t* out = pointers_.data();
    for (size_t s = 0; s < slots_.size(); ++s) out[s] = slots_[s].pointer;
  }

 private:
  PointerArray pointers_;
  std::vector<SourceSlot> slots_;
};

// Every group's operands against its slots; the stale ones of all groups awaited in one call.
void RefreshSources(nb::list tables, nb::list operands, nb::handle wait) {
  if (nb::len(tables) != nb::len(operands)) throw nb::value_error("refresh_sources: one operand list per table");
  std::vector<SourceAddresses*> groups;
  std::vector<std::pair<SourceSlot*, PyObject*>> stale;
  std::vector<nb::object> sequences;  // the operand lists, alive until the reads are done
  for (size_t g = 0; g < nb::len(tables); ++g) {
    SourceAddresses* table = nb::cast<SourceAddresses*>(tables[g]);
    nb::object arrays = nb::borrow(operands[g]);
    PyObject* fast = PySequence_Fast(arrays.ptr(), "refresh_sources: operands must be sequences");
    if (fast == nullptr) throw nb::python_error();
    nb::object owned = nb::steal(fast);
    if (static_cast<size_t>(PySequence_Fast_GET_SIZE(fast)) != table->size()) {
      throw nb::value_error("refresh_sources: a group's operands are not as many as its addresses");
    }
    PyObject** items = PySequence_Fast_ITEMS(fast);
    std::vector<SourceSlot>& slots = table->slots();
    for (size_t s = 0; s < slots.size(); ++s) {
      if (!Holds(slots[s], items[s])) stale.emplace_back(&slots[s], items[s]);
    }
    groups.push_back(table);
    sequences.push_back(std::move(owned));
  }
  Refresh(stale, wait);
  for (SourceAddresses* table : groups) table->Publish();
}

}  // namespace

bool Holds(const SourceSlot& slot, PyObject* array) { return Referent(slot.reference.ptr()) == array; }

void Refresh(const std::vector<std::pair<SourceSlot*, PyObject*>>& stale, nb::handle wait) {
  if (stale.empty()) return;
  nb::list waited;
  for (const auto& [slot, array] : stale) waited.append(nb::handle(array));
  if (wait.is_valid()) wait(waited);
  static PyObject* const method = PyUnicode_InternFromString("unsafe_buffer_pointer");
  std::vector<std::pair<int64_t, nb::object>> read;
  read.reserve(stale.size());
  for (const auto& [slot, array] : stale) {
    PyObject* pointer = PyObject_CallMethodNoArgs(array, method);
    if (pointer == nullptr) throw nb::python_error();
    const int64_t value = PyLong_AsLongLong(pointer);
    Py_DECREF(pointer);
    if (value == -1 && PyErr_Occurred()) throw nb::python_error();
    PyObject* reference = PyWeakref_NewRef(array, nullptr);
    if (reference == nullptr) PyErr_Clear();  // no weak reference: read again next time
    read.emplace_back(value, nb::steal(reference));
  }
  for (size_t k = 0; k < stale.size(); ++k) {
    stale[k].first->pointer = read[k].first;
    stale[k].first->reference = std::move(read[k].second);
  }
}

void BindSourceAddresses(nb::module_& m) {
  nb::class_<SourceAddresses>(m, "SourceAddresses",
                              "One launch group's source addresses, kept between swaps (source_addresses.h).")
      .def(nb::init<PointerArray>(), nb::arg("pointers"),
           "pointers: the int64 array (one per operand) the launch reads; filled by refresh_sources.")
      .def("__len__", &SourceAddresses::size);
  m.def("refresh_sources", &RefreshSources, nb::arg("tables"), nb::arg("operands"), nb::arg("wait"),
        "Per group, its operands (a sequence of arrays, in operand order) against its SourceAddresses: the "
        "arrays that are not the ones last read are awaited in one call of wait(list) and their addresses read "
        "into the tables' pointer arrays; a failure raises with every table as it was.");
}

}  // namespace amem::bindings
