// The buffers of the targets that write into memory XLA does not own, given by address (a
// PyTorch tensor's storage, a buffer opened through CUDA IPC): the source operands, and the
// destinations as the `addresses` and `destination_bytes` attributes. Nothing is donated, so the
// call's one result is a token. The addresses and sizes were checked once where the call was
// made (jax_amem.copy, through copy::CheckDestinations), before the program was built; like the
// row tables, they are part of the program and trusted here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "copy/copy_cuda.h"
#include "ffi/buffers.h"
#include "xla/ffi/api/ffi.h"

namespace amem::ffi_adapter {

struct AddressBuffers {
  std::vector<const char*> sources;
  std::vector<int64_t> source_bytes;
  std::vector<char*> destinations;
  std::vector<int64_t> destination_bytes;

  // As the copy takes them (at most kMaxBuffersPerSide a side: DecodeAddresses checked).
  copy::BufferPointers Pointers() const {
    copy::BufferPointers pointers{};
    for (size_t s = 0; s < sources.size(); ++s) pointers.sources[s] = sources[s];
    for (size_t d = 0; d < destinations.size(); ++d) pointers.destinations[d] = destinations[d];
    return pointers;
  }
};

inline xla::ffi::Error DecodeAddresses(xla::ffi::RemainingArgs args, xla::ffi::Span<const int64_t> addresses,
                                       xla::ffi::Span<const int64_t> destination_bytes, const std::string& target,
                                       AddressBuffers* out) {
  if (addresses.size() != destination_bytes.size()) {
    return xla::ffi::Error::InvalidArgument(target + ": " + std::to_string(addresses.size()) + " addresses but " +
                                            std::to_string(destination_bytes.size()) +
                                            " destination sizes; give one of each per destination");
  }
  for (size_t count : {args.size(), addresses.size()}) {
    if (xla::ffi::Error many = AtMostKernelBuffers(count, target, "buffers on one side"); many.failure()) return many;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<xla::ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    out->sources.push_back(static_cast<const char*>(buffer->untyped_data()));
    out->source_bytes.push_back(static_cast<int64_t>(buffer->size_bytes()));
  }
  for (size_t d = 0; d < addresses.size(); ++d) {
    out->destinations.push_back(reinterpret_cast<char*>(static_cast<uintptr_t>(addresses[d])));
    out->destination_bytes.push_back(destination_bytes[d]);
  }
  return xla::ffi::Error::Success();
}

}  // namespace amem::ffi_adapter
