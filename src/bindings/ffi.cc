#include <nanobind/stl/string.h>

#include "bindings/bindings.h"
#include "ffi/segment_copy.h"
#include "ffi/segment_copy_many.h"
#include "ffi/segment_copy_to_addresses.h"
#include "ffi/nccl_recv_bucket.h"
#include "ffi/nccl_send_bucket.h"

namespace nb = nanobind;

namespace amem::bindings {
namespace {

template <typename Handler>
nb::capsule Capsule(Handler* handler) {
  return nb::capsule(reinterpret_cast<void*>(handler));
}

}  // namespace

void BindFfi(nb::module_& root) {
  nb::module_ m = root.def_submodule("ffi", "XLA FFI handlers as capsules");
  m.def(
      "targets",
      [] {
        // name -> {platform: handler capsule}; registered by jax_amem._ffi at import.
        nb::dict targets;
        nb::dict segment_copy;
        segment_copy["cpu"] = Capsule(AmemSegmentCopyCpu);
        segment_copy["CUDA"] = Capsule(AmemSegmentCopyCuda);
        targets["jax_amem_segment_copy"] = segment_copy;
        nb::dict segment_copy_many;
        segment_copy_many["cpu"] = Capsule(AmemSegmentCopyManyCpu);
        segment_copy_many["CUDA"] = Capsule(AmemSegmentCopyManyCuda);
        targets["jax_amem_segment_copy_many"] = segment_copy_many;
        nb::dict to_addresses;
        to_addresses["cpu"] = Capsule(AmemSegmentCopyToAddressesCpu);
        to_addresses["CUDA"] = Capsule(AmemSegmentCopyToAddressesCuda);
        targets["jax_amem_segment_copy_to_addresses"] = to_addresses;
        nb::dict nccl_send_bucket;  // CUDA only: NCCL has no CPU path
        nccl_send_bucket["CUDA"] = Capsule(AmemNcclSendBucketCuda);
        targets["jax_amem_nccl_send_bucket"] = nccl_send_bucket;
        nb::dict nccl_recv_bucket;
        nccl_recv_bucket["CUDA"] = Capsule(AmemNcclRecvBucketCuda);
        targets["jax_amem_nccl_recv_bucket"] = nccl_recv_bucket;
        return targets;
      },
      "The FFI targets this build provides: {name: {platform: capsule}}.");
}

}  // namespace amem::bindings
