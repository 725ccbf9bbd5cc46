#include "transport/nccl_front.h"

#include <dlfcn.h>

#include <mutex>

namespace amem::transport {
namespace {

// Functions the transport cannot work without.
bool Complete(const NcclFront& f) {
  return f.ncclGetUniqueId && f.ncclCommInitRank && f.ncclCommDestroy && f.ncclSend &&
         f.ncclRecv && f.ncclGetErrorString && f.ncclCommGetAsyncError;
}

}  // namespace

const NcclFront* Front(std::string* why) {
  static std::mutex mutex;
  static NcclFront* loaded = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded != nullptr) return loaded;
  // RTLD_NOLOAD: use the NCCL the process already has (never load a second one).
  void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) {
    if (why) {
      *why = "no libnccl.so.2 is loaded in this process: import jax_amem first (it puts its NCCL "
             "interposer in front of the real library), or import torch with CUDA";
    }
    return nullptr;
  }
  NcclFront front;
#define AMEM_NCCL_FN(ret, name, params) \
  front.name = reinterpret_cast<ret(*) params>(dlsym(handle, #name));
#include "nccl/real_nccl_functions.inc"
#undef AMEM_NCCL_FN
  front.interposed = dlsym(handle, "amem_nccl_abi_version") != nullptr;
  if (!Complete(front)) {
    if (why) *why = "the loaded libnccl.so.2 lacks ncclSend/ncclRecv/ncclCommInitRank";
    dlclose(handle);
    return nullptr;
  }
  loaded = new NcclFront(front);  // the handle stays open for the process's lifetime
  return loaded;
}

Status CheckNccl(const NcclFront& nccl, ncclResult_t result, ncclComm_t comm, const std::string& what) {
  if (result == ncclSuccess) return Status::Ok();
  std::string message = what + ": " + nccl.ncclGetErrorString(result);
  const char* last = nccl.ncclGetLastError != nullptr ? nccl.ncclGetLastError(comm) : nullptr;
  if (last != nullptr && *last != '\0') message += " (" + std::string(last) + ")";
  return Status::Error(message);
}

}  // namespace amem::transport
