// jax_amem_core._core.copy.RepeatCheck: whether a swap repeats the last swap of its program exactly,
// told in one native pass over its inputs (jax_amem/swapping/in_process/repeat.py).
//
// Why here: a repeat swap of thousands of small tensors spent 2.5-4 us per tensor in Python-level
// passes (the tree flattened, each leaf's aval, sharding and deleted state, each tensor's address,
// storage and version read into tuples, then compared), against a copy of a few microseconds.
// One loop in C over the same facts reads each once and compares it on the spot.
//
// What a check compares, all before anything is written:
// - the source tree, walked along the structure remembered (exact dicts with the same keys,
//   lists and tuples of the same length, None), or a flattened list of leaves; every leaf an
//   array of the remembered class, not deleted, with the remembered aval and sharding (equal
//   objects are kept, so the next comparison is by identity); a leaf that is the very array
//   of the last swap (a weak reference says so) keeps its facts and its address;
// - the destination: the same names in the same order, each the same tensor object (the
//   caller's weak references drop the whole entry when one dies, so an identity is never a
//   newer object's), and each tensor's facts read by the remembered readers equal to the last
//   ones: chains of C callables (address, storage offset, storage size, version counter), or a
//   layout read through the tensor type's DLPack C exchange table (dlpack_layout.h: one C call
//   for address, device, dtype, shape and strides, compared word by word, no Python object).
// A miss leaves everything as it was; the caller's full path then checks and names the problem.
// On a hit, the arrays that are not the last swap's are awaited together (one call of the
// batched wait) and their buffer addresses read into the launch's pointer arrays (source_addresses.h,
// the same code as the direct launch of a full swap).
//
// Cost per tensor: each fact is one call of a C function of PyTorch, called directly where it is a
// method without arguments or a getter (OneArgCall: what Python's call protocol reaches after its
// own dispatch), and compared as an int64 when it is an int (no Python comparison; the version
// counters written() computes are plain additions, no new Python objects).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/dlpack_layout.h"
#include "bindings/source_addresses.h"

namespace nb = nanobind;

namespace amem::bindings {
namespace {

using PointerArray = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

enum class Kind { kDict, kList, kTuple, kNone, kLeaf };

// The remembered tree structure, parsed once from its Python description (repeat.py, tree_spec):
// a leaf is an int (its position), a dict (0, keys, children), a list (1, n, children), a tuple
// (2, n, children), None (3,).
struct Node {
  Kind kind = Kind::kLeaf;
  std::vector<nb::object> keys;  // a dict's keys, in the leaves' order
  std::vector<int> children;     // node indices
  Py_ssize_t leaf = -1;
};

struct LeafFacts {
  SourceSlot source;  // the array last seen here (weak reference) and its address
  nb::object aval;
  nb::object sharding;
};

// An exact int that fits in an int64 (PyLong_AsLongLongAndOverflow: no byte-array conversion for the
// multi-digit ints addresses are).
bool AsInt64(PyObject* value, int64_t* out) {
  if (!PyLong_CheckExact(value)) return false;
  int overflow = 0;
  const long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
  if (overflow != 0 || (number == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  *out = number;
  return true;
}

// One fact of a tensor as last read: an int is kept as an int64 and compared as one; a layout
// read through the DLPack exchange table as its words (dlpack_layout.h).
struct Fact {
  nb::object object;  // the fact where it is no int64; none after a failed read (misses)
  int64_t value = 0;
  bool integer = false;
  std::vector<int64_t> words;  // a layout's

  // Takes a new reference (or null: a failed read, whose error is cleared).
  void Set(PyObject* read) {
    integer = false;
    words.clear();
    int64_t number = 0;
    if (read != nullptr && AsInt64(read, &number)) {
      Py_DECREF(read);
      value = number;
      integer = true;
      object = nb::object();
      return;
    }
    PyErr_Clear();
    object = nb::steal(read);
  }

  void Forget() {  // a failed read: misses every comparison
    integer = false;
    words.clear();
    object = nb::object();
  }

};

bool Same(PyObject* a, PyObject* b);

// Whether a fact read now (a new reference, consumed) equals the one remembered.
bool SameFact(PyObject* read, const Fact& known) {
  bool same;
  if (known.integer) {
    int64_t number = 0;
    same = AsInt64(read, &number) && number == known.value;
  } else {
    same = Same(read, known.object.ptr());
  }
  Py_DECREF(read);
  return same;
}

// A callable applied to one object, resolved once: a C method without arguments or the getter of a
// data descriptor of a built-in type is called through its C function directly, for an object of
// that type; anything else through Python's call protocol (a descriptor: its __get__).
class OneArgCall {
 public:
  explicit OneArgCall(nb::handle callable) : callable_(nb::borrow(callable)) {
    PyObject* c = callable.ptr();
    if (Py_IS_TYPE(c, &PyMethodDescr_Type)) {
      auto* descr = reinterpret_cast<PyMethodDescrObject*>(c);
      if ((descr->d_method->ml_flags & ~METH_COEXIST) == METH_NOARGS) {
        type_ = PyDescr_TYPE(descr);
        method_ = descr->d_method->ml_meth;
      }
    } else if (Py_IS_TYPE(c, &PyGetSetDescr_Type)) {
      auto* descr = reinterpret_cast<PyGetSetDescrObject*>(c);
      descriptor_ = true;
      if (descr->d_getset->get != nullptr) {
        type_ = PyDescr_TYPE(descr);
        get_ = descr->d_getset->get;
        closure_ = descr->d_getset->closure;
      }
    } else if (!PyCallable_Check(c)) {
      throw nb::type_error("a reader must be callable or a getter of the tensor's type");
    }
  }

  // A new reference, or null with an error set.
  PyObject* operator()(PyObject* self) const {
    if (type_ != nullptr && PyObject_TypeCheck(self, type_)) {
      return method_ != nullptr ? method_(self, nullptr) : get_(self, closure_);
    }
    if (descriptor_) {  // an object of another type: the descriptor says what is wrong
      return Py_TYPE(callable_.ptr())->tp_descr_get(callable_.ptr(), self, reinterpret_cast<PyObject*>(Py_TYPE(self)));
    }
    return PyObject_CallOneArg(callable_.ptr(), self);
  }

 private:
  nb::object callable_;
  PyTypeObject* type_ = nullptr;
  PyCFunction method_ = nullptr;
  getter get_ = nullptr;
  void* closure_ = nullptr;
  bool descriptor_ = false;
};

// One fact's reader: a chain of callables applied in turn, or a layout read through a DLPack
// exchange table (a chain of one core.copy.DLPackLayout: called in C, no Python object made).
struct Reader {
  std::vector<OneArgCall> chain;
  const DLPackLayout* layout = nullptr;  // owned by the chain's callable
};

struct TensorFacts {
  PyObject* identity = nullptr;  // not owned (module comment)
  nb::object name;
  std::vector<Fact> facts;  // one per reader
};

// Equal by identity first, then by ==; an error in the comparison counts as different.
bool Same(PyObject* a, PyObject* b) {
  if (a == b) return true;
  if (a == nullptr || b == nullptr) return false;
  int equal = PyObject_RichCompareBool(a, b, Py_EQ);
  if (equal < 0) {
    PyErr_Clear();
    return false;
  }
  return equal == 1;
}

class RepeatCheck {
 public:
  RepeatCheck(nb::handle spec, nb::handle array_type, nb::str aval_attribute, nb::str sharding_attribute,
              nb::list leaves, nb::list names, nb::list tensors, nb::list readers, std::vector<int> rewritten,
              nb::object groups, nb::list pointers, nb::object wait)
      : array_type_(nb::borrow(array_type)),
        aval_attribute_(std::move(aval_attribute)),
        sharding_attribute_(std::move(sharding_attribute)),
        wait_(std::move(wait)),
        rewritten_(std::move(rewritten)) {
    if (!spec.is_none()) {
      root_ = Parse(spec);
    }
    leaves_.resize(nb::len(leaves));
    for (size_t i = 0; i < leaves_.size(); ++i) {
      nb::handle leaf = leaves[i];
      if (leaf.type().ptr() != array_type_.ptr()) throw nb::type_error("every leaf must be of array_type");
      leaves_[i].aval = nb::getattr(leaf, aval_attribute_);
      leaves_[i].sharding = nb::getattr(leaf, sharding_attribute_);
    }
    if (root_ >= 0 && spec_leaves_ != static_cast<Py_ssize_t>(leaves_.size())) {
      throw nb::value_error("the tree's structure names another number of leaves than given");
    }
    for (nb::handle reader : readers) {
      Reader chain;
      nb::tuple callables = nb::cast<nb::tuple>(reader);
      for (nb::handle callable : callables) chain.chain.emplace_back(callable);
      if (callables.size() == 1 && nb::isinstance<DLPackLayout>(callables[0])) {
        chain.layout = nb::inst_ptr<DLPackLayout>(callables[0]);
      }
      readers_.push_back(std::move(chain));
    }
    for (int r : rewritten_) {
      if (r < 0 || r >= static_cast<int>(readers_.size())) throw nb::value_error("rewritten: no such reader");
    }
    if (nb::len(names) != nb::len(tensors)) throw nb::value_error("one name per tensor");
    tensors_.resize(nb::len(tensors));
    for (size_t t = 0; t < tensors_.size(); ++t) {
      tensors_[t].identity = tensors[t].ptr();
      tensors_[t].name = names[t];
      tensors_[t].facts.resize(readers_.size());
      for (size_t r = 0; r < readers_.size(); ++r) {
        if (!Learn(readers_[r], tensors_[t].identity, &tensors_[t].facts[r])) throw nb::python_error();
      }
    }
    if (!groups.is_none()) {
      nb::list per_group = nb::cast<nb::list>(groups);
      if (nb::len(per_group) != nb::len(pointers)) throw nb::value_error("one pointer array per group");
      for (size_t g = 0; g < nb::len(per_group); ++g) {
        std::vector<int64_t> positions = nb::cast<std::vector<int64_t>>(per_group[g]);
        PointerArray out = nb::cast<PointerArray>(pointers[g]);
        if (out.shape(0) != positions.size()) throw nb::value_error("a pointer array of another length");
        for (int64_t p : positions) {
          if (p < 0 || p >= static_cast<int64_t>(leaves_.size())) throw nb::value_error("no such leaf");
        }
        groups_.push_back(std::move(positions));
        outputs_.push_back(std::move(out));
      }
      with_pointers_ = true;
      // The swap just made awaited these arrays and copied from them: their addresses are
      // known now, and a repeat with the same arrays reads none again.
      std::vector<std::pair<SourceSlot*, PyObject*>> every;
      for (size_t i = 0; i < leaves_.size(); ++i) every.emplace_back(&leaves_[i].source, leaves[i].ptr());
      try {
        Refresh(every, nb::handle());
      } catch (const nb::python_error&) {
        // read on the first repeat instead
      }
    }
  }

  // The check over a tree (walked along the remembered structure) or a list of its leaves
  // (flattened by the caller, whose structure it compared): None on a miss, else the leaves
  // (a list) when asked for, or True.
  nb::object Check(nb::handle given, bool is_tree, nb::handle tensors, bool want_leaves) {
    if (!SameTensors(tensors)) return nb::none();
    std::vector<PyObject*> leaves;
    leaves.reserve(leaves_.size());
    if (is_tree) {
      if (root_ < 0 || !Walk(root_, given.ptr(), &leaves)) return nb::none();
    } else {
      if (!PyList_CheckExact(given.ptr()) || PyList_GET_SIZE(given.ptr()) != static_cast<Py_ssize_t>(leaves_.size())) {
        return nb::none();
      }
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(given.ptr()); ++i) leaves.push_back(PyList_GET_ITEM(given.ptr(), i));
    }
    if (leaves.size() != leaves_.size()) return nb::none();
    // Pass 1: every fact compared; what changes is kept aside until everything passed.
    std::vector<std::pair<size_t, nb::object>> avals, shardings;
    std::vector<size_t> changed;
    for (size_t i = 0; i < leaves.size(); ++i) {
      PyObject* leaf = leaves[i];
      if (Py_TYPE(leaf) != reinterpret_cast<PyTypeObject*>(array_type_.ptr())) return nb::none();
      LeafFacts& known = leaves_[i];
      const bool same = Holds(known.source, leaf);
      if (!same) {
        if (!Compare(leaf, aval_attribute_, known.aval, i, &avals) ||
            !Compare(leaf, sharding_attribute_, known.sharding, i, &shardings)) {
          return nb::none();
        }
        changed.push_back(i);
      }
      // A new array whose address pass 2 reads is asked there: the wait and the read refuse a
      // deleted one (one call fewer per new array, a training loop's every array).
      if ((same || !with_pointers_) && Deleted(leaf)) return nb::none();  // the full path names it
    }
    // Pass 2 (a hit): the new arrays awaited in one call, then their addresses read.
    if (with_pointers_) {
      std::vector<std::pair<SourceSlot*, PyObject*>> stale;
      for (size_t i : changed) stale.emplace_back(&leaves_[i].source, leaves[i]);
      try {
        Refresh(stale, wait_);  // raises with every slot as it was
      } catch (const nb::python_error&) {
        for (size_t i : changed) {
          if (Deleted(leaves[i])) return nb::none();  // a miss, as above; the error is dropped
        }
        throw;
      }
    }
    for (auto& [i, aval] : avals) leaves_[i].aval = std::move(aval);
    for (auto& [i, sharding] : shardings) leaves_[i].sharding = std::move(sharding);
    if (with_pointers_) {
      for (size_t g = 0; g < groups_.size(); ++g) {
        int64_t* out = outputs_[g].data();
        const std::vector<int64_t>& positions = groups_[g];
        for (size_t s = 0; s < positions.size(); ++s) out[s] = leaves_[positions[s]].source.pointer;
      }
    }
    if (!want_leaves) return nb::bool_(true);
    nb::list out = nb::steal<nb::list>(PyList_New(static_cast<Py_ssize_t>(leaves.size())));
    for (size_t i = 0; i < leaves.size(); ++i) {
      Py_INCREF(leaves[i]);
      PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), leaves[i]);
    }
    return out;
  }

  // After the swap wrote: the facts writing changes (the version counters), read again on the
  // first call; from then on each moves by what it moved then (a tensor listed twice, or views
  // sharing a counter, move it more than once), so they are computed, not read. Only the swap
  // itself runs between its check and this call, and a check compares every fact, so a counter
  // that moved otherwise makes the next check miss. A fact that is no int, or a read that
  // fails, is read (or left empty: the next check misses).
  void Written() {
    const bool learn = steps_.empty();
    if (learn) steps_.assign(tensors_.size() * rewritten_.size(), kRead);
    for (size_t t = 0; t < tensors_.size(); ++t) {
      TensorFacts& tensor = tensors_[t];
      for (size_t k = 0; k < rewritten_.size(); ++k) {
        Fact& fact = tensor.facts[rewritten_[k]];
        int64_t& step = steps_[t * rewritten_.size() + k];
        if (!learn && step != kRead && fact.integer) {
          fact.value += step;
          continue;
        }
        const bool known = fact.integer;
        const int64_t before = fact.value;
        if (!Learn(readers_[rewritten_[k]], tensor.identity, &fact)) PyErr_Clear();  // the next check misses
        if (learn && known && fact.integer) step = fact.value - before;
      }
    }
  }

  bool walks() const { return root_ >= 0; }
  size_t leaves() const { return leaves_.size(); }
  size_t tensors() const { return tensors_.size(); }

 private:
  int Parse(nb::handle spec) {
    const int index = static_cast<int>(nodes_.size());
    nodes_.emplace_back();
    if (PyLong_Check(spec.ptr())) {
      nodes_[index].kind = Kind::kLeaf;
      nodes_[index].leaf = nb::cast<Py_ssize_t>(spec);
      if (nodes_[index].leaf != spec_leaves_) throw nb::value_error("leaves must be numbered in order");
      ++spec_leaves_;
      return index;
    }
    nb::tuple node = nb::cast<nb::tuple>(spec);
    const int kind = nb::cast<int>(node[0]);
    if (kind == 3) {
      nodes_[index].kind = Kind::kNone;
      return index;
    }
    if (kind < 0 || kind > 2 || node.size() != 3) throw nb::value_error("a tree node is (kind, keys or n, children)");
    nodes_[index].kind = kind == 0 ? Kind::kDict : kind == 1 ? Kind::kList : Kind::kTuple;
    if (kind == 0) {
      for (nb::handle key : nb::cast<nb::tuple>(node[1])) nodes_[index].keys.push_back(nb::borrow(key));
    }
    std::vector<int> children;
    for (nb::handle child : nb::cast<nb::tuple>(node[2])) children.push_back(Parse(child));
    if (kind == 0 ? children.size() != nodes_[index].keys.size() : children.size() != nb::cast<size_t>(node[1])) {
      throw nb::value_error("a tree node's children do not match its keys or length");
    }
    nodes_[index].children = std::move(children);
    return index;
  }

  // Appends the leaves of `object` along node `index`; false where its structure differs.
  bool Walk(int index, PyObject* object, std::vector<PyObject*>* leaves) const {
    const Node& node = nodes_[index];
    switch (node.kind) {
      case Kind::kLeaf:
        leaves->push_back(object);
        return true;
      case Kind::kNone:
        return object == Py_None;
      case Kind::kDict: {
        if (!PyDict_CheckExact(object) || PyDict_GET_SIZE(object) != static_cast<Py_ssize_t>(node.keys.size())) {
          return false;
        }
        for (size_t k = 0; k < node.keys.size(); ++k) {
          PyObject* child = PyDict_GetItemWithError(object, node.keys[k].ptr());
          if (child == nullptr) {
            PyErr_Clear();
            return false;
          }
          if (!Walk(node.children[k], child, leaves)) return false;
        }
        return true;
      }
      case Kind::kList:
      case Kind::kTuple: {
        const bool list = node.kind == Kind::kList;
        if (list ? !PyList_CheckExact(object) : !PyTuple_CheckExact(object)) return false;
        const Py_ssize_t size = list ? PyList_GET_SIZE(object) : PyTuple_GET_SIZE(object);
        if (size != static_cast<Py_ssize_t>(node.children.size())) return false;
        for (Py_ssize_t k = 0; k < size; ++k) {
          PyObject* child = list ? PyList_GET_ITEM(object, k) : PyTuple_GET_ITEM(object, k);
          if (!Walk(node.children[k], child, leaves)) return false;
        }
        return true;
      }
    }
    return false;
  }

  bool SameTensors(nb::handle given) const {
    PyObject* tensors = given.ptr();
    if (!PyDict_CheckExact(tensors) || PyDict_GET_SIZE(tensors) != static_cast<Py_ssize_t>(tensors_.size())) {
      return false;
    }
    Py_ssize_t position = 0;
    PyObject* name = nullptr;
    PyObject* tensor = nullptr;
    for (const TensorFacts& known : tensors_) {
      if (!PyDict_Next(tensors, &position, &name, &tensor)) return false;
      if (tensor != known.identity || !Same(name, known.name.ptr())) return false;
      for (size_t r = 0; r < readers_.size(); ++r) {
        if (!Matches(readers_[r], tensor, known.facts[r])) return false;
      }
    }
    return true;
  }

  // A fact read into `fact`; false with an error set where the read failed (`fact` then misses).
  static bool Learn(const Reader& reader, PyObject* tensor, Fact* fact) {
    if (reader.layout != nullptr) {
      nb::dlpack::dltensor layout;
      fact->Forget();
      if (!reader.layout->Read(tensor, &layout)) return false;
      DLPackLayout::Words(layout, &fact->words);
      return true;
    }
    PyObject* read = Read(reader, tensor);
    if (read == nullptr) {
      fact->Forget();
      return false;
    }
    fact->Set(read);
    return true;
  }

  // Whether the fact read now equals the one remembered; a failed read is a miss.
  static bool Matches(const Reader& reader, PyObject* tensor, const Fact& known) {
    if (reader.layout != nullptr) {
      nb::dlpack::dltensor layout;
      if (!reader.layout->Read(tensor, &layout)) {
        PyErr_Clear();
        return false;
      }
      return DLPackLayout::Same(layout, known.words);
    }
    PyObject* read = Read(reader, tensor);
    if (read == nullptr) {
      PyErr_Clear();
      return false;
    }
    return SameFact(read, known);
  }

  // A reader's chain of callables applied in turn: new reference, or null with an error set.
  static PyObject* Read(const Reader& reader, PyObject* tensor) {
    const std::vector<OneArgCall>& chain = reader.chain;
    Py_INCREF(tensor);
    PyObject* value = tensor;
    for (size_t c = 0; c < chain.size() && value != nullptr; ++c) {
      PyObject* next = chain[c](value);
      Py_DECREF(value);
      value = next;
    }
    return value;
  }

  // Whether the array is deleted (donated, or .delete()); an error in asking counts as deleted.
  bool Deleted(PyObject* leaf) const {
    PyObject* deleted = is_deleted_(leaf);
    if (deleted == nullptr) {
      PyErr_Clear();
      return true;
    }
    const int truth = PyObject_IsTrue(deleted);
    Py_DECREF(deleted);
    if (truth < 0) PyErr_Clear();
    return truth != 0;
  }

  // The leaf's attribute equal to the remembered one; an equal but other object is kept aside.
  static bool Compare(PyObject* leaf, const nb::str& attribute, const nb::object& known, size_t i,
                      std::vector<std::pair<size_t, nb::object>>* replacements) {
    PyObject* value = PyObject_GetAttr(leaf, attribute.ptr());
    if (value == nullptr) {
      PyErr_Clear();
      return false;
    }
    nb::object owned = nb::steal(value);
    if (value == known.ptr()) return true;
    if (!Same(value, known.ptr())) return false;
    replacements->emplace_back(i, std::move(owned));
    return true;
  }

  nb::object array_type_;
  nb::str aval_attribute_;
  nb::str sharding_attribute_;
  nb::object wait_;
  OneArgCall is_deleted_{nb::getattr(array_type_, "is_deleted")};
  std::vector<Node> nodes_;
  int root_ = -1;
  Py_ssize_t spec_leaves_ = 0;
  std::vector<LeafFacts> leaves_;
  std::vector<Reader> readers_;
  std::vector<int> rewritten_;
  std::vector<TensorFacts> tensors_;
  static constexpr int64_t kRead = INT64_MIN;  // a rewritten fact read after each swap
  std::vector<int64_t> steps_;                 // per tensor and rewritten fact: its move per swap, or kRead
  bool with_pointers_ = false;
  std::vector<std::vector<int64_t>> groups_;
  std::vector<PointerArray> outputs_;
};

}  // namespace

void BindRepeatCheck(nb::module_& m) {
  BindSourceAddresses(m);
  BindDLPackLayout(m);
  nb::class_<RepeatCheck>(m, "RepeatCheck",
                          "Whether a swap's inputs repeat those of the last swap of a program, in one native pass "
                          "(jax_amem/swapping/in_process/repeat.py).")
      .def(nb::init<nb::handle, nb::handle, nb::str, nb::str, nb::list, nb::list, nb::list, nb::list, std::vector<int>,
                    nb::object, nb::list, nb::object>(),
           nb::arg("spec").none(), nb::arg("array_type"), nb::arg("aval_attribute"), nb::arg("sharding_attribute"),
           nb::arg("leaves"), nb::arg("names"), nb::arg("tensors"), nb::arg("readers"), nb::arg("rewritten"),
           nb::arg("groups").none(), nb::arg("pointers"), nb::arg("wait"),
           "spec: the tree's structure (leaf: its position; dict (0, keys, children); list (1, n, children); tuple "
           "(2, n, children); None (3,)), or None to check flattened leaves only. leaves: the arrays, each of "
           "array_type, whose aval and sharding (the attributes named) are remembered. names, tensors: the "
           "destination in order. readers: per fact, a tuple of callables (or getters of the tensor's type, such as "
           "a getset descriptor) applied in turn to a tensor; rewritten: "
           "the readers read again by written(). groups: per launch group, the leaf position of each operand, with "
           "pointers (an int64 array per group) to fill with their buffer addresses on a hit, the new arrays first "
           "awaited with wait(list); None: no addresses (no wait).")
      .def("check", &RepeatCheck::Check, nb::arg("given"), nb::arg("is_tree"), nb::arg("tensors"),
           nb::arg("want_leaves"),
           "None when the inputs differ (nothing changed), else the leaves (want_leaves) or True, with the pointer "
           "arrays filled.")
      .def("written", &RepeatCheck::Written,
           "After the swap wrote: the rewritten facts read again (the first time), then moved by what they moved "
           "then.")
      .def_prop_ro("walks", &RepeatCheck::walks, "Whether check() takes the tree itself (else its leaves).")
      .def_prop_ro("leaves", &RepeatCheck::leaves)
      .def_prop_ro("tensors", &RepeatCheck::tensors);
}

}  // namespace amem::bindings
