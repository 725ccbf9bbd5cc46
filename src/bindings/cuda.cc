#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include "bindings/bindings.h"
#include "bindings/driver_helpers.h"
#include "cuda/driver_api.h"
#include "cuda/pointers.h"

namespace nb = nanobind;

namespace amem::bindings {

void BindCuda(nb::module_& root) {
  nb::module_ m = root.def_submodule("cuda", "CUDA driver API, loaded at run time");
  m.def(
      "driver_status",
      [] {
        std::string why;
        bool ok = cuda::Driver(&why) != nullptr;
        return std::make_pair(ok, why);
      },
      "(available, why-not) for the CUDA driver; never raises.");
  m.def(
      "driver_version",
      [] {
        int version = 0;
        Raise(cuda::Check(RequireDriver().cuDriverGetVersion(&version), "cuDriverGetVersion"));
        return version;
      },
      "The driver's CUDA version, e.g. 13000.");
  m.def(
      "device_count",
      [] {
        int count = 0;
        Raise(cuda::Check(RequireDriver().cuDeviceGetCount(&count), "cuDeviceGetCount"));
        return count;
      },
      "Number of CUDA devices visible to this process.");
  m.def(
      "extent_at",
      [](uint64_t address, uint64_t limit) {
        uint64_t bytes = 0;
        Raise(cuda::ExtentAt(address, limit, &bytes));
        return bytes;
      },
      nb::arg("address"), nb::arg("limit") = uint64_t{1} << 62,
      "Bytes from `address` to the end of the device memory that holds it: its cudaMalloc "
      "allocation, or the mapped pieces of a virtual-memory reservation (expandable segments, "
      "pools) that follow it without a gap, walked until `limit`. RuntimeError when the driver "
      "does not know the address. Creates no CUDA context.");
  m.def(
      "mem_get_info",
      [](int ordinal) {
        const cuda::DriverApi& api = RequireDriver();
        cuda::ScopedDeviceContext context(ordinal);
        Raise(context.status());
        size_t free_bytes = 0, total_bytes = 0;
        Raise(cuda::Check(api.cuMemGetInfo(&free_bytes, &total_bytes), "cuMemGetInfo"));
        return std::make_pair(free_bytes, total_bytes);
      },
      nb::arg("ordinal"), "(free, total) bytes on a device, as the driver sees them.");
  m.def(
      "trim_memory_pool",
      [](int ordinal) {
        const cuda::DriverApi& api = RequireDriver();
        cuda::ScopedDeviceContext context(ordinal);
        Raise(context.status());
        CUmemoryPool pool = DeviceMemPool(api, ordinal);
        Raise(cuda::Check(api.cuCtxSynchronize(), "cuCtxSynchronize"));
        Raise(cuda::Check(api.cuMemPoolTrimTo(pool, 0), "cuMemPoolTrimTo"));
      },
      nb::arg("ordinal"),
      "Returns the unused memory of the device's current memory pool to the driver "
      "(the pool XLA's cuda_async allocator draws from).");
}

}  // namespace amem::bindings
