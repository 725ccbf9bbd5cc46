// jax_amem._core.ipc: CUDA IPC memory handles, so that a swap can write the buffers of
// another process on the same host (jax_amem/swap/ipc.py).
//
// The exporter (a PyTorch rollout) turns a device pointer into (handle, offset in its
// allocation, allocation size): PyTorch's caching allocator sub-allocates, and a handle is
// always for a whole cudaMalloc block. The importer (the trainer) opens each handle once per
// device (cached here, reference counted) and adds the offset itself.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "bindings/bindings.h"
#include "bindings/driver_helpers.h"
#include "cuda/driver_api.h"

namespace nb = nanobind;

namespace amem::bindings {
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

std::string Hex(uint64_t value) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

cuda::IpcMemHandle HandleFrom(const nb::bytes& handle) {
  if (handle.size() != cuda::kIpcHandleBytes) {
    throw nb::value_error(("an IPC memory handle is " + std::to_string(cuda::kIpcHandleBytes) +
                           " bytes, got " + std::to_string(handle.size()) +
                           ": pass the handle exactly as export_pointer returned it")
                              .c_str());
  }
  cuda::IpcMemHandle out;
  std::memcpy(out.reserved, handle.c_str(), cuda::kIpcHandleBytes);
  return out;
}

// The cache key of a handle on a device; checks the handle's size.
std::pair<std::string, int> MappingKey(const nb::bytes& handle, int ordinal) {
  cuda::IpcMemHandle checked = HandleFrom(handle);
  return {std::string(checked.reserved, cuda::kIpcHandleBytes), ordinal};
}

nb::tuple ExportPointer(uint64_t pointer, int ordinal) {
  const cuda::DriverApi& api = RequireDriver();
  cuda::ScopedDeviceContext context(ordinal);
  Raise(context.status());
  int owner = -1;
  CUresult known = api.cuPointerGetAttribute(&owner, cuda::kPointerAttributeDeviceOrdinal, pointer);
  if (known != cuda::kSuccess) {
    throw std::runtime_error("address " + Hex(pointer) +
                             " is not device memory the CUDA driver knows (a CPU tensor, or freed "
                             "memory?): " + cuda::Check(known, "cuPointerGetAttribute").message());
  }
  if (owner != ordinal) {
    throw std::runtime_error("address " + Hex(pointer) + " is on device " + std::to_string(owner) +
                             ", not on device " + std::to_string(ordinal) + " as given");
  }
  const std::string not_exportable =
      "address " + Hex(pointer) +
      " cannot be exported with cuIpcGetMemHandle: its memory comes from the virtual memory API or a "
      "stream-ordered pool (PyTorch: expandable_segments:True or backend:cudaMallocAsync in "
      "PYTORCH_CUDA_ALLOC_CONF). Start the process without those settings";
  // A driver that cannot answer the question leaves it to cuIpcGetMemHandle below.
  int capable = 0;  // the driver writes a boolean: an int read as 0/1 either way
  if (api.cuPointerGetAttribute(&capable, cuda::kPointerAttributeIsLegacyIpcCapable, pointer) == cuda::kSuccess &&
      !capable) {
    throw std::runtime_error(not_exportable);
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  Raise(cuda::Check(api.cuMemGetAddressRange(&base, &size, pointer), "cuMemGetAddressRange"));
  cuda::IpcMemHandle handle;
  CUresult exported = api.cuIpcGetMemHandle(&handle, base);
  if (exported != cuda::kSuccess) {
    throw std::runtime_error(not_exportable + " (" + cuda::Check(exported, "cuIpcGetMemHandle").message() + ")");
  }
  return nb::make_tuple(nb::bytes(handle.reserved, cuda::kIpcHandleBytes), pointer - base, size);
}

uint64_t OpenHandle(const nb::bytes& handle_bytes, int ordinal) {
  cuda::IpcMemHandle handle = HandleFrom(handle_bytes);
  auto key = MappingKey(handle_bytes, ordinal);
  const cuda::DriverApi& api = RequireDriver();
  std::lock_guard<std::mutex> lock(mapping_mutex);
  auto found = Mappings().find(key);
  if (found != Mappings().end()) {
    ++found->second.references;
    return found->second.base;
  }
  cuda::ScopedDeviceContext context(ordinal);
  Raise(context.status());
  CUdeviceptr base = 0;
  CUresult result = api.cuIpcOpenMemHandle(&base, handle, cuda::kIpcMemLazyEnablePeerAccess);
  if (result != cuda::kSuccess) {
    std::string hint =
        result == cuda::kErrorInvalidContext
            ? ". CUDA does not let a process open a handle it exported itself: write its tensors "
              "directly (jax_amem.swap into the tensors)"
            : ". The handle must come from a live process on this host whose memory is still "
              "allocated (the exporter must keep its tensors until the importer closes them)";
    throw std::runtime_error(
        cuda::Check(result, ("cuIpcOpenMemHandle on device " + std::to_string(ordinal)).c_str())
            .message() +
        hint);
  }
  CUdeviceptr start = 0;
  size_t bytes = 0;
  // The mapping starts at the allocation's start; bytes from `base` to its end either way.
  // 0 when the driver cannot say (not yet seen on the GPU machine, but an IPC mapping that
  // works must not be refused for it): the descriptor's allocation size is checked instead.
  const bool ranged = api.cuMemGetAddressRange(&start, &bytes, base) == cuda::kSuccess;
  Mappings()[key] = Mapping{base, ranged ? static_cast<size_t>(start + bytes - base) : 0, 1};
  return base;
}

size_t MappedBytes(const nb::bytes& handle_bytes, int ordinal) {
  auto key = MappingKey(handle_bytes, ordinal);
  std::lock_guard<std::mutex> lock(mapping_mutex);
  auto found = Mappings().find(key);
  if (found == Mappings().end()) {
    throw std::runtime_error("IPC handle is not open on device " + std::to_string(ordinal) +
                             ": open it (open_handle) before asking its size");
  }
  return found->second.bytes;
}

void CloseHandle(const nb::bytes& handle_bytes, int ordinal) {
  auto key = MappingKey(handle_bytes, ordinal);
  const cuda::DriverApi& api = RequireDriver();
  std::lock_guard<std::mutex> lock(mapping_mutex);
  auto found = Mappings().find(key);
  if (found == Mappings().end()) {
    throw std::runtime_error("IPC handle is not open on device " + std::to_string(ordinal) +
                             " (closed twice, or never opened in this process)");
  }
  if (--found->second.references > 0) return;
  CUdeviceptr base = found->second.base;
  Mappings().erase(found);
  cuda::ScopedDeviceContext context(ordinal);
  Raise(context.status());
  Raise(cuda::Check(api.cuIpcCloseMemHandle(base), "cuIpcCloseMemHandle"));
}

nb::bytes ReadDevice(int ordinal, uint64_t address, size_t nbytes) {
  const cuda::DriverApi& api = RequireDriver();
  std::string out(nbytes, '\0');
  Status status;
  {
    nb::gil_scoped_release release;
    cuda::ScopedDeviceContext context(ordinal);
    status = context.status();
    if (status.ok() && nbytes > 0) status = cuda::Check(api.cuMemcpyDtoH(out.data(), address, nbytes), "cuMemcpyDtoH");
  }
  Raise(status);
  return nb::bytes(out.data(), out.size());
}

size_t OpenCount() {
  std::lock_guard<std::mutex> lock(mapping_mutex);
  return Mappings().size();
}

}  // namespace

void BindIpc(nb::module_& root) {
  nb::module_ m = root.def_submodule("ipc", "CUDA IPC memory handles (another process's buffers)");
  m.attr("HANDLE_BYTES") = cuda::kIpcHandleBytes;
  m.def("export_pointer", &ExportPointer, nb::arg("pointer"), nb::arg("ordinal"),
        "(handle: 64 bytes, offset of the pointer in its allocation, allocation bytes) for device "
        "memory of `ordinal`; RuntimeError for memory that is not IPC-capable (VMM, pools).");
  m.def("open_handle", &OpenHandle, nb::arg("handle"), nb::arg("ordinal"),
        "The base address of another process's allocation mapped on device `ordinal`; each handle is "
        "mapped once per device, further opens count references.");
  m.def("close_handle", &CloseHandle, nb::arg("handle"), nb::arg("ordinal"),
        "Drops one reference; the last unmaps (cuIpcCloseMemHandle).");
  m.def("mapped_bytes", &MappedBytes, nb::arg("handle"), nb::arg("ordinal"),
        "The size in bytes of an open handle's allocation as the driver mapped it here (0: the "
        "driver could not say).");
  m.def("read_device", &ReadDevice, nb::arg("ordinal"), nb::arg("address"), nb::arg("nbytes"),
        "Bytes at a device address (a synchronous driver copy to the host).");
  m.def("open_count", &OpenCount, "Number of handles mapped now (per device).");
}

}  // namespace amem::bindings
