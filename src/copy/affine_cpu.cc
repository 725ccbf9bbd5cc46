// The CPU loop of affine rows (affine.h). Compiled with -ffp-contract=off (CMakeLists.txt):
// each step rounds once, as JAX's separate operations do, never fused into a multiply-add.
#include "copy/affine.h"
#include "copy/affine_kernel.h"

namespace amem::copy {
namespace {

struct HostRow {
  const char* src;
  char* dst;
  const AffineRow* row;
  const AffineProgram* program;
  const double* constants;

  // `N` elements from element `i` of the row.
  template <typename S, typename D, typename C, int N>
  void Run(const S* in, D* out, int64_t i) {
    C v[N];
    for (int u = 0; u < N; ++u) v[u] = affine_math::Load<C>(in[i + u]);
    affine_kernel::RunSteps<C, N>(v, *program, constants, row->src_element + i);
    for (int u = 0; u < N; ++u) out[i + u] = affine_math::Store<D, C>::Of(v[u]);
  }

  template <typename S, typename D>
  bool Go() {
    using C = typename affine_kernel::ComputeOf<S, D>::type;
    constexpr int kPack = 8;
    const S* in = reinterpret_cast<const S*>(src) + row->src_element;
    D* out = reinterpret_cast<D*>(dst) + row->dst_element;
    int64_t i = 0;
    for (; i + kPack <= row->count; i += kPack) Run<S, D, C, kPack>(in, out, i);
    for (; i < row->count; ++i) Run<S, D, C, 1>(in, out, i);
    return true;
  }
};

}  // namespace

void AffineCopyOnHost(const char* const* sources, char* const* destinations, const AffineRow* rows,
                      int64_t count, const AffineTable& table) {
  for (int64_t i = 0; i < count; ++i) {
    HostRow run{sources[rows[i].src_index], destinations[rows[i].dst_index], &rows[i],
                &table.programs[rows[i].program], table.constants};
    affine_kernel::Dispatch(*run.program, run);
  }
}

}  // namespace amem::copy
