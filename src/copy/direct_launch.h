// Copies into memory given by address (a PyTorch tensor's storage, a buffer mapped through
// CUDA IPC), launched two ways with the same rows and the same kernel:
// - inside an XLA program, by the custom call segment_copy_to_addresses (src/ffi), on XLA's
//   stream, one call per chunk;
// - outside XLA's dispatch, by a DirectCopy (jax_amem/swapping/in_process/direct.py): an eager
//   swap launches it from here on the stream the destination is read on, with the sources'
//   addresses read from the JAX arrays. Its rows are checked and put on the device once, when
//   it is made; a launch takes only the sources' addresses, which travel with the kernel launch
//   (BufferPointers), so a source that JAX gave a new buffer costs nothing to refresh.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "copy/affine.h"
#include "copy/copy_cuda.h"
#include "copy/segments.h"
#include "copy/transpose.h"
#include "cuda/driver_types.h"

namespace amem::copy {

// What one launch into addressed destinations runs on `stream`: every bulk row (host memory)
// as one cuMemcpyAsync, the driver's own device copy, then the split rows (`device_rows`, in
// device memory) as one kernel launch.
Status LaunchAddressCopy(CUstream stream, const BufferPointers& pointers, const BufferSegment* bulk,
                         int64_t bulk_count, const BufferSegment* device_rows, int64_t count);

// The same on the host: both row sets copied with memcpy.
void CopyAddressRowsOnHost(const BufferPointers& pointers, const BufferSegment* bulk, int64_t bulk_count,
                           const BufferSegment* rows, int64_t count);

// One launch's worth of a DirectCopy: at most kMaxBuffersPerSide sources and destinations.
// Row indices are into this chunk's `source_slots` and `destinations`.
struct DirectChunk {
  std::vector<int64_t> source_slots;       // per source: its position among the launch's pointers
  std::vector<int64_t> destinations;       // addresses
  std::vector<int64_t> destination_bytes;
  std::vector<BufferSegment> bulk;         // rows run as one driver copy each
  std::vector<BufferSegment> rows;         // rows for the kernel, already split into pieces
  std::vector<TransposeRow> transposes;    // rows read through a transposed or cast view (transpose.h)
  std::vector<AffineRow> affines;          // rows through constant steps (affine.h), split into pieces
  std::vector<int64_t> affine_table;       // their programs, then the float64 constants (AffineTableAt)
  int64_t affine_programs = 0;
  int64_t first_row = 0;                   // where `rows` start in the device table
  int64_t first_transpose = 0;             // where `transposes` start in the device table
  int64_t transpose_units = 0;             // their work units (CheckTransposeRows)
  int64_t first_affine = 0;                // where `affines` start in the device table
  int64_t affine_table_at = 0;             // bytes into the device table where `affine_table` lies
};

class DirectCopy {
 public:
  // `device`: the CUDA ordinal the copy runs on, or -1 for host memory (the CPU loop).
  // `source_bytes`: the size of each source, by slot. Checked (the message names the chunk and
  // row): slots and indices in range, at most kMaxBuffersPerSide buffers a side, destination
  // addresses in [kMinAddress, kAddressLimit), every row inside its two buffers (a transpose
  // row: CheckTransposeRows; an affine row: CheckAffineRowsInBounds, its table CheckAffineTable,
  // its destination's address a multiple of the element it writes). The caller
  // validated the rows once (jax_amem.copy: no two rows writing one byte, allocation extents).
  // On CUDA the kernel rows of every chunk go into one device table, uploaded here.
  static Status Make(int device, std::vector<int64_t> source_bytes, std::vector<DirectChunk> chunks,
                     std::unique_ptr<DirectCopy>* out);
  ~DirectCopy();
  DirectCopy(const DirectCopy&) = delete;
  DirectCopy& operator=(const DirectCopy&) = delete;

  int device() const { return device_; }
  int64_t sources() const { return static_cast<int64_t>(source_bytes_.size()); }
  int64_t rows() const { return rows_; }
  int64_t bulk_rows() const;
  int64_t transpose_rows() const;
  int64_t stepped_transpose_rows() const;  // transpose rows that run a program of constant steps
  int64_t affine_rows() const;
  // What one Run enqueues on a GPU: a driver copy per bulk row and, per chunk, one kernel for
  // its split rows, one per conversion of its transpose rows, one for its affine rows.
  int64_t launches() const;

  // Every chunk, in order: on CUDA enqueued on `stream` (the device's context current), on the
  // host copied before returning. `source_pointers`: one address per source slot. Every
  // pointer is checked before the first byte moves.
  Status Run(const int64_t* source_pointers, int64_t count, CUstream stream) const;

 private:
  DirectCopy() = default;
  int device_ = -1;
  std::vector<int64_t> source_bytes_;
  std::vector<DirectChunk> chunks_;
  int64_t rows_ = 0;
  int64_t transpose_table_ = 0;  // bytes into table_ where the transpose rows start
  int64_t affine_table_ = 0;     // bytes into table_ where the affine rows start (their tables after them)
  // Every chunk's kernel rows, then its transpose rows, its affine rows and its affine tables,
  // on the device (CUDA only).
  CUdeviceptr table_ = 0;
};

}  // namespace amem::copy
