// jax_amem_core._core.copy.DirectCopy: the copy of an eager swap into destinations given by address,
// launched from here instead of inside an XLA program (src/copy/direct_launch.h;
// jax_amem/swapping/in_process/direct.py), and the stream it runs on when no framework's
// stream is the reader's (CUDA IPC destinations).
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/driver_helpers.h"
#include "copy/direct_launch.h"

namespace nb = nanobind;

namespace amem::bindings {
namespace {

using RowArray = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using PointerArray = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

struct DirectCopyHandle {
  std::unique_ptr<copy::DirectCopy> copy;
};

std::vector<copy::BufferSegment> Rows(const RowArray& array, const char* what) {
  constexpr size_t kColumns = sizeof(copy::BufferSegment) / sizeof(int64_t);
  if (array.shape(0) > 0 && array.shape(1) != kColumns) {
    throw nb::value_error((std::string(what) + " rows must have shape (n, 6): (src_index, dst_index, "
                           "src_offset, dst_offset, bytes, 0)").c_str());
  }
  const auto* rows = reinterpret_cast<const copy::BufferSegment*>(array.data());
  return std::vector<copy::BufferSegment>(rows, rows + array.shape(0));
}

std::vector<copy::TransposeRow> TransposeRows(const RowArray& array) {
  if (array.shape(0) > 0 && array.shape(1) != copy::kTransposeRowColumns) {
    throw nb::value_error("transpose rows must have shape (n, 10): (src_index, dst_index, dst_offset, first, "
                          "count, batch, rows, cols, kind, program (-1: none))");
  }
  std::vector<copy::TransposeRow> rows(array.shape(0));  // the fields past the tenth: filled when checked
  for (size_t k = 0; k < rows.size(); ++k) {
    std::memcpy(&rows[k], array.data() + k * copy::kTransposeRowColumns, copy::kTransposeRowColumns * sizeof(int64_t));
  }
  return rows;
}

std::vector<copy::AffineRow> AffineRows(const RowArray& array) {
  constexpr size_t kColumns = sizeof(copy::AffineRow) / sizeof(int64_t);
  if (array.shape(0) > 0 && array.shape(1) != kColumns) {
    throw nb::value_error("affine rows must have shape (n, 6): (src_index, dst_index, src_element, dst_element, "
                          "count, program)");
  }
  const auto* rows = reinterpret_cast<const copy::AffineRow*>(array.data());
  return std::vector<copy::AffineRow>(rows, rows + array.shape(0));
}

// (source slots, destination addresses, destination bytes, bulk rows, kernel rows[, transpose
// rows[, affine rows, affine table, affine programs]]) per chunk.
std::vector<copy::DirectChunk> Chunks(const nb::list& chunks) {
  std::vector<copy::DirectChunk> out;
  for (nb::handle item : chunks) {
    nb::tuple fields = nb::cast<nb::tuple>(item);
    if (fields.size() != 5 && fields.size() != 6 && fields.size() != 9) {
      throw nb::value_error("a chunk is (source slots, addresses, destination bytes, bulk rows, rows[, transpose "
                            "rows[, affine rows, affine table, affine programs]])");
    }
    copy::DirectChunk chunk;
    chunk.source_slots = nb::cast<std::vector<int64_t>>(fields[0]);
    chunk.destinations = nb::cast<std::vector<int64_t>>(fields[1]);
    chunk.destination_bytes = nb::cast<std::vector<int64_t>>(fields[2]);
    chunk.bulk = Rows(nb::cast<RowArray>(fields[3]), "bulk");
    chunk.rows = Rows(nb::cast<RowArray>(fields[4]), "kernel");
    if (fields.size() >= 6) chunk.transposes = TransposeRows(nb::cast<RowArray>(fields[5]));
    if (fields.size() == 9) {
      chunk.affines = AffineRows(nb::cast<RowArray>(fields[6]));
      PointerArray table = nb::cast<PointerArray>(fields[7]);
      chunk.affine_table.assign(table.data(), table.data() + table.shape(0));
      chunk.affine_programs = nb::cast<int64_t>(fields[8]);
    }
    out.push_back(std::move(chunk));
  }
  return out;
}

// One non-blocking stream per device, made on first use and kept for the process.
uint64_t DirectStream(int device) {
  static std::mutex mutex;
  static std::map<int, CUstream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = streams.find(device);
  if (found != streams.end()) return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(found->second));
  const cuda::DriverApi& api = RequireDriver();
  cuda::ScopedDeviceContext context(device);
  Raise(context.status());
  CUstream stream = nullptr;
  Raise(cuda::Check(api.cuStreamCreate(&stream, cuda::kStreamNonBlocking), "cuStreamCreate (direct copy)"));
  streams[device] = stream;
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(stream));
}

}  // namespace

void BindDirectCopy(nb::module_& m) {
  nb::class_<DirectCopyHandle>(m, "DirectCopy",
                               "Rows into destinations given by address, checked and put on the device once, "
                               "launched outside XLA with the sources' addresses of each swap.")
      .def(
          "__init__",
          [](DirectCopyHandle* self, int device, std::vector<int64_t> source_bytes, nb::list chunks) {
            std::vector<copy::DirectChunk> parsed = Chunks(chunks);
            std::unique_ptr<copy::DirectCopy> made;
            Status status = copy::DirectCopy::Make(device, std::move(source_bytes), std::move(parsed), &made);
            if (!status.ok()) throw nb::value_error(status.message().c_str());
            new (self) DirectCopyHandle{std::move(made)};
          },
          nb::arg("device"), nb::arg("source_bytes"), nb::arg("chunks"),
          "device: CUDA ordinal, or -1 for host memory. chunks: [(source slots, destination addresses, "
          "destination bytes, bulk rows (n, 6) int64, kernel rows (m, 6) int64 split into pieces[, transpose rows (k, 10) "
          "int64, each with its program in the chunk's affine table or -1: src/copy/transpose.h[, affine rows (a, 6) int64 split into pieces, their table (int64 words: "
          "programs, then float64 constants), its number of programs: src/copy/affine.h]])]; rows validated by "
          "jax_amem.copy.address_rows and jax_amem.affine_copy.address_affine_rows. Raises ValueError naming the "
          "chunk and row out of bounds.")
      .def_prop_ro("device", [](const DirectCopyHandle& h) { return h.copy->device(); })
      .def_prop_ro("sources", [](const DirectCopyHandle& h) { return h.copy->sources(); })
      .def_prop_ro("rows", [](const DirectCopyHandle& h) { return h.copy->rows(); })
      .def_prop_ro("bulk_rows", [](const DirectCopyHandle& h) { return h.copy->bulk_rows(); })
      .def_prop_ro("transpose_rows", [](const DirectCopyHandle& h) { return h.copy->transpose_rows(); })
      .def_prop_ro("stepped_transpose_rows",
                   [](const DirectCopyHandle& h) { return h.copy->stepped_transpose_rows(); })
      .def_prop_ro("affine_rows", [](const DirectCopyHandle& h) { return h.copy->affine_rows(); })
      .def_prop_ro("launches", [](const DirectCopyHandle& h) { return h.copy->launches(); },
                   "Driver copies and kernel launches that one run enqueues on a GPU.")
      .def(
          "run",
          [](const DirectCopyHandle& h, PointerArray pointers, uint64_t stream) {
            const copy::DirectCopy& copy = *h.copy;
            const auto count = static_cast<int64_t>(pointers.shape(0));
            nb::gil_scoped_release release;
            if (copy.device() < 0) {
              Raise(copy.Run(pointers.data(), count, nullptr));
              return;
            }
            cuda::ScopedDeviceContext context(copy.device());
            Raise(context.status());
            Raise(copy.Run(pointers.data(), count, reinterpret_cast<CUstream>(static_cast<uintptr_t>(stream))));
          },
          nb::arg("pointers"), nb::arg("stream") = 0,
          "Copies every row: on CUDA enqueued on `stream` (returns at once), on the host done on return. "
          "pointers: an int64 array, one source address per slot (jax.Array.unsafe_buffer_pointer()).");
  nb::dict kinds;  // transpose.h's conversions, by name (jax_amem/swapping/in_process/fused_views.py)
  kinds["copy2"] = static_cast<int64_t>(copy::kTransposeCopy2);
  kinds["copy4"] = static_cast<int64_t>(copy::kTransposeCopy4);
  kinds["float32->bfloat16"] = static_cast<int64_t>(copy::kTransposeF32ToBF16);
  kinds["float32->float16"] = static_cast<int64_t>(copy::kTransposeF32ToF16);
  kinds["bfloat16->float32"] = static_cast<int64_t>(copy::kTransposeBF16ToF32);
  kinds["float16->float32"] = static_cast<int64_t>(copy::kTransposeF16ToF32);
  m.attr("TRANSPOSE_KINDS") = kinds;
  m.def("direct_stream", &DirectStream, nb::arg("device"),
        "A non-blocking stream of this process on `device`, made once: where a direct copy runs when the "
        "destination's reader has no stream here (CUDA IPC).");
  BindRepeatCheck(m);
}

}  // namespace amem::bindings
