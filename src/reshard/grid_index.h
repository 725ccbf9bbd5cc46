// Finds the boxes of a layout that meet a query box, in time proportional to
// the answer: the boxes' boundaries cut each axis into intervals, and every
// cell of that grid knows its box. Falls back to a scan for layouts whose grid
// would be too large (explicit boxes with many unaligned boundaries).
#pragma once

#include <cstdint>
#include <vector>

#include "reshard/problem.h"

namespace amem::reshard {

class GridIndex {
 public:
  GridIndex(const Problem& problem, int64_t layout);
  // Appends the ids of the non-empty boxes meeting `query`, ascending.
  void Query(const Box& query, std::vector<int64_t>* out) const;

 private:
  const Problem& pb_;
  int64_t first_box_, end_box_;
  bool scan_ = false;
  std::vector<int64_t> cuts_[kRank];
  int64_t cell_stride_[kRank];
  std::vector<int64_t> cell_box_;
};

}  // namespace amem::reshard
