// One kernel launch runs every row of an affine table (affine.h) on the GPU.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "copy/affine.h"
#include "copy/copy_cuda.h"
#include "cuda/driver_types.h"

namespace amem::copy {

// Enqueues the rows on `stream`. `device_rows` and `device_table` point to device memory,
// checked on the host when they were built; the kernel skips a row naming a program, buffer
// or constant that does not exist (never a fault), and trusts the element ranges.
Status LaunchAffineCopy(CUstream stream, const BufferPointers& pointers, const AffineRow* device_rows,
                        int64_t count, const AffineTable& device_table);

}  // namespace amem::copy
