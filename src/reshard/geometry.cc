#include "reshard/geometry.h"

#include <algorithm>

namespace amem::reshard {

bool Intersect(const Box& a, const Box& b, Box* out) {
  for (int i = 0; i < kRank; ++i) {
    const int64_t lo = std::max(a.start[i], b.start[i]);
    const int64_t hi = std::min(a.start[i] + a.size[i], b.start[i] + b.size[i]);
    if (hi <= lo) return false;
    out->start[i] = lo;
    out->size[i] = hi - lo;
  }
  return true;
}

int64_t Volume(const Box& box) {
  int64_t v = 1;
  for (int i = 0; i < kRank; ++i) v *= box.size[i];
  return v;
}

namespace {

void RowMajorStrides(const int64_t* shape, int64_t* strides) {
  int64_t step = 1;
  for (int a = kRank - 1; a >= 0; --a) {
    strides[a] = step;
    step *= shape[a];
  }
}

struct Dim {
  int64_t extent, src_stride, dst_stride;
};

}  // namespace

void BoxBlocks(const int64_t* src_shape, const int64_t* src_rel, const int64_t* dst_shape,
               const int64_t* dst_rel, const int64_t* extent, int64_t itemsize,
               std::vector<Block>* out) {
  int64_t ss[kRank], ds[kRank];
  RowMajorStrides(src_shape, ss);
  RowMajorStrides(dst_shape, ds);
  int64_t src_off = 0, dst_off = 0;
  for (int a = 0; a < kRank; ++a) {
    src_off += src_rel[a] * ss[a];
    dst_off += dst_rel[a] * ds[a];
  }
  Dim merged[kRank];  // innermost first
  int count = 0;
  for (int a = kRank - 1; a >= 0; --a) {
    if (extent[a] == 1) continue;
    if (count > 0) {
      Dim& inner = merged[count - 1];
      if (ss[a] == inner.extent * inner.src_stride && ds[a] == inner.extent * inner.dst_stride) {
        inner.extent *= extent[a];
        continue;
      }
    }
    merged[count++] = Dim{extent[a], ss[a], ds[a]};
  }
  int64_t run = 1;
  int first = 0;
  if (count > 0 && merged[0].src_stride == 1 && merged[0].dst_stride == 1) {
    run = merged[0].extent;
    first = 1;
  }
  Dim counts[kRank];
  int n = 0;
  for (int i = first; i < count; ++i) {
    counts[n++] = Dim{merged[i].extent, merged[i].src_stride * itemsize, merged[i].dst_stride * itemsize};
  }
  for (int i = n; i < 2; ++i) counts[i] = Dim{1, 0, 0};
  // Counts beyond two become a loop over blocks, outermost slowest.
  const int outer = std::max(0, n - 2);
  int64_t index[kRank] = {0};
  while (true) {
    Block b;
    b.v[kSrc] = src_off * itemsize;
    b.v[kDst] = dst_off * itemsize;
    for (int i = 0; i < outer; ++i) {
      b.v[kSrc] += index[i] * counts[2 + i].src_stride;
      b.v[kDst] += index[i] * counts[2 + i].dst_stride;
    }
    b.v[kRun] = run * itemsize;
    b.v[kN1] = counts[0].extent;
    b.v[kSs1] = counts[0].src_stride;
    b.v[kDs1] = counts[0].dst_stride;
    b.v[kN0] = counts[1].extent;
    b.v[kSs0] = counts[1].src_stride;
    b.v[kDs0] = counts[1].dst_stride;
    out->push_back(b);
    // Odometer over the outer counts, index[outer-1] (the outermost) slowest.
    int i = 0;
    while (i < outer && ++index[i] == counts[2 + i].extent) index[i++] = 0;
    if (i == outer) break;
  }
}

void Coalesce(std::vector<Block>* blocks) {
  std::vector<Block>& all = *blocks;
  size_t kept = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const Block& b = all[i];
    if (kept > 0) {
      Block& p = all[kept - 1];
      const bool both_flat = p.v[kN0] == 1 && b.v[kN0] == 1;
      if (both_flat && p.v[kN1] == 1 && b.v[kN1] == 1 && p.v[kSrc] + p.v[kRun] == b.v[kSrc] &&
          p.v[kDst] + p.v[kRun] == b.v[kDst]) {
        p.v[kRun] += b.v[kRun];
        continue;
      }
      if (both_flat && p.v[kN1] > 1 && p.v[kRun] == b.v[kRun] &&
          (b.v[kN1] == 1 || (b.v[kSs1] == p.v[kSs1] && b.v[kDs1] == p.v[kDs1])) &&
          b.v[kSrc] == p.v[kSrc] + p.v[kN1] * p.v[kSs1] && b.v[kDst] == p.v[kDst] + p.v[kN1] * p.v[kDs1]) {
        p.v[kN1] += b.v[kN1];
        continue;
      }
    }
    all[kept++] = b;
  }
  all.resize(kept);
}

}  // namespace amem::reshard
