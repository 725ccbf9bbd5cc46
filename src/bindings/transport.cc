// jax_amem_core._core.transport: the NCCL transport's communicators, staging pipes
// and the receiver's per-bucket call (the sender's runs inside XLA, see
// src/ffi/nccl_send_bucket.cc). Handles travel to Python as integers.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/driver_helpers.h"
#include "copy/segments.h"
#include "transport/bucket_pipe.h"
#include "transport/nccl_send_recv.h"

namespace nb = nanobind;

namespace amem::bindings {
namespace {

ncclComm_t Comm(uint64_t handle) { return reinterpret_cast<ncclComm_t>(static_cast<uintptr_t>(handle)); }
CUstream Stream(uint64_t handle) { return reinterpret_cast<CUstream>(static_cast<uintptr_t>(handle)); }

// Runs `call` with `device`'s primary context current (PyTorch's and XLA's).
template <typename Call>
void OnDevice(int device, Call&& call) {
  cuda::ScopedDeviceContext context(device);
  Raise(context.status());
  Raise(call());
}

}  // namespace

void BindTransport(nb::module_& root) {
  nb::module_ m = root.def_submodule("transport", "NCCL send/recv transport of the swap");
  m.attr("SLOTS") = transport::kSlots;
  m.def("front_is_interposer", &transport::FrontIsInterposer,
        "True when libnccl.so.2 in this process is jax_amem's interposer (communicators pausable).");
  m.def(
      "unique_id",
      [] {
        std::string id;
        Raise(transport::NewUniqueId(&id));
        return nb::bytes(id.data(), id.size());
      },
      "A new NCCL unique id (128 bytes).");
  m.def(
      "init_communicator",
      [](nb::bytes id, int nranks, int rank, int device) {
        const std::string text(static_cast<const char*>(id.data()), id.size());
        ncclComm_t comm = nullptr;
        {
          nb::gil_scoped_release release;  // blocks until every rank joined
          Raise(transport::InitCommunicator(text, nranks, rank, device, &comm));
        }
        return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(comm));
      },
      nb::arg("id"), nb::arg("nranks"), nb::arg("rank"), nb::arg("device"),
      "ncclCommInitRank through the front NCCL; returns the handle as an integer.");
  m.def(
      "destroy_communicator",
      [](uint64_t comm) {
        nb::gil_scoped_release release;
        Raise(transport::DestroyCommunicator(Comm(comm)));
      },
      nb::arg("comm"));
  m.def(
      "check_communicator", [](uint64_t comm) { Raise(transport::CommunicatorHealth(Comm(comm))); },
      nb::arg("comm"), "Raises with NCCL's asynchronous error, if any.");
  m.def(
      "create_pipe",
      [](int device, int64_t bucket_bytes) {
        int64_t id = 0;
        OnDevice(device, [&] { return transport::CreatePipe(device, bucket_bytes, &id); });
        return id;
      },
      nb::arg("device"), nb::arg("bucket_bytes"),
      "Two staging slots of bucket_bytes on `device` and a stream for NCCL; returns its id.");
  m.def(
      "destroy_pipe",
      [](int64_t pipe) {
        const int device = transport::PipeDevice(pipe);
        if (device < 0) Raise(transport::DestroyPipe(pipe));  // unknown: the error names it
        nb::gil_scoped_release release;
        OnDevice(device, [&] { return transport::DestroyPipe(pipe); });
      },
      nb::arg("pipe"));
  m.def("pipe_staging_bytes", &transport::PipeStagingBytes, nb::arg("pipe"),
        "Device bytes the pipe holds (both slots), -1 for an unknown pipe.");
  m.def(
      "recv_bucket",
      [](int64_t pipe, uint64_t stream, int slot, int64_t bytes, int peer, uint64_t comm,
         std::vector<uint64_t> destinations, uint64_t rows, int64_t count) {
        if (static_cast<int64_t>(destinations.size()) > copy::kMaxBuffersPerSide) {
          throw nb::value_error("recv_bucket: more than 512 destinations in one bucket");
        }
        copy::BufferPointers pointers{};
        for (size_t d = 0; d < destinations.size(); ++d) {
          pointers.destinations[d] = reinterpret_cast<char*>(static_cast<uintptr_t>(destinations[d]));
        }
        const int device = transport::PipeDevice(pipe);
        if (device < 0) Raise(transport::DestroyPipe(pipe));  // unknown pipe: names it
        nb::gil_scoped_release release;  // the first receive waits for NCCL's peer connection
        OnDevice(device, [&] {
          return transport::PipeRecv(pipe, Stream(stream), slot, pointers,
                                     reinterpret_cast<const copy::BufferSegment*>(static_cast<uintptr_t>(rows)),
                                     count, bytes, peer, Comm(comm));
        });
      },
      nb::arg("pipe"), nb::arg("stream"), nb::arg("slot"), nb::arg("bytes"), nb::arg("peer"),
      nb::arg("comm"), nb::arg("destinations"), nb::arg("rows"), nb::arg("count"),
      "Receives one bucket into a slot on the pipe's stream, then unpacks `count` rows (device "
      "table at `rows`, validated by the caller) into `destinations` on `stream`.");
  m.def(
      "drain",
      [](int64_t pipe, uint64_t stream) {
        const int device = transport::PipeDevice(pipe);
        if (device < 0) Raise(transport::DestroyPipe(pipe));
        OnDevice(device, [&] { return transport::PipeDrain(pipe, Stream(stream)); });
      },
      nb::arg("pipe"), nb::arg("stream"), "`stream` waits for all of the pipe's work so far.");
  // The benchmark's baseline: one plain send/recv of contiguous bytes, no packing.
  m.def(
      "send_bytes",
      [](uint64_t pointer, int64_t bytes, int peer, uint64_t comm, uint64_t stream, int device) {
        nb::gil_scoped_release release;
        OnDevice(device, [&] {
          return transport::SendBytes(reinterpret_cast<const void*>(static_cast<uintptr_t>(pointer)),
                                      bytes, peer, Comm(comm), Stream(stream));
        });
      },
      nb::arg("pointer"), nb::arg("bytes"), nb::arg("peer"), nb::arg("comm"), nb::arg("stream"),
      nb::arg("device"));
  m.def(
      "recv_bytes",
      [](uint64_t pointer, int64_t bytes, int peer, uint64_t comm, uint64_t stream, int device) {
        nb::gil_scoped_release release;
        OnDevice(device, [&] {
          return transport::RecvBytes(reinterpret_cast<void*>(static_cast<uintptr_t>(pointer)), bytes,
                                      peer, Comm(comm), Stream(stream));
        });
      },
      nb::arg("pointer"), nb::arg("bytes"), nb::arg("peer"), nb::arg("comm"), nb::arg("stream"),
      nb::arg("device"));
  m.def(
      "synchronize_stream",
      [](uint64_t stream, int device) {
        const cuda::DriverApi& api = RequireDriver();
        nb::gil_scoped_release release;
        OnDevice(device, [&] { return cuda::Check(api.cuStreamSynchronize(Stream(stream)), "cuStreamSynchronize"); });
      },
      nb::arg("stream"), nb::arg("device"), "Blocks until `stream` (0: the legacy default) is done.");
}

}  // namespace amem::bindings
