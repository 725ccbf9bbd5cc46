#include "reshard/grid_index.h"

#include <algorithm>

#include "reshard/geometry.h"

namespace amem::reshard {

namespace {
constexpr int64_t kMaxCells = int64_t{1} << 22;
}

GridIndex::GridIndex(const Problem& pb, int64_t layout)
    : pb_(pb), first_box_(pb.box_begin[layout]), end_box_(pb.box_begin[layout + 1]) {
  std::vector<int64_t> live;
  for (int64_t b = first_box_; b < end_box_; ++b) {
    if (Volume(pb.LayoutBox(b)) > 0) live.push_back(b);
  }
  int64_t cells = 1;
  for (int a = 0; a < kRank; ++a) {
    std::vector<int64_t>& cuts = cuts_[a];
    for (int64_t b : live) {
      cuts.push_back(pb.box_start[b * kRank + a]);
      cuts.push_back(pb.box_start[b * kRank + a] + pb.box_size[b * kRank + a]);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    cells *= std::max<int64_t>(1, static_cast<int64_t>(cuts.size()) - 1);
    if (cells > kMaxCells) {
      scan_ = true;
      return;
    }
  }
  int64_t stride = 1;
  for (int a = kRank - 1; a >= 0; --a) {
    cell_stride_[a] = stride;
    stride *= std::max<int64_t>(1, static_cast<int64_t>(cuts_[a].size()) - 1);
  }
  if (live.empty()) return;
  cell_box_.assign(cells, -1);
  for (int64_t b : live) {
    // Fill the cells of box b (source boxes tile, so each cell gets one box).
    int64_t lo[kRank], hi[kRank], index[kRank];
    for (int a = 0; a < kRank; ++a) {
      const std::vector<int64_t>& c = cuts_[a];
      lo[a] = std::lower_bound(c.begin(), c.end(), pb.box_start[b * kRank + a]) - c.begin();
      hi[a] = std::lower_bound(c.begin(), c.end(), pb.box_start[b * kRank + a] + pb.box_size[b * kRank + a]) - c.begin();
      index[a] = lo[a];
    }
    while (true) {
      int64_t cell = 0;
      for (int a = 0; a < kRank; ++a) cell += index[a] * cell_stride_[a];
      cell_box_[cell] = b;
      int a = kRank - 1;
      for (; a >= 0; --a) {
        if (++index[a] < hi[a]) break;
        index[a] = lo[a];
      }
      if (a < 0) break;
    }
  }
}

void GridIndex::Query(const Box& query, std::vector<int64_t>* out) const {
  const size_t first = out->size();
  if (scan_ || cell_box_.empty()) {
    for (int64_t b = first_box_; b < end_box_ && scan_; ++b) {
      Box hit;
      if (Volume(pb_.LayoutBox(b)) > 0 && Intersect(query, pb_.LayoutBox(b), &hit)) out->push_back(b);
    }
    return;
  }
  int64_t lo[kRank], hi[kRank], index[kRank];
  for (int a = 0; a < kRank; ++a) {
    const std::vector<int64_t>& c = cuts_[a];
    if (query.size[a] <= 0) return;
    // Cells [lo, hi) meet [start, start + size): the last cut <= start, up to the first cut >= end.
    lo[a] = std::upper_bound(c.begin(), c.end(), query.start[a]) - c.begin() - 1;
    hi[a] = std::lower_bound(c.begin(), c.end(), query.start[a] + query.size[a]) - c.begin();
    lo[a] = std::max<int64_t>(lo[a], 0);
    hi[a] = std::min<int64_t>(hi[a], static_cast<int64_t>(c.size()) - 1);
    if (hi[a] <= lo[a]) return;
    index[a] = lo[a];
  }
  while (true) {
    int64_t cell = 0;
    for (int a = 0; a < kRank; ++a) cell += index[a] * cell_stride_[a];
    if (cell_box_[cell] >= 0) out->push_back(cell_box_[cell]);
    int a = kRank - 1;
    for (; a >= 0; --a) {
      if (++index[a] < hi[a]) break;
      index[a] = lo[a];
    }
    if (a < 0) break;
  }
  std::sort(out->begin() + first, out->end());
  out->erase(std::unique(out->begin() + first, out->end()), out->end());
}

}  // namespace amem::reshard
