// jax_amem_core._core.ipc: CUDA IPC memory handles (the mechanism is src/cuda/ipc.h).
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <string>

#include "bindings/bindings.h"
#include "bindings/driver_helpers.h"
#include "cuda/ipc.h"

namespace nb = nanobind;

namespace amem::bindings {
namespace {

cuda::IpcMemHandle HandleFrom(const nb::bytes& bytes) {
  cuda::IpcMemHandle handle;
  Status read = cuda::HandleFromBytes(std::string(bytes.c_str(), bytes.size()), &handle);
  if (!read.ok()) throw nb::value_error(read.message().c_str());
  return handle;
}

}  // namespace

void BindIpc(nb::module_& root) {
  nb::module_ m = root.def_submodule("ipc", "CUDA IPC memory handles (another process's buffers)");
  m.attr("HANDLE_BYTES") = cuda::kIpcHandleBytes;
  m.def(
      "export_pointer",
      [](uint64_t pointer, int ordinal) {
        cuda::ExportedPointer exported;
        Raise(cuda::ExportPointer(pointer, ordinal, &exported));
        return nb::make_tuple(nb::bytes(exported.handle.reserved, cuda::kIpcHandleBytes),
                              exported.offset, exported.allocation_bytes);
      },
      nb::arg("pointer"), nb::arg("ordinal"),
      "(handle: 64 bytes, offset of the pointer in its allocation, allocation bytes) for device "
      "memory of `ordinal`; RuntimeError for memory that is not IPC-capable (VMM, pools).");
  m.def(
      "open_handle",
      [](const nb::bytes& handle, int ordinal) {
        CUdeviceptr base = 0;
        Raise(cuda::OpenHandle(HandleFrom(handle), ordinal, &base));
        return static_cast<uint64_t>(base);
      },
      nb::arg("handle"), nb::arg("ordinal"),
      "The base address of another process's allocation mapped on device `ordinal`; each handle is "
      "mapped once per device, further opens count references.");
  m.def(
      "close_handle",
      [](const nb::bytes& handle, int ordinal) { Raise(cuda::CloseHandle(HandleFrom(handle), ordinal)); },
      nb::arg("handle"), nb::arg("ordinal"), "Drops one reference; the last unmaps (cuIpcCloseMemHandle).");
  m.def(
      "mapped_bytes",
      [](const nb::bytes& handle, int ordinal) {
        size_t bytes = 0;
        Raise(cuda::MappedBytes(HandleFrom(handle), ordinal, &bytes));
        return bytes;
      },
      nb::arg("handle"), nb::arg("ordinal"),
      "The size in bytes of an open handle's allocation as the driver mapped it here (0: the "
      "driver could not say).");
  m.def(
      "read_device",
      [](int ordinal, uint64_t address, size_t nbytes) {
        std::string out(nbytes, '\0');
        Status read;
        {
          nb::gil_scoped_release release;
          read = cuda::ReadDevice(ordinal, address, nbytes, out.data());
        }
        Raise(read);
        return nb::bytes(out.data(), out.size());
      },
      nb::arg("ordinal"), nb::arg("address"), nb::arg("nbytes"),
      "Bytes at a device address (a synchronous driver copy to the host).");
  m.def("open_count", &cuda::OpenCount, "Number of handles mapped now (per device).");
}

}  // namespace amem::bindings
