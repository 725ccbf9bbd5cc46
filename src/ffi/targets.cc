#include "ffi/target.h"

namespace amem::ffi_adapter {

const std::vector<Target>& Targets() {
  static const auto* table = new std::vector<Target>{
      {"jax_amem_segment_copy_many", segment_copy_many_handlers()},
      {"jax_amem_segment_copy_to_addresses", segment_copy_to_addresses_handlers()},
      {"jax_amem_nccl_send_bucket", nccl_send_bucket_handlers()},
      {"jax_amem_nccl_recv_bucket", nccl_recv_bucket_handlers()},
      {"jax_amem_affine_copy_many", affine_copy_many_handlers()},
      {"jax_amem_affine_copy_to_addresses", affine_copy_to_addresses_handlers()},
  };
  return *table;
}

}  // namespace amem::ffi_adapter
