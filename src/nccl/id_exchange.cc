#include "nccl/id_exchange.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "cuda/driver_api.h"
#include "nccl/nccl_status.h"

namespace amem::nccl {
namespace {

constexpr CUresult kNotReady = 600;  // CUDA_ERROR_NOT_READY
constexpr size_t kBarrierBytes = 8;

struct Slot {
  ProxyComm* comm;
  CUdeviceptr device_buffer = 0;
  CUstream stream = nullptr;
};

// Waits for nonblocking communicators to leave ncclInProgress.
Status WaitReady(ProxyComm* comm, std::chrono::steady_clock::time_point deadline) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    Status status = NcclCheck(Real().ncclCommGetAsyncError(comm->real, &state), "ncclCommGetAsyncError");
    if (!status.ok()) return status;
    if (state == ncclSuccess) return Status::Ok();
    if (state != ncclInProgress) return NcclCheck(state, "communicator " + comm->key);
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::Error("communicator " + comm->key + " stayed in progress past the timeout");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

Status HostBroadcast(const std::vector<ProxyComm*>& comms) {
  Real().ncclGroupStart();
  for (ProxyComm* comm : comms) {
    Real().ncclBroadcast(comm->next_id.internal, comm->next_id.internal, NCCL_UNIQUE_ID_BYTES,
                         kNcclUint8, 0, comm->real, nullptr);
  }
  return NcclCheck(Real().ncclGroupEnd(), "ncclGroupEnd (unique id broadcast)");
}

}  // namespace

bool HostExchange() {
  const char* value = std::getenv("JAX_AMEM_NCCL_HOST_EXCHANGE");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

Status ExchangeNextIds(const std::vector<ProxyComm*>& comms, double timeout_seconds,
                       std::vector<ProxyComm*>* stuck) {
  std::vector<ProxyComm*> shared;  // communicators with peers to tell
  for (ProxyComm* comm : comms) {
    // Rank 0 sends the id it made for its plan where it made one (a plan that did not reach every
    // rank): a second id would leave the first one's bootstrap root waiting for ranks that never come.
    if (comm->rank == 0 && !comm->next_id_made && Real().ncclGetUniqueId != nullptr) {
      Status made = NcclCheck(Real().ncclGetUniqueId(&comm->next_id), "ncclGetUniqueId");
      if (!made.ok()) return made;
    }
    if (comm->nranks > 1) shared.push_back(comm);
  }
  if (shared.empty()) return Status::Ok();
  if (HostExchange()) return HostBroadcast(shared);

  std::string why;
  const cuda::DriverApi* api = cuda::Driver(&why);
  if (api == nullptr) return Status::Error(why);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_seconds));
  std::vector<Slot> slots;
  std::map<int, CUstream> streams;  // one per device
  Status status;
  for (ProxyComm* comm : shared) {
    cuda::ScopedDeviceContext context(comm->device);
    if (!(status = context.status()).ok()) break;
    Slot slot{comm};
    if (!(status = cuda::Check(api->cuMemAlloc(&slot.device_buffer, NCCL_UNIQUE_ID_BYTES + kBarrierBytes), "cuMemAlloc")).ok()) break;
    if (comm->rank == 0) {
      status = cuda::Check(api->cuMemcpyHtoD(slot.device_buffer, comm->next_id.internal, NCCL_UNIQUE_ID_BYTES), "cuMemcpyHtoD");
    }
    if (!streams.count(comm->device)) {
      CUstream stream = nullptr;
      Status made = cuda::Check(api->cuStreamCreate(&stream, cuda::kStreamNonBlocking), "cuStreamCreate");
      if (made.ok()) streams[comm->device] = stream;
      if (status.ok()) status = made;
    }
    slot.stream = streams[comm->device];
    slots.push_back(slot);
    if (!status.ok()) break;
  }
  if (status.ok()) {
    Real().ncclGroupStart();
    for (const Slot& slot : slots) {
      cuda::ScopedDeviceContext context(slot.comm->device);
      char* buffer = reinterpret_cast<char*>(slot.device_buffer);
      Real().ncclBroadcast(buffer, buffer, NCCL_UNIQUE_ID_BYTES, kNcclUint8, 0, slot.comm->real,
                           slot.stream);
      // A root's broadcast can finish once its data is handed to NCCL's network
      // proxy; tearing the communicator down right after (ncclCommAbort above
      // all) could then drop it before the peers have it. An all-reduce after
      // the broadcast on the same stream finishes on every rank only once every
      // rank has received: it makes the exchange a barrier.
      Real().ncclAllReduce(buffer + NCCL_UNIQUE_ID_BYTES, buffer + NCCL_UNIQUE_ID_BYTES,
                           kBarrierBytes, kNcclUint8, 0, slot.comm->real, slot.stream);
    }
    status = NcclCheck(Real().ncclGroupEnd(), "ncclGroupEnd (unique id broadcast)");
    for (const Slot& slot : slots) {
      if (status.ok()) status = WaitReady(slot.comm, deadline);
    }
  }
  // Wait for every broadcast, bounded: a rank that never joins leaves its
  // peers' kernels waiting; those communicators are reported as stuck.
  for (const Slot& slot : slots) {
    if (!status.ok()) break;
    cuda::ScopedDeviceContext context(slot.comm->device);
    CUresult query = kNotReady;
    while ((query = api->cuStreamQuery(slot.stream)) == kNotReady &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (query == kNotReady) {
      stuck->push_back(slot.comm);
    } else if (query != cuda::kSuccess) {
      status = cuda::Check(query, "unique id broadcast");
    }
  }
  if (status.ok() && !stuck->empty()) {
    std::string keys;
    for (ProxyComm* comm : *stuck) keys += (keys.empty() ? "" : ", ") + comm->key;
    status = Status::Error("timed out after " + std::to_string(timeout_seconds) +
                           " s waiting for every rank to join the pause of communicator(s) " +
                           keys + ": a rank did not call pause (pause is collective: every "
                           "process must pause the same communicators)");
  }
  for (const Slot& slot : slots) {
    cuda::ScopedDeviceContext context(slot.comm->device);
    if (status.ok() && slot.comm->rank != 0) {
      status = cuda::Check(api->cuMemcpyDtoH(slot.comm->next_id.internal, slot.device_buffer, NCCL_UNIQUE_ID_BYTES), "cuMemcpyDtoH");
    }
    if (stuck->empty()) api->cuMemFree(slot.device_buffer);  // a stuck kernel may still write it
  }
  for (const auto& entry : streams) {
    cuda::ScopedDeviceContext context(entry.first);
    if (stuck->empty()) api->cuStreamDestroy(entry.second);
  }
  return status;
}

}  // namespace amem::nccl
