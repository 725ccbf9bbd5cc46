#include <nanobind/ndarray.h>

#include <cstring>
#include <string>
#include <utility>

#include <nanobind/stl/vector.h>

#include "bindings/bindings.h"
#include "copy/copy_cuda.h"
#include "copy/segments.h"

namespace nb = nanobind;

namespace amem::bindings {
namespace {

using SegmentArray = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using OwnedSegmentArray = nb::ndarray<nb::numpy, int64_t, nb::ndim<2>>;

using Int64List = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Rows as an owned (n, 6) int64 numpy array.
OwnedSegmentArray ToNumpy(std::vector<copy::BufferSegment> rows) {
  auto* owned = new std::vector<copy::BufferSegment>(std::move(rows));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<copy::BufferSegment>*>(p); });
  return OwnedSegmentArray(owned->data(), {owned->size(), sizeof(copy::BufferSegment) / sizeof(int64_t)}, owner);
}

// The checks both table functions share: six columns, a piece size the kernel can split at.
const copy::BufferSegment* CheckedRows(const SegmentArray& segments, int64_t max_piece) {
  if (segments.shape(1) != sizeof(copy::BufferSegment) / sizeof(int64_t)) {
    throw nb::value_error("segments must have shape (n, 6): (src_index, dst_index, src_offset, dst_offset, bytes, 0)");
  }
  if (max_piece <= 0 || max_piece % 16 != 0) {
    throw nb::value_error("max_piece must be a positive multiple of 16");
  }
  return reinterpret_cast<const copy::BufferSegment*>(segments.data());
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
  m.attr("MAX_BUFFERS_PER_SIDE") = copy::kMaxBuffersPerSide;
  m.attr("MIN_ADDRESS") = copy::kMinAddress;
  m.attr("ADDRESS_LIMIT") = copy::kAddressLimit;
  m.def(
      "prepare_buffer_segments",
      [](SegmentArray segments, std::vector<int64_t> src_bytes, std::vector<int64_t> dst_bytes,
         int64_t max_piece) {
        const auto* rows = CheckedRows(segments, max_piece);
        const int64_t count = static_cast<int64_t>(segments.shape(0));
        RaiseIfInvalid(copy::ValidateBufferSegments(rows, count, src_bytes, dst_bytes));
        return ToNumpy(copy::SplitBufferSegments(rows, count, max_piece));
      },
      nb::arg("segments"), nb::arg("src_bytes"), nb::arg("dst_bytes"),
      nb::arg("max_piece") = copy::kMaxPieceBytes,
      "Validates rows (src_index, dst_index, src_offset, dst_offset, bytes, 0) against each "
      "buffer's size (in bounds, positive, no two rows writing the same byte of one destination) "
      "and splits long rows into pieces that balance one kernel launch. Raises ValueError naming "
      "the first bad row.");
  m.def(
      "check_destinations",
      [](Int64List addresses, Int64List sizes) {
        if (addresses.shape(0) != sizes.shape(0)) {
          throw nb::value_error("check_destinations: one size per address");
        }
        RaiseIfInvalid(copy::CheckDestinations(addresses.data(), sizes.data(),
                                               static_cast<int64_t>(addresses.shape(0))));
      },
      nb::arg("addresses"), nb::arg("sizes"),
      "The one check of a copy by address's destinations (int64 arrays): sizes not negative, "
      "each non-empty destination's address in [MIN_ADDRESS, ADDRESS_LIMIT). Raises ValueError "
      "naming the first destination at fault.");
  m.def(
      "prepare_address_rows",
      [](SegmentArray segments, std::vector<int64_t> src_bytes, std::vector<int64_t> dst_bytes,
         int64_t bulk_bytes, int64_t max_piece) {
        const auto* rows = CheckedRows(segments, max_piece);
        std::vector<copy::BufferSegment> bulk, pieces;
        RaiseIfInvalid(copy::PrepareAddressRows(rows, static_cast<int64_t>(segments.shape(0)), src_bytes,
                                                dst_bytes, bulk_bytes, max_piece, &bulk, &pieces));
        return nb::make_tuple(ToNumpy(std::move(bulk)), ToNumpy(std::move(pieces)));
      },
      nb::arg("segments"), nb::arg("src_bytes"), nb::arg("dst_bytes"), nb::arg("bulk_bytes"),
      nb::arg("max_piece") = copy::kMaxPieceBytes,
      "The rows of a copy by address, validated once as one table as prepare_buffer_segments "
      "does, then (bulk, pieces): the rows of at least bulk_bytes whole (one driver copy each), "
      "the others split into pieces of at most max_piece (one kernel launch). Raises ValueError "
      "naming the first bad row.");
  BindDirectCopy(m);
}

}  // namespace amem::bindings
