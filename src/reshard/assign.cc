#include "reshard/assign.h"

#include <algorithm>
#include <map>

namespace amem::reshard {

uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

namespace {

constexpr int64_t kNetwork = -1;  // stream key of the cross-process class

// Cuts a stream's bytes into equal ranges, one per candidate (rotated by `rot`).
void SplitStream(const std::vector<const Item*>& stream, const std::vector<int64_t>& candidates,
                 int64_t rot, int64_t split_bytes, std::vector<Part>* out) {
  using i128 = __int128;
  const int64_t n = static_cast<int64_t>(candidates.size());
  int64_t total = 0;
  for (const Item* it : stream) total += it->bytes;
  auto bound = [&](int64_t k) { return static_cast<int64_t>(static_cast<i128>(k) * total / n); };
  int64_t c = 0;
  for (const Item* it : stream) {
    const int64_t w = it->bytes;
    int axis = -1;
    for (int a = 0; a < kRank; ++a) {
      if (it->region.size[a] > 1) {
        axis = a;
        break;
      }
    }
    if (w < split_bytes || axis < 0) {
      int64_t k = static_cast<int64_t>((static_cast<i128>(2 * c + w) * n) / (2 * static_cast<i128>(total)));
      k = std::min(k, n - 1);
      out->push_back(Part{it, it->region, candidates[(k + rot) % n]});
    } else {
      const int64_t rows = it->region.size[axis];
      const int64_t row = w / rows;
      for (int64_t k = static_cast<int64_t>(static_cast<i128>(c) * n / total); k < n; ++k) {
        const int64_t b0 = bound(k), b1 = bound(k + 1);
        if (b0 >= c + w) break;
        const int64_t lo = std::max(c, b0), hi = std::min(c + w, b1);
        const int64_t r0 = (2 * (lo - c) + row) / (2 * row), r1 = (2 * (hi - c) + row) / (2 * row);
        if (r1 <= r0) continue;
        Part part{it, it->region, candidates[(k + rot) % n]};
        part.region.start[axis] += r0;
        part.region.size[axis] = r1 - r0;
        out->push_back(part);
      }
    }
    c += w;
  }
}

}  // namespace

void AssignReplicas(const Problem& pb, int64_t source, int64_t box, const std::vector<Item>& items,
                    std::vector<Part>* out) {
  const int64_t* reps = pb.rep_owner + pb.rep_begin[box];
  const int64_t num_reps = pb.rep_begin[box + 1] - pb.rep_begin[box];
  if (num_reps == 1) {
    for (const Item& it : items) out->push_back(Part{&it, it.region, reps[0]});
    return;
  }
  std::map<int64_t, std::vector<const Item*>> streams;  // ordered: same order as the reference
  for (const Item& it : items) {
    if (std::binary_search(reps, reps + num_reps, it.receiver)) {
      out->push_back(Part{&it, it.region, it.receiver});
      continue;
    }
    const int64_t process = pb.Process(it.receiver);
    bool near = false;
    for (int64_t i = 0; i < num_reps && !near; ++i) near = pb.Process(reps[i]) == process;
    streams[near ? process : kNetwork].push_back(&it);
  }
  const int64_t local_box = box - pb.box_begin[pb.src_layout[source]];
  for (const auto& [key, stream] : streams) {
    std::vector<int64_t> candidates;
    for (int64_t i = 0; i < num_reps; ++i) {
      if (key == kNetwork || pb.Process(reps[i]) == key) candidates.push_back(reps[i]);
    }
    const uint64_t mix = SplitMix64(static_cast<uint64_t>(source) * 1000003ULL + static_cast<uint64_t>(local_box));
    const int64_t rot = static_cast<int64_t>(mix % candidates.size());
    SplitStream(stream, candidates, rot, pb.split_bytes, out);
  }
}

}  // namespace amem::reshard
