#include "copy/direct_launch.h"

#include <string>
#include <utility>

#include "copy/copy_cpu.h"
#include "cuda/driver_api.h"

namespace amem::copy {
namespace {

std::string ChunkName(size_t chunk) { return "direct copy, chunk " + std::to_string(chunk) + ": "; }

Status Prefixed(const std::string& prefix, const Status& status) {
  return status.ok() ? status : Status::Error(prefix + status.message());
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
  return Prefixed(name, CheckTransposeRows(chunk.transposes.data(), static_cast<int64_t>(chunk.transposes.size()),
                                           chunk_source_bytes, chunk.destination_bytes, &chunk.transpose_units));
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
  int64_t rows = 0, transposes = 0;
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
  }
  made->source_bytes_ = std::move(source_bytes);
  made->chunks_ = std::move(chunks);
  made->rows_ = rows;
  if (device >= 0 && rows + transposes > 0) {
    // One table in device memory: the kernel rows, then the transpose rows.
    std::vector<char> table;
    table.reserve(rows * sizeof(BufferSegment) + transposes * sizeof(TransposeRow));
    for (const DirectChunk& chunk : made->chunks_) {
      const auto* bytes = reinterpret_cast<const char*>(chunk.rows.data());
      table.insert(table.end(), bytes, bytes + chunk.rows.size() * sizeof(BufferSegment));
    }
    made->transpose_table_ = static_cast<int64_t>(table.size());
    for (const DirectChunk& chunk : made->chunks_) {
      const auto* bytes = reinterpret_cast<const char*>(chunk.transposes.data());
      table.insert(table.end(), bytes, bytes + chunk.transposes.size() * sizeof(TransposeRow));
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
    if (device_ < 0) {
      CopyAddressRowsOnHost(pointers, chunk.bulk.data(), bulk, chunk.rows.data(), rows);
      CopyTransposeRowsOnHost(pointers.sources, pointers.destinations, chunk.transposes.data(), transposes);
      continue;
    }
    const auto* device_rows = reinterpret_cast<const BufferSegment*>(
        static_cast<uintptr_t>(table_ + chunk.first_row * sizeof(BufferSegment)));
    if (Status launched = LaunchAddressCopy(stream, pointers, chunk.bulk.data(), bulk, device_rows, rows);
        !launched.ok()) {
      return launched;
    }
    const auto* device_transposes = reinterpret_cast<const TransposeRow*>(
        static_cast<uintptr_t>(table_ + transpose_table_ + chunk.first_transpose * sizeof(TransposeRow)));
    if (Status launched = LaunchTransposeRows(stream, pointers, chunk.transposes.data(), device_transposes,
                                              transposes, chunk.transpose_units);
        !launched.ok()) {
      return launched;
    }
  }
  return Status::Ok();
}

}  // namespace amem::copy
