// amem::Status -> ffi::Error.
#pragma once

#include "common/status.h"
#include "xla/ffi/api/ffi.h"

namespace amem::ffi_adapter {

inline xla::ffi::Error ToFfiError(const Status& status) {
  if (status.ok()) return xla::ffi::Error::Success();
  return xla::ffi::Error(xla::ffi::ErrorCode::kInvalidArgument, status.message());
}

}  // namespace amem::ffi_adapter
