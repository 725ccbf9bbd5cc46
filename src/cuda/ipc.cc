#include "cuda/ipc.h"

#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/pointers.h"

namespace amem::cuda {
namespace {

struct Mapping {
  CUdeviceptr base = 0;
  size_t bytes = 0;  // the allocation's size as mapped (cuMemGetAddressRange), not the exporter's word
  int references = 0;
};

// (handle bytes, device ordinal) -> mapping. A process may map a handle once per context,
// so the key includes the device.
std::mutex mapping_mutex;
std::map<std::pair<std::string, int>, Mapping>& Mappings() {
  static auto* mappings = new std::map<std::pair<std::string, int>, Mapping>();
  return *mappings;
}

std::pair<std::string, int> MappingKey(const IpcMemHandle& handle, int ordinal) {
  return {std::string(handle.reserved, kIpcHandleBytes), ordinal};
}

Status NotOpen(int ordinal, const char* why) {
  return Status::Error("IPC handle is not open on device " + std::to_string(ordinal) + why);
}

}  // namespace

Status HandleFromBytes(const std::string& bytes, IpcMemHandle* out) {
  if (bytes.size() != static_cast<size_t>(kIpcHandleBytes)) {
    return Status::Error("an IPC memory handle is " + std::to_string(kIpcHandleBytes) +
                         " bytes, got " + std::to_string(bytes.size()) +
                         ": pass the handle exactly as export_pointer returned it");
  }
  std::memcpy(out->reserved, bytes.data(), kIpcHandleBytes);
  return Status::Ok();
}

Status ExportPointer(CUdeviceptr pointer, int ordinal, ExportedPointer* out) {
  std::string why;
  const DriverApi* api = Driver(&why);
  if (api == nullptr) return Status::Error(why);
  ScopedDeviceContext context(ordinal);
  if (!context.status().ok()) return context.status();
  int owner = -1;
  CUresult known = api->cuPointerGetAttribute(&owner, kPointerAttributeDeviceOrdinal, pointer);
  if (known != kSuccess) {
    return Status::Error("address " + Hex(pointer) +
                         " is not device memory the CUDA driver knows (a CPU tensor, or freed "
                         "memory?): " + Check(known, "cuPointerGetAttribute").message());
  }
  if (owner != ordinal) {
    return Status::Error("address " + Hex(pointer) + " is on device " + std::to_string(owner) +
                         ", not on device " + std::to_string(ordinal) + " as given");
  }
  const std::string not_exportable =
      "address " + Hex(pointer) +
      " cannot be exported with cuIpcGetMemHandle: its memory comes from the virtual memory API or a "
      "stream-ordered pool (PyTorch: expandable_segments:True or backend:cudaMallocAsync in "
      "PYTORCH_CUDA_ALLOC_CONF). Start the process without those settings";
  // A driver that cannot answer the question leaves it to cuIpcGetMemHandle below.
  int capable = 0;  // the driver writes a boolean: an int read as 0/1 either way
  if (api->cuPointerGetAttribute(&capable, kPointerAttributeIsLegacyIpcCapable, pointer) == kSuccess &&
      !capable) {
    return Status::Error(not_exportable);
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  Status ranged = Check(api->cuMemGetAddressRange(&base, &size, pointer), "cuMemGetAddressRange");
  if (!ranged.ok()) return ranged;
  CUresult exported = api->cuIpcGetMemHandle(&out->handle, base);
  if (exported != kSuccess) {
    return Status::Error(not_exportable + " (" + Check(exported, "cuIpcGetMemHandle").message() + ")");
  }
  out->offset = pointer - base;
  out->allocation_bytes = size;
  return Status::Ok();
}

Status OpenHandle(const IpcMemHandle& handle, int ordinal, CUdeviceptr* base) {
  std::string why;
  const DriverApi* api = Driver(&why);
  if (api == nullptr) return Status::Error(why);
  const auto key = MappingKey(handle, ordinal);
  std::lock_guard<std::mutex> lock(mapping_mutex);
  auto found = Mappings().find(key);
  if (found != Mappings().end()) {
    ++found->second.references;
    *base = found->second.base;
    return Status::Ok();
  }
  ScopedDeviceContext context(ordinal);
  if (!context.status().ok()) return context.status();
  CUdeviceptr mapped = 0;
  CUresult result = api->cuIpcOpenMemHandle(&mapped, handle, kIpcMemLazyEnablePeerAccess);
  if (result != kSuccess) {
    const char* hint =
        result == kErrorInvalidContext
            ? ". CUDA does not let a process open a handle it exported itself: write its tensors "
              "directly (jax_amem.swap into the tensors)"
            : ". The handle must come from a live process on this host whose memory is still "
              "allocated (the exporter must keep its tensors until the importer closes them)";
    return Status::Error(
        Check(result, ("cuIpcOpenMemHandle on device " + std::to_string(ordinal)).c_str()).message() +
        hint);
  }
  CUdeviceptr start = 0;
  size_t bytes = 0;
  // The mapping starts at the allocation's start; bytes from `mapped` to its end either way.
  // 0 when the driver cannot say (an IPC mapping that works must not be refused for it): the
  // descriptor's allocation size is checked instead.
  const bool ranged = api->cuMemGetAddressRange(&start, &bytes, mapped) == kSuccess;
  Mappings()[key] = Mapping{mapped, ranged ? static_cast<size_t>(start + bytes - mapped) : 0, 1};
  *base = mapped;
  return Status::Ok();
}

Status MappedBytes(const IpcMemHandle& handle, int ordinal, size_t* bytes) {
  std::lock_guard<std::mutex> lock(mapping_mutex);
  auto found = Mappings().find(MappingKey(handle, ordinal));
  if (found == Mappings().end()) {
    return NotOpen(ordinal, ": open it (open_handle) before asking its size");
  }
  *bytes = found->second.bytes;
  return Status::Ok();
}

Status CloseHandle(const IpcMemHandle& handle, int ordinal) {
  std::string why;
  const DriverApi* api = Driver(&why);
  if (api == nullptr) return Status::Error(why);
  std::lock_guard<std::mutex> lock(mapping_mutex);
  auto found = Mappings().find(MappingKey(handle, ordinal));
  if (found == Mappings().end()) {
    return NotOpen(ordinal, " (closed twice, or never opened in this process)");
  }
  if (--found->second.references > 0) return Status::Ok();
  CUdeviceptr base = found->second.base;
  Mappings().erase(found);
  ScopedDeviceContext context(ordinal);
  if (!context.status().ok()) return context.status();
  return Check(api->cuIpcCloseMemHandle(base), "cuIpcCloseMemHandle");
}

size_t OpenCount() {
  std::lock_guard<std::mutex> lock(mapping_mutex);
  return Mappings().size();
}

Status ReadDevice(int ordinal, CUdeviceptr address, size_t nbytes, char* out) {
  std::string why;
  const DriverApi* api = Driver(&why);
  if (api == nullptr) return Status::Error(why);
  ScopedDeviceContext context(ordinal);
  if (!context.status().ok() || nbytes == 0) return context.status();
  return Check(api->cuMemcpyDtoH(out, address, nbytes), "cuMemcpyDtoH");
}

}  // namespace amem::cuda
