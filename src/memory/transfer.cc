#include "memory/transfer.h"

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "cuda/driver_api.h"

namespace amem::memory {
namespace {

// One non-blocking stream per device, created on first use and kept: creating
// streams on every pause would cost more than small pauses take.
Status StreamFor(int ordinal, CUstream* stream) {
  static std::mutex mutex;
  static std::map<int, CUstream>* streams = new std::map<int, CUstream>();
  std::lock_guard<std::mutex> lock(mutex);
  auto found = streams->find(ordinal);
  if (found != streams->end()) {
    *stream = found->second;
    return Status::Ok();
  }
  CUstream created = nullptr;
  Status status = cuda::Check(cuda::Driver()->cuStreamCreate(&created, cuda::kStreamNonBlocking),
                              "cuStreamCreate for the offload stream");
  if (!status.ok()) return status;
  (*streams)[ordinal] = created;
  *stream = created;
  return Status::Ok();
}

Status Enqueue(const cuda::DriverApi& api, const Transfer& t, Direction direction, CUstream stream) {
  if (direction == Direction::kToHost) {
    return cuda::Check(api.cuMemcpyDtoHAsync(reinterpret_cast<void*>(t.host_address),
                                             static_cast<CUdeviceptr>(t.device_address), t.bytes,
                                             stream),
                       "cuMemcpyDtoHAsync (offload)");
  }
  return cuda::Check(api.cuMemcpyHtoDAsync(static_cast<CUdeviceptr>(t.device_address),
                                           reinterpret_cast<const void*>(t.host_address), t.bytes,
                                           stream),
                     "cuMemcpyHtoDAsync (reload)");
}

// All copies of one device, enqueued on its stream (its context current).
Status EnqueueDevice(int ordinal, const std::vector<const Transfer*>& copies, Direction direction,
                     CUstream* stream) {
  std::string why;
  const cuda::DriverApi* api = cuda::Driver(&why);
  if (api == nullptr) return Status::Error(why);
  cuda::ScopedDeviceContext context(ordinal);
  if (!context.status().ok()) return context.status();
  Status status = StreamFor(ordinal, stream);
  // One copy per row. Rows are not merged even when both sides are contiguous: a copy may not
  // span two allocations (two pool blocks, or two buffers of XLA's pool), and the H200 refused
  // such merged copies with "invalid argument".
  for (const Transfer* t : copies) {
    if (!status.ok()) break;
    status = Enqueue(*api, *t, direction, *stream);
  }
  return status;
}

Status SynchronizeDevice(int ordinal, CUstream stream) {
  cuda::ScopedDeviceContext context(ordinal);
  if (!context.status().ok()) return context.status();
  return cuda::Check(cuda::Driver()->cuStreamSynchronize(stream), "cuStreamSynchronize (offload)");
}

}  // namespace

Status StartBatch(const std::vector<Transfer>& transfers, Direction direction,
                  std::vector<int>* started) {
  started->clear();
  std::map<int, std::vector<const Transfer*>> by_device;
  for (const Transfer& t : transfers) {
    if (t.bytes == 0) continue;
    if (t.device_ordinal == kHostDevice) {
      void* dst = reinterpret_cast<void*>(direction == Direction::kToHost ? t.host_address
                                                                          : t.device_address);
      const void* src = reinterpret_cast<const void*>(
          direction == Direction::kToHost ? t.device_address : t.host_address);
      std::memcpy(dst, src, t.bytes);
    } else {
      by_device[t.device_ordinal].push_back(&t);
    }
  }
  // Enqueue every device before waiting on any, so the devices copy concurrently.
  Status first_error;
  for (const auto& [ordinal, copies] : by_device) {
    CUstream stream = nullptr;
    Status status = EnqueueDevice(ordinal, copies, direction, &stream);
    if (stream != nullptr) started->push_back(ordinal);
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  return first_error;
}

Status WaitBatch(const std::vector<int>& ordinals) {
  Status first_error;
  for (int ordinal : ordinals) {
    CUstream stream = nullptr;
    Status status = StreamFor(ordinal, &stream);
    if (status.ok()) status = SynchronizeDevice(ordinal, stream);
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  return first_error;
}

Status CopyBatch(const std::vector<Transfer>& transfers, Direction direction) {
  std::vector<int> started;
  Status status = StartBatch(transfers, direction, &started);
  // Wait for all, even after an error: no copy may still run when we return.
  Status waited = WaitBatch(started);
  return status.ok() ? waited : status;
}

}  // namespace amem::memory
