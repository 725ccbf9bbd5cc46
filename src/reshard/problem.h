// The planning problem as the Python side lays it out (jax_amem/reshard/problem.py):
// flat int64 arrays, every tensor padded to kRank axes with leading unit axes.
// Non-owning: the arrays belong to the caller for the duration of a call.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace amem::reshard {

constexpr int kRank = 8;
constexpr int kBlockColumns = 9;     // see jax_amem/reshard/blocks.py
constexpr int kTransferColumns = 7;  // src_owner, dst_owner, dst_tensor, view, begin, end, bytes

struct Box {
  int64_t start[kRank];
  int64_t size[kRank];
};

struct Problem {
  const int64_t* owners = nullptr;  // (num_owners, 2): process, device
  int64_t num_owners = 0;
  const int64_t* layout_shape = nullptr;  // (num_layouts, kRank)
  int64_t num_layouts = 0;
  const int64_t* box_begin = nullptr;  // (num_layouts + 1): boxes of layout l
  const int64_t* box_start = nullptr;  // (num_boxes, kRank)
  const int64_t* box_size = nullptr;   // (num_boxes, kRank)
  int64_t num_boxes = 0;
  const int64_t* rep_begin = nullptr;  // (num_boxes + 1): owners holding box b
  const int64_t* rep_owner = nullptr;  // owner ids, ascending within a box
  int64_t num_reps = 0;
  const int64_t* src_layout = nullptr;  // (num_src)
  int64_t num_src = 0;
  const int64_t* dst_layout = nullptr;    // (num_dst)
  const int64_t* dst_itemsize = nullptr;  // (num_dst)
  int64_t num_dst = 0;
  const int64_t* view_src = nullptr;       // (num_views)
  const int64_t* view_perm = nullptr;      // (num_views, kRank): numpy transpose order
  const int64_t* view_itemsize = nullptr;  // (num_views)
  int64_t num_views = 0;
  const int64_t* piece_dst = nullptr;        // (num_pieces)
  const int64_t* piece_view = nullptr;       // (num_pieces)
  const int64_t* piece_dst_start = nullptr;  // (num_pieces, kRank)
  const int64_t* piece_src_start = nullptr;  // (num_pieces, kRank), in view coordinates
  const int64_t* piece_size = nullptr;       // (num_pieces, kRank)
  int64_t num_pieces = 0;
  int64_t split_bytes = 1 << 20;

  Box LayoutBox(int64_t box) const;
  Box ViewBox(int64_t view, int64_t box) const;  // a source box after the view's permutation
  int64_t Process(int64_t owner) const { return owners[2 * owner]; }
};

// Checks every id and index against the array sizes, so that planning never
// reads out of bounds whatever Python hands over. Names the first bad entry.
Status Validate(const Problem& problem);

struct PlanTables {
  std::vector<int64_t> transfers;  // kTransferColumns per row
  std::vector<int64_t> blocks;     // kBlockColumns per row
};

// The global plan (owner < 0) or the part of it that `owner` sends or receives,
// computed without the rest. Same rows, same order, as the reference planner.
Status Plan(const Problem& problem, int64_t owner, PlanTables* out);

}  // namespace amem::reshard
