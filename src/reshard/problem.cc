#include "reshard/problem.h"

#include <string>

namespace amem::reshard {

Box Problem::LayoutBox(int64_t box) const {
  Box out;
  for (int a = 0; a < kRank; ++a) {
    out.start[a] = box_start[box * kRank + a];
    out.size[a] = box_size[box * kRank + a];
  }
  return out;
}

Box Problem::ViewBox(int64_t view, int64_t box) const {
  Box out;
  const int64_t* perm = view_perm + view * kRank;
  for (int a = 0; a < kRank; ++a) {
    out.start[a] = box_start[box * kRank + perm[a]];
    out.size[a] = box_size[box * kRank + perm[a]];
  }
  return out;
}

namespace {

Status Bad(const std::string& what, int64_t row) {
  return Status::Error("reshard problem: " + what + " (row " + std::to_string(row) +
                       "); the arrays must come from jax_amem.reshard.Problem");
}

bool In(int64_t v, int64_t n) { return v >= 0 && v < n; }

}  // namespace

Status Validate(const Problem& pb) {
  for (int64_t l = 0; l < pb.num_layouts; ++l) {
    if (pb.box_begin[l] > pb.box_begin[l + 1] || !In(pb.box_begin[l], pb.num_boxes + 1) ||
        pb.box_begin[l + 1] > pb.num_boxes) {
      return Bad("box_begin is not a range of boxes", l);
    }
  }
  if (pb.num_layouts > 0 && pb.box_begin[pb.num_layouts] != pb.num_boxes) return Bad("box_begin does not end at the box count", pb.num_layouts);
  for (int64_t b = 0; b < pb.num_boxes; ++b) {
    if (pb.rep_begin[b] > pb.rep_begin[b + 1] || pb.rep_begin[b + 1] > pb.num_reps) return Bad("rep_begin out of range", b);
    for (int64_t r = pb.rep_begin[b]; r < pb.rep_begin[b + 1]; ++r) {
      if (!In(pb.rep_owner[r], pb.num_owners)) return Bad("rep_owner names a missing owner", r);
      if (r > pb.rep_begin[b] && pb.rep_owner[r] <= pb.rep_owner[r - 1]) return Bad("replicas not ascending", r);
    }
    for (int a = 0; a < kRank; ++a) {
      if (pb.box_start[b * kRank + a] < 0 || pb.box_size[b * kRank + a] < 0) return Bad("negative box", b);
    }
  }
  for (int64_t s = 0; s < pb.num_src; ++s) {
    if (!In(pb.src_layout[s], pb.num_layouts)) return Bad("src_layout out of range", s);
  }
  for (int64_t d = 0; d < pb.num_dst; ++d) {
    if (!In(pb.dst_layout[d], pb.num_layouts)) return Bad("dst_layout out of range", d);
    if (pb.dst_itemsize[d] <= 0) return Bad("dst_itemsize must be positive", d);
  }
  for (int64_t v = 0; v < pb.num_views; ++v) {
    if (!In(pb.view_src[v], pb.num_src)) return Bad("view_src out of range", v);
    if (pb.view_itemsize[v] <= 0) return Bad("view_itemsize must be positive", v);
    bool seen[kRank] = {false};
    for (int a = 0; a < kRank; ++a) {
      const int64_t p = pb.view_perm[v * kRank + a];
      if (!In(p, kRank) || seen[p]) return Bad("view_perm is not a permutation", v);
      seen[p] = true;
    }
  }
  for (int64_t p = 0; p < pb.num_pieces; ++p) {
    if (!In(pb.piece_dst[p], pb.num_dst)) return Bad("piece_dst out of range", p);
    if (!In(pb.piece_view[p], pb.num_views)) return Bad("piece_view out of range", p);
    if (pb.view_itemsize[pb.piece_view[p]] != pb.dst_itemsize[pb.piece_dst[p]]) {
      return Bad("a piece's view and destination differ in item size", p);
    }
    for (int a = 0; a < kRank; ++a) {
      if (pb.piece_size[p * kRank + a] < 0) return Bad("negative piece size", p);
    }
  }
  return Status::Ok();
}

}  // namespace amem::reshard
