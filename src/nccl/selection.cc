#include "nccl/selection.h"

#include <set>
#include <string>

namespace amem::nccl {

Status Select(const std::vector<uint64_t>& ids, CommState wanted, std::vector<ProxyComm*>* out) {
  std::vector<ProxyComm*> all = Registry::Get().Sorted();
  if (ids.empty()) {
    for (ProxyComm* comm : all) {
      if (comm->state == wanted) out->push_back(comm);
    }
    return Status::Ok();
  }
  std::set<uint64_t> seen;
  for (uint64_t id : ids) {
    if (!seen.insert(id).second) {
      return Status::Error("communicator id " + std::to_string(id) +
                           " is given twice: name each communicator once");
    }
  }
  for (ProxyComm* comm : all) {  // key order, whatever the order of `ids`
    if (!seen.count(comm->id)) continue;
    if (comm->state != wanted) {
      return Status::Error("communicator " + std::to_string(comm->id) + " (" + comm->key + ") is " +
                           StateName(comm->state) + ", not " + StateName(wanted));
    }
    out->push_back(comm);
  }
  if (out->size() != ids.size()) {
    for (uint64_t id : ids) {
      bool found = false;
      for (ProxyComm* comm : *out) found |= comm->id == id;
      if (!found) return Status::Error("no communicator with id " + std::to_string(id) + " is tracked");
    }
  }
  return Status::Ok();
}

}  // namespace amem::nccl
