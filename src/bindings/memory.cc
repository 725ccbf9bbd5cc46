// jax_amem_core._core.memory: the host staging pool and the batched offload/reload copies.
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings/bindings.h"
#include "bindings/driver_helpers.h"
#include "cuda/driver_api.h"
#include "memory/numa.h"
#include "memory/staging_pool.h"
#include "memory/transfer.h"

namespace nb = nanobind;

namespace amem::bindings {
namespace {

// Rows of (device ordinal or -1 for host, device address, host address, bytes).
using TransferTable = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

std::vector<memory::Transfer> Decode(const TransferTable& table) {
  if (table.shape(1) != 4) {
    throw nb::value_error(
        "transfers must have shape (n, 4): (device ordinal or -1, device address, host address, "
        "bytes)");
  }
  std::vector<memory::Transfer> transfers(table.shape(0));
  const int64_t* rows = table.data();
  for (size_t i = 0; i < transfers.size(); ++i) {
    const int64_t* row = rows + 4 * i;
    if (row[0] < memory::kHostDevice || row[3] < 0) {
      throw nb::value_error(("transfer row " + std::to_string(i) +
                             " has a bad device ordinal or a negative size").c_str());
    }
    transfers[i] = {static_cast<int>(row[0]), static_cast<uintptr_t>(row[1]),
                    static_cast<uintptr_t>(row[2]), static_cast<size_t>(row[3])};
  }
  return transfers;
}

void Copy(const TransferTable& table, memory::Direction direction) {
  std::vector<memory::Transfer> transfers = Decode(table);
  Status status;
  {
    nb::gil_scoped_release release;
    status = memory::CopyBatch(transfers, direction);
  }
  Raise(status);
}

std::vector<int> Start(const TransferTable& table, memory::Direction direction) {
  std::vector<memory::Transfer> transfers = Decode(table);
  std::vector<int> started;
  Status status;
  {
    nb::gil_scoped_release release;
    status = memory::StartBatch(transfers, direction, &started);
    if (!status.ok()) memory::WaitBatch(started);  // nothing may run on after the error
  }
  Raise(status);
  return started;
}

nb::dict StatsDict(const memory::PoolStats& s) {
  nb::dict d;
  d["pinned"] = s.pinned;
  d["reserved_bytes"] = s.reserved_bytes;
  d["in_use_bytes"] = s.in_use_bytes;
  d["high_water_bytes"] = s.high_water_bytes;
  d["chunk_count"] = s.chunk_count;
  d["chunk_allocations"] = s.chunk_allocations;
  d["method"] = s.method;
  d["grow_seconds"] = s.grow_seconds;
  d["numa_node"] = s.numa_node;
  d["placement_failures"] = s.placement_failures;
  return d;
}

}  // namespace

void BindMemory(nb::module_& root) {
  nb::module_ m = root.def_submodule("memory", "Host staging pool and offload/reload copies");
  m.attr("PLACEMENT_ALIGNMENT") = memory::kPlacementAlignment;
  m.attr("CHUNK_GRANULARITY") = memory::kChunkGranularity;
  m.attr("BLOCK_BYTES") = memory::kBlockBytes;

  nb::class_<memory::StagingPool>(m, "StagingPool",
                                  "Reusable host staging memory (pinned on GPU machines).")
      .def(nb::init<bool, const std::string&, int>(), nb::arg("pinned"), nb::arg("method") = "",
           nb::arg("numa_node") = -1,
           "method: how pinned memory is made, 'registered' (mmap + huge pages + "
           "cuMemHostRegister) or 'hostalloc' (cuMemHostAlloc); '' = 'registered' "
           "(jax_amem passes JAX_AMEM_PINNED_MEMORY's value). numa_node: the NUMA node new blocks are placed on (-1: the "
           "kernel's default; 'hostalloc' memory is the driver's to place).")
      .def(
          "place",
          [](memory::StagingPool& pool, const std::vector<size_t>& sizes) {
            std::vector<uintptr_t> addresses;
            Status status;
            {
              nb::gil_scoped_release release;  // a new pinned chunk can take seconds
              status = pool.Place(sizes, &addresses);
            }
            Raise(status);
            return addresses;
          },
          nb::arg("sizes"),
          "Host addresses for buffers of these sizes (all or none); grows the pool if needed.")
      .def(
          "reserve",
          [](memory::StagingPool& pool, const std::vector<size_t>& sizes) {
            Status status;
            {
              nb::gil_scoped_release release;  // runs on a background thread of jax_amem.reserve
              status = pool.Reserve(sizes);
            }
            Raise(status);
          },
          nb::arg("sizes"),
          "Grows the pool (blocks made on worker threads) so that place(sizes) needs no new "
          "memory; places nothing.")
      .def("release_all", &memory::StagingPool::ReleaseAll,
           "Returns every placement; the memory stays reserved for reuse.")
      .def(
          "free", [](memory::StagingPool& pool) { Raise(pool.Free()); },
          "Returns all the pool's memory to the OS / driver (refused while in use).")
      .def(
          "stats", [](const memory::StagingPool& pool) { return StatsDict(pool.Stats()); },
          "{pinned, reserved_bytes, in_use_bytes, high_water_bytes, chunk_count, "
          "chunk_allocations, method, grow_seconds, numa_node, placement_failures}");
  m.def("numa_node_count", [](const std::string& sysfs) { return memory::NumaNodeCount(sysfs); },
        nb::arg("sysfs") = "/sys", "NUMA nodes online (1 where the kernel does not say).");
  m.def(
      "numa_node_of_pci_device",
      [](const std::string& bus_id, const std::string& sysfs) { return memory::NumaNodeOfPciDevice(bus_id, sysfs); },
      nb::arg("bus_id"), nb::arg("sysfs") = "/sys",
      "The NUMA node of the PCI device with this bus id (pci_bus_id(ordinal)), -1 when unknown.");
  m.def(
      "node_of_address", [](uintptr_t address) { return memory::NodeOfAddress(reinterpret_cast<void*>(address)); },
      nb::arg("address"), "The NUMA node of the (touched) page holding this host address, -1 when unknown.");

  m.def(
      "copy_to_host", [](TransferTable table) { Copy(table, memory::Direction::kToHost); },
      nb::arg("transfers"),
      "Copies each (ordinal, device address, host address, bytes) row device -> host and "
      "returns when all are done (GPUs copy concurrently, each on a stream of ours).");
  m.def(
      "copy_to_device", [](TransferTable table) { Copy(table, memory::Direction::kToDevice); },
      nb::arg("transfers"), "Copies each row host -> device and returns when all are done.");
  m.def(
      "start_copy_to_host", [](TransferTable table) { return Start(table, memory::Direction::kToHost); },
      nb::arg("transfers"),
      "copy_to_host without the wait: returns the GPU ordinals to pass to wait_copies() (always "
      "call it), so host work can overlap the copies. Host rows are copied before it returns.");
  m.def(
      "start_copy_to_device",
      [](TransferTable table) { return Start(table, memory::Direction::kToDevice); },
      nb::arg("transfers"), "copy_to_device without the wait (see start_copy_to_host).");
  m.def(
      "wait_copies",
      [](const std::vector<int>& ordinals) {
        Status status;
        {
          nb::gil_scoped_release release;
          status = memory::WaitBatch(ordinals);
        }
        Raise(status);
      },
      nb::arg("ordinals"), "Returns when every copy started on these GPUs has finished.");
  m.def(
      "device_pool_usage",
      [](int ordinal) {
        const cuda::DriverApi* api = &RequireDriver();
        cuda::ScopedDeviceContext context(ordinal);
        Raise(context.status());
        CUmemoryPool pool = DeviceMemPool(*api, ordinal);
        uint64_t reserved = 0, used = 0;
        Raise(cuda::Check(api->cuMemPoolGetAttribute(pool, cuda::kMemPoolAttrReservedMemCurrent,
                                                     &reserved),
                          "cuMemPoolGetAttribute(RESERVED_MEM_CURRENT)"));
        Raise(cuda::Check(
            api->cuMemPoolGetAttribute(pool, cuda::kMemPoolAttrUsedMemCurrent, &used),
            "cuMemPoolGetAttribute(USED_MEM_CURRENT)"));
        return std::make_pair(reserved, used);
      },
      nb::arg("ordinal"),
      "(reserved, used) bytes of the device's current memory pool (XLA's cuda_async "
      "allocator draws from it): reserved - used is memory the pool holds idle.");
  m.def(
      "pci_bus_id",
      [](int ordinal) {
        const cuda::DriverApi* api = &RequireDriver();
        CUdevice device = 0;
        Raise(cuda::Check(api->cuDeviceGet(&device, ordinal), "cuDeviceGet"));
        char bus_id[64] = {};
        Raise(cuda::Check(api->cuDeviceGetPCIBusId(bus_id, sizeof(bus_id), device),
                          "cuDeviceGetPCIBusId"));
        return std::string(bus_id);
      },
      nb::arg("ordinal"),
      "The device's PCI bus id (how NVML finds the same GPU whatever CUDA_VISIBLE_DEVICES says).");
}

}  // namespace amem::bindings
