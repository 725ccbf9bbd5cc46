#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "copy/affine_cuda.h"
#include "transport/bucket_pipe.h"
#include "transport/nccl_send_recv.h"

namespace amem::transport {
namespace {

struct Pipe {
  int device = 0;
  int64_t capacity = 0;
  char* slots[kSlots] = {};
  cudaStream_t stream = nullptr;         // where NCCL runs
  cudaEvent_t filled[kSlots] = {};       // slot holds a whole bucket (gathered / received)
  cudaEvent_t released[kSlots] = {};     // slot may be written again (sent / unpacked)
};

std::mutex registry_mutex;
std::unordered_map<int64_t, std::unique_ptr<Pipe>>& Pipes() {
  static auto* pipes = new std::unordered_map<int64_t, std::unique_ptr<Pipe>>();
  return *pipes;
}
int64_t next_id = 1;

Status Cuda(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::Error("NCCL transport: " + what + ": " + cudaGetErrorString(error));
}

Pipe* Find(int64_t id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = Pipes().find(id);
  return it == Pipes().end() ? nullptr : it->second.get();
}

Status Unknown(int64_t id) {
  return Status::Error("NCCL transport: no staging pipe " + std::to_string(id) +
                       " (closed, or made in another process)");
}

Status CheckSlot(const Pipe& pipe, int slot, int64_t bytes) {
  if (slot < 0 || slot >= kSlots) {
    return Status::Error("NCCL transport: slot " + std::to_string(slot) + " is not 0 or 1");
  }
  if (bytes <= 0 || bytes > pipe.capacity) {
    return Status::Error("NCCL transport: a bucket of " + std::to_string(bytes) +
                         " bytes does not fit the pipe's " + std::to_string(pipe.capacity) +
                         "-byte slots");
  }
  return Status::Ok();
}

void Release(Pipe* pipe) {
  for (int s = 0; s < kSlots; ++s) {
    if (pipe->filled[s]) cudaEventDestroy(pipe->filled[s]);
    if (pipe->released[s]) cudaEventDestroy(pipe->released[s]);
    if (pipe->slots[s]) cudaFree(pipe->slots[s]);
  }
  if (pipe->stream) cudaStreamDestroy(pipe->stream);
}

}  // namespace

Status CreatePipe(int device, int64_t bucket_bytes, int64_t* id) {
  if (bucket_bytes <= 0) return Status::Error("NCCL transport: bucket_bytes must be positive");
  auto pipe = std::make_unique<Pipe>();
  pipe->device = device;
  pipe->capacity = bucket_bytes;
  Status status = Cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  // Non-blocking: the pipe's stream never waits on the legacy default stream implicitly.
  if (status.ok()) status = Cuda(cudaStreamCreateWithFlags(&pipe->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int s = 0; status.ok() && s < kSlots; ++s) {
    status = Cuda(cudaMalloc(&pipe->slots[s], static_cast<size_t>(bucket_bytes)),
                  "allocating a " + std::to_string(bucket_bytes) + "-byte staging bucket");
    if (status.ok()) status = Cuda(cudaEventCreateWithFlags(&pipe->filled[s], cudaEventDisableTiming), "cudaEventCreate");
    if (status.ok()) status = Cuda(cudaEventCreateWithFlags(&pipe->released[s], cudaEventDisableTiming), "cudaEventCreate");
  }
  if (!status.ok()) {
    Release(pipe.get());
    return status;
  }
  std::lock_guard<std::mutex> lock(registry_mutex);
  *id = next_id++;
  Pipes()[*id] = std::move(pipe);
  return Status::Ok();
}

Status DestroyPipe(int64_t id) {
  std::unique_ptr<Pipe> pipe;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto it = Pipes().find(id);
    if (it == Pipes().end()) return Unknown(id);
    pipe = std::move(it->second);
    Pipes().erase(it);
  }
  Status status = Cuda(cudaSetDevice(pipe->device), "cudaSetDevice");
  // Work still queued on the pipe's stream reads the slots: finish it first.
  if (status.ok()) status = Cuda(cudaStreamSynchronize(pipe->stream), "waiting for the pipe's stream");
  Release(pipe.get());
  return status;
}

int64_t PipeStagingBytes(int64_t id) {
  Pipe* pipe = Find(id);
  return pipe == nullptr ? -1 : pipe->capacity * kSlots;
}

int PipeDevice(int64_t id) {
  Pipe* pipe = Find(id);
  return pipe == nullptr ? -1 : pipe->device;
}

namespace {

// The pipe `id` with `slot` and `bytes` checked against it, or null with `status` set.
Pipe* Checked(int64_t id, int slot, int64_t bytes, Status* status) {
  Pipe* pipe = Find(id);
  *status = pipe == nullptr ? Unknown(id) : CheckSlot(*pipe, slot, bytes);
  return status->ok() ? pipe : nullptr;
}

// `to` continues only after what is queued on `from` so far (one event, no host wait).
Status Handoff(cudaEvent_t event, cudaStream_t from, cudaStream_t to) {
  if (Status s = Cuda(cudaEventRecord(event, from), "cudaEventRecord"); !s.ok()) return s;
  return Cuda(cudaStreamWaitEvent(to, event, 0), "cudaStreamWaitEvent");
}

}  // namespace

Status PipeSend(int64_t id, CUstream stream, int slot, const copy::BufferPointers& sources,
                const copy::BufferSegment* device_rows, int64_t count, int64_t bytes, int peer,
                ncclComm_t comm, const AffineGather& affine) {
  Status status;
  Pipe* pipe = Checked(id, slot, bytes, &status);
  if (pipe == nullptr) return status;
  auto main = reinterpret_cast<cudaStream_t>(stream);
  // The slot's previous bucket (k - 2) has left before it is gathered into again.
  if (Status s = Cuda(cudaStreamWaitEvent(main, pipe->released[slot], 0), "waiting for a free slot"); !s.ok()) return s;
  copy::BufferPointers pointers = sources;
  pointers.destinations[0] = pipe->slots[slot];
  if (Status s = copy::LaunchBufferSegmentCopy(stream, pointers, device_rows, count); !s.ok()) return s;
  if (Status s = copy::LaunchAffineCopy(stream, pointers, affine.rows, affine.count, affine.table); !s.ok()) return s;
  if (Status s = Handoff(pipe->filled[slot], main, pipe->stream); !s.ok()) return s;
  if (Status s = SendBytes(pipe->slots[slot], bytes, peer, comm, reinterpret_cast<CUstream>(pipe->stream)); !s.ok()) {
    return s;
  }
  return Cuda(cudaEventRecord(pipe->released[slot], pipe->stream), "cudaEventRecord");
}

Status PipeRecv(int64_t id, CUstream stream, int slot, const copy::BufferPointers& destinations,
                const copy::BufferSegment* device_rows, int64_t count, int64_t bytes, int peer,
                ncclComm_t comm) {
  Status status;
  Pipe* pipe = Checked(id, slot, bytes, &status);
  if (pipe == nullptr) return status;
  auto main = reinterpret_cast<cudaStream_t>(stream);
  // The slot's previous bucket (k - 2) is unpacked before it is received into again.
  if (Status s = Cuda(cudaStreamWaitEvent(pipe->stream, pipe->released[slot], 0), "waiting for a free slot"); !s.ok()) return s;
  if (Status s = RecvBytes(pipe->slots[slot], bytes, peer, comm, reinterpret_cast<CUstream>(pipe->stream)); !s.ok()) {
    return s;
  }
  if (Status s = Handoff(pipe->filled[slot], pipe->stream, main); !s.ok()) return s;
  copy::BufferPointers pointers = destinations;
  pointers.sources[0] = pipe->slots[slot];
  if (Status s = copy::LaunchBufferSegmentCopy(stream, pointers, device_rows, count); !s.ok()) return s;
  return Cuda(cudaEventRecord(pipe->released[slot], main), "cudaEventRecord");
}

Status PipeDrain(int64_t id, CUstream stream) {
  Pipe* pipe = Find(id);
  if (pipe == nullptr) return Unknown(id);
  auto main = reinterpret_cast<cudaStream_t>(stream);
  for (int s = 0; s < kSlots; ++s) {
    if (Status st = Cuda(cudaStreamWaitEvent(main, pipe->released[s], 0), "draining the pipe"); !st.ok()) return st;
  }
  return Status::Ok();
}

}  // namespace amem::transport
