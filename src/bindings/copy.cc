#include <nanobind/ndarray.h>

#include <cstring>
#include <string>

#include <nanobind/stl/vector.h>

#include "bindings/bindings.h"
#include "copy/copy_cuda.h"
#include "copy/segments.h"

namespace nb = nanobind;

namespace amem::bindings {
namespace {

using SegmentArray = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using OwnedSegmentArray = nb::ndarray<nb::numpy, int64_t, nb::ndim<2>>;

// Rows (of Segment or BufferSegment) as an owned (n, columns) int64 numpy array.
template <typename Row>
OwnedSegmentArray ToNumpy(std::vector<Row> rows) {
  auto* owned = new std::vector<Row>(std::move(rows));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<Row>*>(p); });
  return OwnedSegmentArray(owned->data(), {owned->size(), sizeof(Row) / sizeof(int64_t)}, owner);
}

// The checks both table preparers share; `Row` is Segment or BufferSegment.
template <typename Row>
const Row* CheckedRows(const SegmentArray& segments, const char* columns, int64_t max_piece) {
  if (segments.shape(1) != sizeof(Row) / sizeof(int64_t)) {
    throw nb::value_error((std::string("segments must have shape (n, ") +
                           std::to_string(sizeof(Row) / sizeof(int64_t)) + "): " + columns)
                              .c_str());
  }
  if (max_piece <= 0 || max_piece % 16 != 0) {
    throw nb::value_error("max_piece must be a positive multiple of 16");
  }
  return reinterpret_cast<const Row*>(segments.data());
}

void RaiseIfInvalid(const Status& status) {
  if (!status.ok()) throw nb::value_error(status.message().c_str());
}

}  // namespace

void BindCopy(nb::module_& root) {
  nb::module_ m = root.def_submodule("copy", "Batched segment copies");
  m.attr("MAX_PIECE_BYTES") = copy::kMaxPieceBytes;
  m.def("have_cuda_kernels", &copy::HaveCudaKernels,
        "True when this build compiled the CUDA kernels.");
  m.def(
      "prepare_segments",
      [](SegmentArray segments, int64_t src_bytes, int64_t dst_bytes, int64_t max_piece) {
        const auto* rows = CheckedRows<copy::Segment>(segments, "(src_offset, dst_offset, bytes)",
                                                      max_piece);
        const int64_t count = static_cast<int64_t>(segments.shape(0));
        RaiseIfInvalid(copy::ValidateSegments(rows, count, src_bytes, dst_bytes));
        return ToNumpy(copy::SplitIntoPieces(rows, count, max_piece));
      },
      nb::arg("segments"), nb::arg("src_bytes"), nb::arg("dst_bytes"),
      nb::arg("max_piece") = copy::kMaxPieceBytes,
      "Validates a segment table against both buffer sizes (in bounds, positive, no two "
      "segments writing the same destination byte) and splits long segments into pieces "
      "that balance one kernel launch. Raises ValueError naming the first bad row.");
  m.attr("MAX_BUFFERS_PER_SIDE") = copy::kMaxBuffersPerSide;
  m.attr("MIN_ADDRESS") = copy::kMinAddress;
  m.attr("ADDRESS_LIMIT") = copy::kAddressLimit;
  m.def(
      "prepare_buffer_segments",
      [](SegmentArray segments, std::vector<int64_t> src_bytes, std::vector<int64_t> dst_bytes,
         int64_t max_piece) {
        const auto* rows = CheckedRows<copy::BufferSegment>(
            segments, "(src_index, dst_index, src_offset, dst_offset, bytes, 0)", max_piece);
        const int64_t count = static_cast<int64_t>(segments.shape(0));
        RaiseIfInvalid(copy::ValidateBufferSegments(rows, count, src_bytes, dst_bytes));
        return ToNumpy(copy::SplitBufferSegments(rows, count, max_piece));
      },
      nb::arg("segments"), nb::arg("src_bytes"), nb::arg("dst_bytes"),
      nb::arg("max_piece") = copy::kMaxPieceBytes,
      "As prepare_segments for a copy between several buffers: rows (src_index, dst_index, "
      "src_offset, dst_offset, bytes, 0), checked against each buffer's size.");
  m.def(
      "split_buffer_segments",
      [](SegmentArray segments, int64_t max_piece) {
        const auto* rows = CheckedRows<copy::BufferSegment>(
            segments, "(src_index, dst_index, src_offset, dst_offset, bytes, 0)", max_piece);
        return ToNumpy(copy::SplitBufferSegments(rows, static_cast<int64_t>(segments.shape(0)),
                                                 max_piece));
      },
      nb::arg("segments"), nb::arg("max_piece") = copy::kMaxPieceBytes,
      "Splits rows that prepare_buffer_segments already validated into pieces of at most "
      "max_piece bytes, keeping their order; checks nothing else (a subset of a validated "
      "table is still valid, so it is not sorted and checked a second time).");
  BindDirectCopy(m);
}

}  // namespace amem::bindings
