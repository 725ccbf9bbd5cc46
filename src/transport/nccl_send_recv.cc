#include "transport/nccl_send_recv.h"

#include <cstring>

#include "cuda/driver_api.h"
#include "transport/nccl_front.h"

namespace amem::transport {
namespace {

Status Load(const NcclFront** nccl) {
  std::string why;
  *nccl = Front(&why);
  return *nccl == nullptr ? Status::Error("NCCL transport: " + why) : Status::Ok();
}

cudaStream_t AsNcclStream(CUstream stream) { return reinterpret_cast<cudaStream_t>(stream); }

}  // namespace

bool FrontIsInterposer() {
  const NcclFront* nccl = Front(nullptr);
  return nccl != nullptr && nccl->interposed;
}

Status NewUniqueId(std::string* id) {
  const NcclFront* nccl = nullptr;
  if (Status s = Load(&nccl); !s.ok()) return s;
  ncclUniqueId unique{};
  if (Status s = CheckNccl(*nccl, nccl->ncclGetUniqueId(&unique), nullptr, "ncclGetUniqueId"); !s.ok()) {
    return s;
  }
  id->assign(unique.internal, sizeof(unique.internal));
  return Status::Ok();
}

Status InitCommunicator(const std::string& id, int nranks, int rank, int device, ncclComm_t* comm) {
  const NcclFront* nccl = nullptr;
  if (Status s = Load(&nccl); !s.ok()) return s;
  ncclUniqueId unique{};
  if (id.size() != sizeof(unique.internal)) {
    return Status::Error("NCCL unique id has " + std::to_string(id.size()) + " bytes, not " +
                         std::to_string(sizeof(unique.internal)) + ": publish the bytes rank 0 made");
  }
  if (nranks < 2 || rank < 0 || rank >= nranks) {
    return Status::Error("rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                         ": need 0 <= rank < nranks and nranks >= 2");
  }
  std::memcpy(unique.internal, id.data(), id.size());
  // NCCL takes the device from the current context: make the device's primary
  // context (XLA's and PyTorch's) current for the call.
  cuda::ScopedDeviceContext context(device);
  if (!context.status().ok()) return context.status();
  return CheckNccl(*nccl, nccl->ncclCommInitRank(comm, nranks, unique, rank), nullptr,
                   "ncclCommInitRank (rank " + std::to_string(rank) + " of " +
                       std::to_string(nranks) + ")");
}

Status DestroyCommunicator(ncclComm_t comm) {
  const NcclFront* nccl = nullptr;
  if (Status s = Load(&nccl); !s.ok()) return s;
  return CheckNccl(*nccl, nccl->ncclCommDestroy(comm), nullptr, "ncclCommDestroy");
}

Status CommunicatorHealth(ncclComm_t comm) {
  const NcclFront* nccl = nullptr;
  if (Status s = Load(&nccl); !s.ok()) return s;
  ncclResult_t async = ncclSuccess;
  if (Status s = CheckNccl(*nccl, nccl->ncclCommGetAsyncError(comm, &async), comm,
                           "ncclCommGetAsyncError");
      !s.ok()) {
    return s;
  }
  return CheckNccl(*nccl, async, comm, "NCCL communicator reported an asynchronous error");
}

Status SendBytes(const void* data, int64_t bytes, int peer, ncclComm_t comm, CUstream stream) {
  const NcclFront* nccl = nullptr;
  if (Status s = Load(&nccl); !s.ok()) return s;
  return CheckNccl(*nccl,
                   nccl->ncclSend(data, static_cast<size_t>(bytes), kNcclUint8, peer, comm,
                                  AsNcclStream(stream)),
                   comm, "ncclSend of " + std::to_string(bytes) + " bytes to rank " + std::to_string(peer));
}

Status RecvBytes(void* data, int64_t bytes, int peer, ncclComm_t comm, CUstream stream) {
  const NcclFront* nccl = nullptr;
  if (Status s = Load(&nccl); !s.ok()) return s;
  return CheckNccl(*nccl,
                   nccl->ncclRecv(data, static_cast<size_t>(bytes), kNcclUint8, peer, comm,
                                  AsNcclStream(stream)),
                   comm,
                   "ncclRecv of " + std::to_string(bytes) + " bytes from rank " + std::to_string(peer));
}

}  // namespace amem::transport
