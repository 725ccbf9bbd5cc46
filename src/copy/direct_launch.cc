#include "copy/direct_launch.h"

#include <string>
#include <utility>

#include "copy/affine_cuda.h"
#include "copy/copy_cpu.h"
#include "copy/flush_denormals.h"
#include "cuda/driver_api.h"

namespace amem::copy {
namespace {

std::string ChunkName(size_t chunk) { return "direct copy, chunk " + std::to_string(chunk) + ": "; }

Status Prefixed(const std::string& prefix, const Status& status) {
  return status.ok() ? status : Status::Error(prefix + status.message());
}

// The chunk's affine table as the host holds it.
AffineTable HostAffineTable(const DirectChunk& chunk) {
  return AffineTableAt(chunk.affine_table.data(), static_cast<int64_t>(chunk.affine_table.size() * sizeof(int64_t)),
                       chunk.affine_programs);
}

// A destination written in elements of `item` bytes holds whole ones from its first byte: the
// kernels' element stores at a misaligned address would fault.
Status DestinationAligned(const DirectChunk& chunk, int64_t dst_index, int64_t item, const std::string& row) {
  if (chunk.destinations[dst_index] % item == 0) return Status::Ok();
  return Status::Error(row + ": destination " + std::to_string(dst_index) + " at address " +
                       std::to_string(chunk.destinations[dst_index]) + " is not a multiple of the " +
                       std::to_string(item) + "-byte elements it writes");
}

// The affine rows: their table well formed (the programs it says it holds, each one's dtypes,
// steps and constants), every row naming one of them and inside both buffers, and each
// destination it writes at an address that holds whole elements of the program's dtype.
Status CheckAffineChunk(const DirectChunk& chunk, const std::vector<int64_t>& source_bytes) {
  if (chunk.affines.empty() && chunk.affine_programs == 0) return Status::Ok();
  const int64_t table_bytes = static_cast<int64_t>(chunk.affine_table.size() * sizeof(int64_t));
  if (chunk.affine_programs < 0 ||
      chunk.affine_programs > table_bytes / static_cast<int64_t>(sizeof(AffineProgram))) {
    return Status::Error("affine table of " + std::to_string(table_bytes) + " bytes does not hold its " +
                         std::to_string(chunk.affine_programs) + " programs");
  }
  const AffineTable table = HostAffineTable(chunk);
  if (Status programs = CheckAffineTable(table); !programs.ok()) return programs;
  const auto count = static_cast<int64_t>(chunk.affines.size());
  if (Status rows = CheckAffineRowsInBounds(chunk.affines.data(), count, table, source_bytes, chunk.destination_bytes);
      !rows.ok()) {
    return rows;
  }
  for (int64_t i = 0; i < count; ++i) {
    const AffineRow& row = chunk.affines[i];
    const int64_t item = AffineDtypeBytes(table.programs[row.program].dst_dtype);
    if (Status aligned = DestinationAligned(chunk, row.dst_index, item, "affine row " + std::to_string(i));
        !aligned.ok()) {
      return aligned;
    }
  }
  return Status::Ok();
}

// Slots in range, buffer counts within the kernel's pointer table, addresses that user memory
// can have, and every row (bulk and kernel) inside its buffers.
Status CheckChunk(size_t index, DirectChunk& chunk, const std::vector<int64_t>& source_bytes) {
  const std::string name = ChunkName(index);
  const auto sources = static_cast<int64_t>(source_bytes.size());
  if (chunk.destinations.size() != chunk.destination_bytes.size()) {
    return Status::Error(name + std::to_string(chunk.destinations.size()) + " destinations but " +
                         std::to_string(chunk.destination_bytes.size()) + " sizes");
  }
  std::vector<int64_t> chunk_source_bytes;
  for (int64_t slot : chunk.source_slots) {
    if (slot < 0 || slot >= sources) {
      return Status::Error(name + "source slot " + std::to_string(slot) + " is not one of the " +
                           std::to_string(sources) + " sources");
    }
    chunk_source_bytes.push_back(source_bytes[slot]);
  }
  // The one destination check (segments.h), as the custom calls' callers run it.
  if (Status addresses = CheckDestinations(chunk.destinations.data(), chunk.destination_bytes.data(),
                                           static_cast<int64_t>(chunk.destinations.size()));
      !addresses.ok()) {
    return Prefixed(name, addresses);
  }
  if (Status bulk = CheckBufferSegmentsInBounds(chunk.bulk.data(), static_cast<int64_t>(chunk.bulk.size()),
                                                chunk_source_bytes, chunk.destination_bytes);
      !bulk.ok()) {
    return Prefixed(name + "bulk ", bulk);
  }
  if (Status rows = CheckBufferSegmentsInBounds(chunk.rows.data(), static_cast<int64_t>(chunk.rows.size()),
                                                chunk_source_bytes, chunk.destination_bytes);
      !rows.ok()) {
    return Prefixed(name, rows);
  }
  // The affine table first: transpose rows may name its programs.
  if (Status affine = CheckAffineChunk(chunk, chunk_source_bytes); !affine.ok()) return Prefixed(name, affine);
  if (Status transposes = CheckTransposeRows(chunk.transposes.data(), static_cast<int64_t>(chunk.transposes.size()),
                                             chunk_source_bytes, chunk.destination_bytes, HostAffineTable(chunk),
                                             &chunk.transpose_units);
      !transposes.ok()) {
    return Prefixed(name, transposes);
  }
  for (size_t i = 0; i < chunk.transposes.size(); ++i) {
    const TransposeRow& row = chunk.transposes[i];
    if (Status aligned = DestinationAligned(chunk, row.dst_index, TransposeDestinationItem(row.kind),
                                            "transpose row " + std::to_string(i));
        !aligned.ok()) {
      return Prefixed(name, aligned);
    }
  }
  return Status::Ok();
}

// Whether any of the chunk's transpose rows runs a program (computes, so under XLA:CPU's mode).
bool HasSteppedRows(const DirectChunk& chunk) {
  for (const TransposeRow& row : chunk.transposes) {
    if (row.program >= 0) return true;
  }
  return false;
}

}  // namespace

Status LaunchAddressCopy(CUstream stream, const BufferPointers& pointers, const BufferSegment* bulk,
                         int64_t bulk_count, const BufferSegment* device_rows, int64_t count) {
  if (bulk_count > 0) {
    std::string why;
    const cuda::DriverApi* api = cuda::Driver(&why);
    if (api == nullptr) return Status::Error(why);
    for (int64_t i = 0; i < bulk_count; ++i) {
      const BufferSegment& row = bulk[i];
      Status copied = cuda::Check(
          api->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(pointers.destinations[row.dst_index] + row.dst_offset),
                             reinterpret_cast<CUdeviceptr>(pointers.sources[row.src_index] + row.src_offset),
                             static_cast<size_t>(row.bytes), stream),
          "bulk copy to a destination address");
      if (!copied.ok()) return copied;
    }
  }
  return LaunchBufferSegmentCopy(stream, pointers, device_rows, count);
}

void CopyAddressRowsOnHost(const BufferPointers& pointers, const BufferSegment* bulk, int64_t bulk_count,
                           const BufferSegment* rows, int64_t count) {
  CopyBufferSegmentsOnHost(pointers.sources, pointers.destinations, bulk, bulk_count);
  CopyBufferSegmentsOnHost(pointers.sources, pointers.destinations, rows, count);
}

Status DirectCopy::Make(int device, std::vector<int64_t> source_bytes, std::vector<DirectChunk> chunks,
                        std::unique_ptr<DirectCopy>* out) {
  std::unique_ptr<DirectCopy> made(new DirectCopy());
  made->device_ = device;
  for (int64_t bytes : source_bytes) {
    if (bytes < 0) return Status::Error("direct copy: a source of negative size");
  }
  int64_t rows = 0, transposes = 0, affines = 0, affine_words = 0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (Status checked = CheckChunk(k, chunks[k], source_bytes); !checked.ok()) return checked;
    if (!chunks[k].transposes.empty()) {  // one kernel launch per kind: rows by kind, their units again
      SortTransposeRows(&chunks[k].transposes);
      if (Status again = CheckChunk(k, chunks[k], source_bytes); !again.ok()) return again;
    }
    chunks[k].first_row = rows;
    rows += static_cast<int64_t>(chunks[k].rows.size());
    chunks[k].first_transpose = transposes;
    transposes += static_cast<int64_t>(chunks[k].transposes.size());
    chunks[k].first_affine = affines;
    affines += static_cast<int64_t>(chunks[k].affines.size());
    chunks[k].affine_table_at = affine_words;  // words after the affine rows, made bytes below
    affine_words += static_cast<int64_t>(chunks[k].affine_table.size());
  }
  made->source_bytes_ = std::move(source_bytes);
  made->chunks_ = std::move(chunks);
  made->rows_ = rows;
  if (device >= 0 && rows + transposes + affines > 0) {
    // One table in device memory: the kernel rows, the transpose rows, the affine rows, then
    // the affine tables (every part a whole number of 16 bytes: each row and table aligned).
    std::vector<char> table;
    table.reserve(rows * sizeof(BufferSegment) + transposes * sizeof(TransposeRow) +
                  affines * sizeof(AffineRow) + affine_words * sizeof(int64_t) + 48);
    const auto append = [&table](const void* data, size_t bytes) {
      const auto* from = static_cast<const char*>(data);
      table.insert(table.end(), from, from + bytes);
    };
    const auto align = [&table] { table.resize((table.size() + 15) / 16 * 16); };
    for (const DirectChunk& chunk : made->chunks_) append(chunk.rows.data(), chunk.rows.size() * sizeof(BufferSegment));
    align();
    made->transpose_table_ = static_cast<int64_t>(table.size());
    for (const DirectChunk& chunk : made->chunks_) {
      append(chunk.transposes.data(), chunk.transposes.size() * sizeof(TransposeRow));
    }
    align();
    made->affine_table_ = static_cast<int64_t>(table.size());
    for (const DirectChunk& chunk : made->chunks_) append(chunk.affines.data(), chunk.affines.size() * sizeof(AffineRow));
    align();
    const auto tables = static_cast<int64_t>(table.size());
    for (DirectChunk& chunk : made->chunks_) {
      chunk.affine_table_at = tables + chunk.affine_table_at * static_cast<int64_t>(sizeof(int64_t));
      append(chunk.affine_table.data(), chunk.affine_table.size() * sizeof(int64_t));
    }
    std::string why;
    const cuda::DriverApi* api = cuda::Driver(&why);
    if (api == nullptr) return Status::Error(why);
    cuda::ScopedDeviceContext context(device);
    if (!context.status().ok()) return context.status();
    const size_t bytes = table.size();
    if (Status allocated = cuda::Check(api->cuMemAlloc(&made->table_, bytes), "cuMemAlloc (direct copy rows)");
        !allocated.ok()) {
      made->table_ = 0;
      return allocated;
    }
    // Until then the destructor frees it (with the context current again).
    if (Status uploaded = cuda::Check(api->cuMemcpyHtoD(made->table_, table.data(), bytes),
                                      "cuMemcpyHtoD (direct copy rows)");
        !uploaded.ok()) {
      return uploaded;
    }
  }
  *out = std::move(made);
  return Status::Ok();
}

DirectCopy::~DirectCopy() {
  if (table_ == 0) return;
  const cuda::DriverApi* api = cuda::Driver();
  if (api == nullptr) return;
  cuda::ScopedDeviceContext context(device_);
  if (context.status().ok()) api->cuMemFree(table_);  // at exit the driver may be gone: nothing to do then
}

int64_t DirectCopy::transpose_rows() const {
  int64_t count = 0;
  for (const DirectChunk& chunk : chunks_) count += static_cast<int64_t>(chunk.transposes.size());
  return count;
}

int64_t DirectCopy::stepped_transpose_rows() const {
  int64_t count = 0;
  for (const DirectChunk& chunk : chunks_) {
    for (const TransposeRow& row : chunk.transposes) count += row.program >= 0 ? 1 : 0;
  }
  return count;
}

int64_t DirectCopy::affine_rows() const {
  int64_t count = 0;
  for (const DirectChunk& chunk : chunks_) count += static_cast<int64_t>(chunk.affines.size());
  return count;
}

int64_t DirectCopy::launches() const {
  int64_t count = 0;
  for (const DirectChunk& chunk : chunks_) {
    count += static_cast<int64_t>(chunk.bulk.size()) + (chunk.rows.empty() ? 0 : 1) + (chunk.affines.empty() ? 0 : 1);
    // Transpose rows come sorted by launch (LaunchTransposeRows runs one kernel per run of them).
    for (size_t k = 0; k < chunk.transposes.size(); ++k) {
      count += k == 0 || chunk.transposes[k].launch != chunk.transposes[k - 1].launch ? 1 : 0;
    }
  }
  return count;
}

int64_t DirectCopy::bulk_rows() const {
  int64_t count = 0;
  for (const DirectChunk& chunk : chunks_) count += static_cast<int64_t>(chunk.bulk.size());
  return count;
}

Status DirectCopy::Run(const int64_t* source_pointers, int64_t count, CUstream stream) const {
  if (count != sources()) {
    return Status::Error("direct copy: " + std::to_string(count) + " source addresses for " +
                         std::to_string(sources()) + " sources");
  }
  for (int64_t s = 0; s < count; ++s) {
    if (source_bytes_[s] > 0 && (source_pointers[s] < kMinAddress || source_pointers[s] >= kAddressLimit)) {
      return Status::Error("direct copy: source " + std::to_string(s) + " has address " +
                           std::to_string(source_pointers[s]) + ", which is no memory of this process");
    }
  }
  for (const DirectChunk& chunk : chunks_) {
    BufferPointers pointers{};
    for (size_t s = 0; s < chunk.source_slots.size(); ++s) {
      pointers.sources[s] = reinterpret_cast<const char*>(static_cast<uintptr_t>(source_pointers[chunk.source_slots[s]]));
    }
    for (size_t d = 0; d < chunk.destinations.size(); ++d) {
      pointers.destinations[d] = reinterpret_cast<char*>(static_cast<uintptr_t>(chunk.destinations[d]));
    }
    const auto bulk = static_cast<int64_t>(chunk.bulk.size());
    const auto rows = static_cast<int64_t>(chunk.rows.size());
    const auto transposes = static_cast<int64_t>(chunk.transposes.size());
    const auto affines = static_cast<int64_t>(chunk.affines.size());
    if (device_ < 0) {
      CopyAddressRowsOnHost(pointers, chunk.bulk.data(), bulk, chunk.rows.data(), rows);
      if (affines > 0 || HasSteppedRows(chunk)) {
        const ScopedFlushDenormals as_xla_cpu;  // the custom call's arithmetic (flush_denormals.h)
        CopyTransposeRowsOnHost(pointers.sources, pointers.destinations, chunk.transposes.data(), transposes,
                                HostAffineTable(chunk));
        AffineCopyOnHost(pointers.sources, pointers.destinations, chunk.affines.data(), affines,
                         HostAffineTable(chunk));
      } else {
        CopyTransposeRowsOnHost(pointers.sources, pointers.destinations, chunk.transposes.data(), transposes,
                                HostAffineTable(chunk));
      }
      continue;
    }
    const auto* device_rows = reinterpret_cast<const BufferSegment*>(
        static_cast<uintptr_t>(table_ + chunk.first_row * sizeof(BufferSegment)));
    if (Status launched = LaunchAddressCopy(stream, pointers, chunk.bulk.data(), bulk, device_rows, rows);
        !launched.ok()) {
      return launched;
    }
    // The chunk's programs and constants on the device: the transpose rows' and the affine rows'.
    const AffineTable device_table = AffineTableAt(
        reinterpret_cast<const void*>(static_cast<uintptr_t>(table_ + chunk.affine_table_at)),
        static_cast<int64_t>(chunk.affine_table.size() * sizeof(int64_t)), chunk.affine_programs);
    const auto* device_transposes = reinterpret_cast<const TransposeRow*>(
        static_cast<uintptr_t>(table_ + transpose_table_ + chunk.first_transpose * sizeof(TransposeRow)));
    if (Status launched = LaunchTransposeRows(stream, pointers, chunk.transposes.data(), device_transposes,
                                              transposes, chunk.transpose_units, device_table);
        !launched.ok()) {
      return launched;
    }
    if (affines == 0) continue;
    const auto* device_affines = reinterpret_cast<const AffineRow*>(
        static_cast<uintptr_t>(table_ + affine_table_ + chunk.first_affine * sizeof(AffineRow)));
    if (Status launched = LaunchAffineCopy(stream, pointers, device_affines, affines, device_table); !launched.ok()) {
      return launched;
    }
  }
  return Status::Ok();
}

}  // namespace amem::copy
