// The planner: items per (source tensor, source box), replica choice, blocks,
// transfers. Follows jax_amem/reshard/reference.py step by step; see its
// module docstring for the algorithm.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>

#include "reshard/assign.h"
#include "reshard/geometry.h"
#include "reshard/grid_index.h"
#include "reshard/problem.h"

namespace amem::reshard {
namespace {

struct Record {
  int64_t sender, receiver, dst_tensor, view;
  Block block;
};

bool RecordLess(const Record& a, const Record& b) {
  if (a.sender != b.sender) return a.sender < b.sender;
  if (a.receiver != b.receiver) return a.receiver < b.receiver;
  if (a.dst_tensor != b.dst_tensor) return a.dst_tensor < b.dst_tensor;
  if (a.view != b.view) return a.view < b.view;
  if (a.block.v[kDst] != b.block.v[kDst]) return a.block.v[kDst] < b.block.v[kDst];
  return a.block.v[kSrc] < b.block.v[kSrc];
}

Box PieceBox(const int64_t* start, const int64_t* size) {
  Box box;
  std::copy(start, start + kRank, box.start);
  std::copy(size, size + kRank, box.size);
  return box;
}

class Planner {
 public:
  Planner(const Problem& pb, int64_t owner) : pb_(pb), owner_(owner), grids_(pb.num_layouts) {
    pieces_of_src_.resize(pb.num_src);
    pieces_of_dst_.resize(pb.num_dst);
    for (int64_t p = 0; p < pb.num_pieces; ++p) {
      pieces_of_src_[pb.view_src[pb.piece_view[p]]].push_back(p);
      pieces_of_dst_[pb.piece_dst[p]].push_back(p);
    }
  }

  void Run(PlanTables* out) {
    if (owner_ < 0) {
      for (int64_t s = 0; s < pb_.num_src; ++s) {
        const int64_t layout = pb_.src_layout[s];
        for (int64_t b = pb_.box_begin[layout]; b < pb_.box_begin[layout + 1]; ++b) Unit(s, b);
      }
    } else {
      SenderSide();
      ReceiverSide();
    }
    Emit(out);
  }

 private:
  bool HoldsBox(int64_t box, int64_t owner) const {
    const int64_t* reps = pb_.rep_owner + pb_.rep_begin[box];
    return std::binary_search(reps, reps + (pb_.rep_begin[box + 1] - pb_.rep_begin[box]), owner);
  }
  int64_t NumReplicas(int64_t box) const { return pb_.rep_begin[box + 1] - pb_.rep_begin[box]; }

  // Items of piece p inside source box `box`, for every destination owner, in item order.
  void PieceItems(int64_t p, int64_t box, std::vector<Item>* items) const {
    const int64_t v = pb_.piece_view[p], d = pb_.piece_dst[p];
    Box src_region = PieceBox(pb_.piece_src_start + p * kRank, pb_.piece_size + p * kRank);
    Box hit;
    if (!Intersect(src_region, pb_.ViewBox(v, box), &hit)) return;
    for (int a = 0; a < kRank; ++a) {
      hit.start[a] += pb_.piece_dst_start[p * kRank + a] - pb_.piece_src_start[p * kRank + a];
    }
    const int64_t layout = pb_.dst_layout[d];
    for (int64_t e = pb_.box_begin[layout]; e < pb_.box_begin[layout + 1]; ++e) {
      Box sub;
      if (!Intersect(hit, pb_.LayoutBox(e), &sub)) continue;
      const int64_t bytes = Volume(sub) * pb_.dst_itemsize[d];
      for (int64_t r = pb_.rep_begin[e]; r < pb_.rep_begin[e + 1]; ++r) {
        items->push_back(Item{p, e, pb_.rep_owner[r], sub, bytes});
      }
    }
  }

  // Every item of (source s, box b), replicas chosen; keeps the records in scope.
  void Unit(int64_t s, int64_t b) {
    if (!done_.insert(s * pb_.num_boxes + b).second) return;
    std::vector<Item> items;
    for (int64_t p : pieces_of_src_[s]) PieceItems(p, b, &items);
    if (items.empty()) return;
    std::vector<Part> parts;
    AssignReplicas(pb_, s, b, items, &parts);
    for (const Part& part : parts) {
      if (owner_ < 0 || part.sender == owner_ || part.item->receiver == owner_) AddRecord(part, b);
    }
  }

  void AddRecord(const Part& part, int64_t box) {
    const Item& it = *part.item;
    const int64_t p = it.piece, v = pb_.piece_view[p], e = it.dst_box;
    const Box source = pb_.ViewBox(v, box);
    const Box dst = pb_.LayoutBox(e);
    int64_t src_rel[kRank], dst_rel[kRank];
    for (int a = 0; a < kRank; ++a) {
      const int64_t src_pos = part.region.start[a] - pb_.piece_dst_start[p * kRank + a] +
                              pb_.piece_src_start[p * kRank + a];
      src_rel[a] = src_pos - source.start[a];
      dst_rel[a] = part.region.start[a] - dst.start[a];
    }
    scratch_.clear();
    BoxBlocks(source.size, src_rel, dst.size, dst_rel, part.region.size, pb_.view_itemsize[v], &scratch_);
    for (const Block& block : scratch_) {
      records_.push_back(Record{part.sender, it.receiver, pb_.piece_dst[p], v, block});
    }
  }

  // Units where this owner holds a replica: all it sends (and receives from them).
  void SenderSide() {
    for (int64_t s = 0; s < pb_.num_src; ++s) {
      const int64_t layout = pb_.src_layout[s];
      for (int64_t b = pb_.box_begin[layout]; b < pb_.box_begin[layout + 1]; ++b) {
        if (HoldsBox(b, owner_)) Unit(s, b);
      }
    }
  }

  // What this owner receives from boxes it does not hold.
  void ReceiverSide() {
    for (int64_t d = 0; d < pb_.num_dst; ++d) {
      const int64_t layout = pb_.dst_layout[d];
      int64_t mine = -1;
      for (int64_t e = pb_.box_begin[layout]; e < pb_.box_begin[layout + 1] && mine < 0; ++e) {
        if (HoldsBox(e, owner_)) mine = e;
      }
      if (mine < 0) continue;
      const Box my_box = pb_.LayoutBox(mine);
      for (int64_t p : pieces_of_dst_[d]) {
        Box region;
        if (!Intersect(PieceBox(pb_.piece_dst_start + p * kRank, pb_.piece_size + p * kRank), my_box, &region)) {
          continue;
        }
        const int64_t v = pb_.piece_view[p], s = pb_.view_src[v];
        // The region in the source's own coordinates (undo the view's permutation).
        Box src_region;
        const int64_t* perm = pb_.view_perm + v * kRank;
        for (int a = 0; a < kRank; ++a) {
          src_region.start[perm[a]] = region.start[a] - pb_.piece_dst_start[p * kRank + a] +
                                      pb_.piece_src_start[p * kRank + a];
          src_region.size[perm[a]] = region.size[a];
        }
        hits_.clear();
        Grid(pb_.src_layout[s]).Query(src_region, &hits_);
        for (int64_t b : hits_) {
          if (HoldsBox(b, owner_)) continue;  // handled on the sender side
          if (NumReplicas(b) > 1) {
            Unit(s, b);
            continue;
          }
          std::vector<Item> items;  // one sender: the item goes to it, no stream needed
          PieceItemsFor(p, b, mine, &items);
          for (const Item& it : items) AddRecord(Part{&it, it.region, pb_.rep_owner[pb_.rep_begin[b]]}, b);
        }
      }
    }
  }

  // PieceItems restricted to destination box e and this owner.
  void PieceItemsFor(int64_t p, int64_t box, int64_t e, std::vector<Item>* items) const {
    const int64_t v = pb_.piece_view[p], d = pb_.piece_dst[p];
    Box hit;
    if (!Intersect(PieceBox(pb_.piece_src_start + p * kRank, pb_.piece_size + p * kRank), pb_.ViewBox(v, box), &hit)) {
      return;
    }
    for (int a = 0; a < kRank; ++a) {
      hit.start[a] += pb_.piece_dst_start[p * kRank + a] - pb_.piece_src_start[p * kRank + a];
    }
    Box sub;
    if (!Intersect(hit, pb_.LayoutBox(e), &sub)) return;
    items->push_back(Item{p, e, owner_, sub, Volume(sub) * pb_.dst_itemsize[d]});
  }

  const GridIndex& Grid(int64_t layout) {
    if (!grids_[layout]) grids_[layout] = std::make_unique<GridIndex>(pb_, layout);
    return *grids_[layout];
  }

  // Sorts records by (sender, receiver, tensor, view, dst offset). Packs the key into two
  // words when the ids fit (sorting 24-byte keys, then gathering, beats sorting records).
  void SortRecords() {
    const bool packable = pb_.num_owners <= (int64_t{1} << 20) && pb_.num_dst <= (int64_t{1} << 24) &&
                          pb_.num_views <= (int64_t{1} << 20) && records_.size() < (size_t{1} << 32);
    bool offsets_fit = true;
    for (const Record& r : records_) offsets_fit &= r.block.v[kDst] < (int64_t{1} << 44);
    if (!packable || !offsets_fit) {
      std::sort(records_.begin(), records_.end(), RecordLess);
      return;
    }
    struct Key {
      uint64_t hi, lo;
      uint32_t index;
    };
    std::vector<Key> keys(records_.size());
    for (size_t i = 0; i < records_.size(); ++i) {
      const Record& r = records_[i];
      keys[i] = Key{(static_cast<uint64_t>(r.sender) << 44) | (static_cast<uint64_t>(r.receiver) << 24) |
                        static_cast<uint64_t>(r.dst_tensor),
                    (static_cast<uint64_t>(r.view) << 44) | static_cast<uint64_t>(r.block.v[kDst]),
                    static_cast<uint32_t>(i)};
    }
    std::sort(keys.begin(), keys.end(),
              [](const Key& a, const Key& b) { return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo; });
    std::vector<Record> sorted;
    sorted.reserve(records_.size());
    for (const Key& k : keys) sorted.push_back(records_[k.index]);
    records_.swap(sorted);
  }

  void Emit(PlanTables* out) {
    SortRecords();
    out->transfers.clear();
    out->blocks.clear();
    std::vector<Block> group;
    size_t i = 0;
    int64_t emitted = 0;
    while (i < records_.size()) {
      size_t j = i;
      group.clear();
      while (j < records_.size() && records_[j].sender == records_[i].sender &&
             records_[j].receiver == records_[i].receiver && records_[j].dst_tensor == records_[i].dst_tensor &&
             records_[j].view == records_[i].view) {
        group.push_back(records_[j++].block);
      }
      Coalesce(&group);
      int64_t bytes = 0;
      for (const Block& b : group) {
        bytes += b.v[kRun] * b.v[kN1] * b.v[kN0];
        out->blocks.insert(out->blocks.end(), b.v, b.v + kBlockColumns);
      }
      const Record& r = records_[i];
      const int64_t row[kTransferColumns] = {r.sender, r.receiver, r.dst_tensor, r.view, emitted,
                                             emitted + static_cast<int64_t>(group.size()), bytes};
      out->transfers.insert(out->transfers.end(), row, row + kTransferColumns);
      emitted += static_cast<int64_t>(group.size());
      i = j;
    }
    records_.clear();
    records_.shrink_to_fit();
  }

  const Problem& pb_;
  const int64_t owner_;
  std::vector<std::vector<int64_t>> pieces_of_src_, pieces_of_dst_;
  std::vector<std::unique_ptr<GridIndex>> grids_;
  std::unordered_set<int64_t> done_;
  std::vector<Record> records_;
  std::vector<Block> scratch_;
  std::vector<int64_t> hits_;
};

}  // namespace

Status Plan(const Problem& problem, int64_t owner, PlanTables* out) {
  Status valid = Validate(problem);
  if (!valid.ok()) return valid;
  if (owner >= problem.num_owners) {
    return Status::Error("owner id " + std::to_string(owner) + " is out of range (" +
                         std::to_string(problem.num_owners) + " owners)");
  }
  Planner(problem, owner).Run(out);
  return Status::Ok();
}

}  // namespace amem::reshard
