// A minimal error type shared by the C++ core: empty message means success.
// The FFI adapters turn it into ffi::Error, the nanobind layer into exceptions.
#pragma once

#include <string>
#include <utility>

namespace amem {

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return message_.empty(); }
  const std::string& message() const { return message_; }

 private:
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::string message_;
};

}  // namespace amem
