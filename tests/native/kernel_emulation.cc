// Each CUDA kernel of src/copy, run on CPU threads by the emulation (cuda_emulation.h), against
// the CPU loop the same rows run in on the CPU path, on random tables: the segment copy, the
// affine copy (constant steps) and the fused transpose-and-cast copy (plain and with programs).
// Every destination byte is compared: those the rows write element by element (equal bits, or
// NaN on both sides: the conversions may quiet a NaN differently), the others unchanged.
//
//   kernel_emulation [CASES] [SEED] [SUITE]      exit status 0: every case equal
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "copy/affine.h"
#include "copy/affine_cuda.h"
#include "copy/copy_cpu.h"
#include "copy/copy_cuda.h"
#include "copy/direct_launch.h"
#include "copy/segments.h"
#include "copy/transpose.h"

namespace amem::copy {
namespace {

using Bytes = std::vector<unsigned char>;

std::mt19937_64 random_engine;

int64_t Uniform(int64_t low, int64_t high) {  // [low, high]
  return std::uniform_int_distribution<int64_t>(low, high)(random_engine);
}

// A float32 worth testing: ordinary values of every magnitude, and the edges of the narrow
// types (their overflow, their subnormals), signed zeros, infinities, NaN.
float Value() {
  static const float kSpecial[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, -65536.0f,
                                   6.0e-8f, -3.0e-8f, 1.0e-40f, 3.3895e38f, 1.0f, -1.0f, 0.5f};
  if (Uniform(0, 9) == 0) return kSpecial[Uniform(0, std::size(kSpecial) - 1)];
  const double magnitude = std::ldexp(std::uniform_real_distribution<double>(1.0, 2.0)(random_engine),
                                      static_cast<int>(Uniform(-30, 30)));
  return static_cast<float>(Uniform(0, 1) ? magnitude : -magnitude);
}

// `bytes` bytes of elements of `item` bytes (4: float32, 2: bfloat16 or float16 bits, 8: double).
Bytes Elements(int64_t bytes, int64_t item) {
  Bytes out(static_cast<size_t>(bytes));
  for (int64_t at = 0; at + item <= bytes; at += item) {
    const float v = Value();
    if (item == 4) {
      std::memcpy(&out[at], &v, 4);
    } else if (item == 8) {
      const double d = v;
      std::memcpy(&out[at], &d, 8);
    } else {
      const auto bits = static_cast<uint16_t>(Uniform(0, 0xffff));
      std::memcpy(&out[at], &bits, 2);
    }
  }
  return out;
}

Bytes Noise(int64_t bytes) {
  Bytes out(static_cast<size_t>(bytes));
  for (auto& b : out) b = static_cast<unsigned char>(Uniform(0, 255));
  return out;
}

// A run of destination bytes the rows write: compared element by element.
struct Written {
  int64_t buffer, offset, bytes, dtype;  // dtype: AffineDtype, or -1 for raw bytes
};

bool IsNan(const unsigned char* p, int64_t dtype) {
  if (dtype == kAffineF32) {
    float v;
    std::memcpy(&v, p, 4);
    return std::isnan(v);
  }
  if (dtype == kAffineF64) {
    double v;
    std::memcpy(&v, p, 8);
    return std::isnan(v);
  }
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return dtype == kAffineBf16 ? (bits & 0x7fff) > 0x7f80 : (bits & 0x7fff) > 0x7c00;
}

// The first difference between the two runs' destinations, or "".
std::string Compare(const std::vector<Bytes>& loop, const std::vector<Bytes>& kernel, const std::vector<Written>& runs) {
  std::vector<std::vector<int64_t>> dtype_at(loop.size());
  for (size_t b = 0; b < loop.size(); ++b) dtype_at[b].assign(loop[b].size(), -2);  // -2: not written
  for (const Written& run : runs) {
    for (int64_t k = 0; k < run.bytes; ++k) dtype_at[run.buffer][run.offset + k] = run.dtype;
  }
  for (size_t b = 0; b < loop.size(); ++b) {
    for (size_t k = 0; k < loop[b].size();) {
      const int64_t dtype = dtype_at[b][k];
      const int64_t item = dtype < 0 ? 1 : AffineDtypeBytes(dtype);
      const bool same = std::memcmp(&loop[b][k], &kernel[b][k], item) == 0 ||
                        (dtype >= 0 && IsNan(&loop[b][k], dtype) && IsNan(&kernel[b][k], dtype));
      if (!same) {
        return "destination " + std::to_string(b) + " byte " + std::to_string(k) +
               (dtype == -2 ? " (not written by any row)" : " (dtype " + std::to_string(dtype) + ")") +
               ": loop " + std::to_string(loop[b][k]) + ", kernel " + std::to_string(kernel[b][k]);
      }
      k += item;
    }
  }
  return "";
}

struct Buffers {
  std::vector<Bytes> sources, destinations;

  BufferPointers Pointers(std::vector<Bytes>* into) const {
    BufferPointers pointers{};
    for (size_t s = 0; s < sources.size(); ++s) pointers.sources[s] = reinterpret_cast<const char*>(sources[s].data());
    for (size_t d = 0; d < into->size(); ++d) pointers.destinations[d] = reinterpret_cast<char*>((*into)[d].data());
    return pointers;
  }
  std::vector<int64_t> SourceBytes() const { return Sizes(sources); }
  std::vector<int64_t> DestinationBytes() const { return Sizes(destinations); }
  static std::vector<int64_t> Sizes(const std::vector<Bytes>& buffers) {
    std::vector<int64_t> out;
    for (const Bytes& b : buffers) out.push_back(static_cast<int64_t>(b.size()));
    return out;
  }
  std::vector<const char*> SourceList() const {
    std::vector<const char*> out;
    for (const Bytes& b : sources) out.push_back(reinterpret_cast<const char*>(b.data()));
    return out;
  }
  static std::vector<char*> List(std::vector<Bytes>* buffers) {
    std::vector<char*> out;
    for (Bytes& b : *buffers) out.push_back(reinterpret_cast<char*>(b.data()));
    return out;
  }
};

bool Check(const Status& status, const char* what) {
  if (status.ok()) return true;
  std::printf("FAIL %s: %s\n", what, status.message().c_str());
  return false;
}

// ---------------------------------------------------------------------------- programs

// Programs and their constants, laid out as one table (AffineTableAt's layout).
struct Programs {
  std::vector<AffineProgram> programs;
  std::vector<double> constants;

  AffineTable Table() const {
    return AffineTable{programs.data(), static_cast<int64_t>(programs.size()), constants.data(),
                       static_cast<int64_t>(constants.size())};
  }

  // A random program from `src` to `dst` (AffineDtype codes): 1 to 3 steps, scalars and vectors;
  // one in four a lone scale with no rounding of its own (a query scale: the kernels' fast forms).
  int64_t Add(int64_t src, int64_t dst) {
    AffineProgram program{};
    program.src_dtype = src;
    program.dst_dtype = dst;
    program.wide = (src == kAffineF64 || dst == kAffineF64) ? 1 : 0;
    const bool scale = Uniform(0, 3) == 0;
    program.steps = scale ? 1 : Uniform(1, 3);
    for (int64_t k = 0; k < program.steps; ++k) {
      AffineStep& step = program.step[k];
      step.op = scale ? kAffineMul : Uniform(kAffineMul, kAffineRsub);
      step.dtype = program.wide ? Uniform(0, 3) : Uniform(0, 2);
      step.rounding = scale ? 0 : Uniform(0, kRoundInput | kRoundResult);
      const bool vector = !scale && Uniform(0, 2) == 0;
      step.stride = vector ? (Uniform(0, 1) ? 1 : Uniform(2, 100)) : 0;
      step.extent = vector ? Uniform(1, 9) : 1;
      step.constant = static_cast<int64_t>(constants.size());
      for (int64_t c = 0; c < step.extent; ++c) {
        // Mostly small and exact, as scales and offsets are; sometimes anything, zero included.
        constants.push_back(Uniform(0, 4) ? std::ldexp(static_cast<double>(Uniform(-8, 8)), -static_cast<int>(Uniform(0, 4)))
                                          : static_cast<double>(Value()));
      }
    }
    programs.push_back(program);
    return static_cast<int64_t>(programs.size()) - 1;
  }
};

int64_t KindSource(int64_t kind) {  // AffineDtype of a kind's source elements (16-bit: bf16 or f16 at random)
  switch (kind) {
    case kTransposeCopy4: case kTransposeF32ToBF16: case kTransposeF32ToF16: return kAffineF32;
    case kTransposeBF16ToF32: return kAffineBf16;
    case kTransposeF16ToF32: return kAffineF16;
    default: return Uniform(0, 1) ? kAffineBf16 : kAffineF16;
  }
}

int64_t KindDestination(int64_t kind, int64_t source) {
  switch (kind) {
    case kTransposeCopy2: return source;
    case kTransposeF32ToBF16: return kAffineBf16;
    case kTransposeF32ToF16: return kAffineF16;
    default: return kAffineF32;
  }
}

// ---------------------------------------------------------------------------- scenes

// Sources and destinations, and the rows of each kind written into them: each kind of row gets
// destinations of its own, written left to right, so no two rows write one byte.
struct Scene {
  Buffers buffers;
  std::vector<Written> runs;
  Programs programs;
  std::vector<BufferSegment> segments, bulk;
  std::vector<AffineRow> affines;
  std::vector<TransposeRow> transposes;

  int64_t AddSource(Bytes bytes) {
    buffers.sources.push_back(std::move(bytes));
    return static_cast<int64_t>(buffers.sources.size()) - 1;
  }
  int64_t AddDestination(Bytes bytes) {
    buffers.destinations.push_back(std::move(bytes));
    return static_cast<int64_t>(buffers.destinations.size()) - 1;
  }

  // Byte rows (the segment copy's), into two destinations of their own.
  void AddSegments(std::vector<BufferSegment>* into, int64_t count, int64_t max_bytes) {
    std::vector<int64_t> srcs, dsts, next;
    for (int k = 0; k < 2; ++k) srcs.push_back(AddSource(Noise(Uniform(1, 300000))));
    for (int k = 0; k < 2; ++k) dsts.push_back(AddDestination(Noise(Uniform(1, 300000))));
    next.assign(2, 0);
    for (int64_t k = 0; k < count; ++k) {
      const int64_t s = Uniform(0, 1), d = Uniform(0, 1), src = srcs[s], dst = dsts[d];
      const auto src_size = static_cast<int64_t>(buffers.sources[src].size());
      const auto dst_size = static_cast<int64_t>(buffers.destinations[dst].size());
      const int64_t dst_offset = next[d] + Uniform(0, 17);
      if (dst_offset >= dst_size) continue;
      const int64_t bytes = Uniform(1, std::min({src_size, dst_size - dst_offset, max_bytes}));
      into->push_back({src, dst, Uniform(0, src_size - bytes), dst_offset, bytes, 0});
      runs.push_back({dst, dst_offset, bytes, -1});
      next[d] = dst_offset + bytes;
    }
  }

  // Rows through random programs, between sources and destinations of random dtypes.
  void AddAffines(int64_t count) {
    std::vector<int64_t> srcs, dsts, source_dtype, destination_dtype, next;
    // Half the cases have a bfloat16 -> bfloat16 pair (buffers 0), as a bf16 trainer's scaled query has.
    const bool bf16_pair = Uniform(0, 1) == 0;
    for (int k = 0; k < 3; ++k) {
      source_dtype.push_back(k == 0 && bf16_pair ? kAffineBf16 : Uniform(0, 3));
      const int64_t item = AffineDtypeBytes(source_dtype.back());
      srcs.push_back(AddSource(Elements(item * Uniform(1, 150000), item)));
      destination_dtype.push_back(k == 0 && bf16_pair ? kAffineBf16 : Uniform(0, 3));
      dsts.push_back(AddDestination(Noise(AffineDtypeBytes(destination_dtype.back()) * Uniform(1, 150000))));
      next.push_back(0);
    }
    std::vector<int64_t> program_of(9, -1);  // per (source, destination): the last program made
    for (int64_t k = 0; k < count; ++k) {
      const int64_t s = Uniform(0, 2), d = Uniform(0, 2), src = srcs[s], dst = dsts[d];
      const int64_t src_item = AffineDtypeBytes(source_dtype[s]), dst_item = AffineDtypeBytes(destination_dtype[d]);
      const int64_t src_elements = static_cast<int64_t>(buffers.sources[src].size()) / src_item;
      const int64_t dst_elements = static_cast<int64_t>(buffers.destinations[dst].size()) / dst_item;
      // Half the rows start both sides on a 16-byte boundary (whole tensors do): the kernel's
      // 16-byte loads from the first element.
      const bool aligned = Uniform(0, 1) == 0;
      int64_t dst_element = next[d] + Uniform(0, 9);
      if (aligned) dst_element += (16 / dst_item - dst_element % (16 / dst_item)) % (16 / dst_item);
      if (dst_element >= dst_elements) continue;
      const int64_t n = Uniform(1, std::min({src_elements, dst_elements - dst_element, kMaxPieceElements}));
      // Half the rows share the program of an earlier row between the same buffers (as a row's
      // pieces do): a block may meet the program it already holds.
      int64_t& shared = program_of[s * 3 + d];
      if (shared < 0 || Uniform(0, 1)) shared = programs.Add(source_dtype[s], destination_dtype[d]);
      const int64_t program = shared;
      int64_t src_element = Uniform(0, src_elements - n);
      if (aligned) src_element -= src_element % (16 / src_item);
      affines.push_back({src, dst, src_element, dst_element, n, program});
      runs.push_back({dst, dst_element * dst_item, n * dst_item, destination_dtype[d]});
      next[d] = dst_element + n;
    }
  }

  // Transposed and cast views of every shape the tiles meet (under one tile, whole tiles,
  // ragged edges, casts of whole units), plain or through programs.
  void AddTransposes(int64_t count, bool with_programs) {
    const int64_t dsts[2] = {AddDestination({}), AddDestination({})};
    for (int64_t k = 0; k < count; ++k) {
      const int64_t kind = Uniform(0, kTransposeKinds - 1);
      const int64_t src_dtype = KindSource(kind), dst_dtype = KindDestination(kind, src_dtype);
      int64_t rows_of = Uniform(0, 5) == 0 ? 1 : Uniform(1, 150);
      int64_t cols = Uniform(0, 5) == 0 ? 1 : Uniform(1, 150);
      // Sides of whole four-element vectors, view element 0 landing on a whole vector below: the
      // tiles the kernel moves four elements a thread per access (its vector tiles).
      const bool whole = Uniform(0, 1) == 0;
      if (whole) {
        rows_of = 4 * Uniform(8, 40);
        cols = 4 * Uniform(8, 40);
      }
      if (rows_of == 1 && Uniform(0, 1)) cols = Uniform(1, 3 * kCastUnit);  // casts of whole units (the wide path)
      if (cols == 1 && Uniform(0, 1)) rows_of = Uniform(1, 3 * kCastUnit);
      const int64_t batch = Uniform(1, 3);
      const int64_t n = batch * rows_of * cols;
      const int64_t first = Uniform(0, 2) == 0 ? 0 : Uniform(0, n - 1);
      const int64_t length = Uniform(0, 2) == 0 ? n - first : Uniform(1, n - first);
      const int64_t src_item = TransposeSourceItem(kind), dst_item = TransposeDestinationItem(kind);
      const int64_t src = AddSource(Elements(n * src_item + Uniform(0, 3) * src_item, src_item));
      const int64_t dst = dsts[Uniform(0, 1)];
      Bytes& into = buffers.destinations[dst];
      into.resize((into.size() + dst_item - 1) / dst_item * dst_item, 0x5a);  // rows write whole elements
      int64_t dst_offset = static_cast<int64_t>(into.size()) + Uniform(0, 5) * dst_item;
      if (whole) dst_offset += ((first - dst_offset / dst_item) % 4 + 4) % 4 * dst_item;
      const Bytes noise = Noise(dst_offset - static_cast<int64_t>(into.size()) + length * dst_item + Uniform(0, 64));
      into.insert(into.end(), noise.begin(), noise.end());
      TransposeRow row{};
      row.src_index = src;
      row.dst_index = dst;
      row.dst_offset = dst_offset;
      row.first = first;
      row.count = length;
      row.batch = batch;
      row.rows = rows_of;
      row.cols = cols;
      row.kind = kind;
      row.program = with_programs && Uniform(0, 3) != 0 ? programs.Add(src_dtype, dst_dtype) : -1;
      transposes.push_back(row);
      runs.push_back({dst, dst_offset, length * dst_item, dst_dtype});
    }
    for (int64_t d : dsts) {
      if (buffers.destinations[d].empty()) buffers.destinations[d] = Noise(16);
    }
  }

  int64_t Count(const std::vector<BufferSegment>& rows) const { return static_cast<int64_t>(rows.size()); }

  // Every row of the scene by the CPU loops (IEEE arithmetic: no flush of subnormals, as the GPU).
  std::vector<Bytes> ByLoops() {
    std::vector<Bytes> out = buffers.destinations;
    const std::vector<const char*> sources = buffers.SourceList();
    const std::vector<char*> destinations = Buffers::List(&out);
    CopyBufferSegmentsOnHost(sources.data(), destinations.data(), bulk.data(), Count(bulk));
    CopyBufferSegmentsOnHost(sources.data(), destinations.data(), segments.data(), Count(segments));
    CopyTransposeRowsOnHost(sources.data(), destinations.data(), transposes.data(),
                            static_cast<int64_t>(transposes.size()), programs.Table());
    AffineCopyOnHost(sources.data(), destinations.data(), affines.data(), static_cast<int64_t>(affines.size()),
                     programs.Table());
    return out;
  }

  bool Same(const std::vector<Bytes>& loop, const std::vector<Bytes>& kernel, const char* what) const {
    const std::string difference = Compare(loop, kernel, runs);
    if (difference.empty()) return true;
    std::printf("FAIL %s: %s\n", what, difference.c_str());
    for (const TransposeRow& r : transposes) {
      std::printf("  transpose row: src %ld dst %ld at %ld first %ld count %ld shape %ldx%ldx%ld kind %ld program %ld\n",
                  static_cast<long>(r.src_index), static_cast<long>(r.dst_index), static_cast<long>(r.dst_offset),
                  static_cast<long>(r.first), static_cast<long>(r.count), static_cast<long>(r.batch),
                  static_cast<long>(r.rows), static_cast<long>(r.cols), static_cast<long>(r.kind),
                  static_cast<long>(r.program));
    }
    return false;
  }
};

// ---------------------------------------------------------------------------- one kernel at a time

bool SegmentCase() {
  Scene scene;
  scene.AddSegments(&scene.segments, Uniform(1, 40), kMaxPieceBytes);
  if (!Check(ValidateBufferSegments(scene.segments.data(), scene.Count(scene.segments), scene.buffers.SourceBytes(),
                                    scene.buffers.DestinationBytes()), "segment rows")) {
    return false;
  }
  const std::vector<Bytes> loop = scene.ByLoops();
  std::vector<Bytes> kernel = scene.buffers.destinations;
  return Check(LaunchBufferSegmentCopy(nullptr, scene.buffers.Pointers(&kernel), scene.segments.data(),
                                       scene.Count(scene.segments)), "segment launch") &&
         scene.Same(loop, kernel, "segment copy");
}

bool AffineCase() {
  Scene scene;
  scene.AddAffines(Uniform(1, 12));
  if (Uniform(0, 1)) {  // in small pieces, as the host splits rows: blocks run several of one program
    scene.affines = SplitAffineRows(scene.affines.data(), static_cast<int64_t>(scene.affines.size()),
                                    8 * Uniform(1, 1024));
  }
  const AffineTable table = scene.programs.Table();
  const auto count = static_cast<int64_t>(scene.affines.size());
  if (!Check(CheckAffineTable(table), "affine table") ||
      !Check(CheckAffineRowsInBounds(scene.affines.data(), count, table, scene.buffers.SourceBytes(),
                                     scene.buffers.DestinationBytes()), "affine rows")) {
    return false;
  }
  const std::vector<Bytes> loop = scene.ByLoops();
  std::vector<Bytes> kernel = scene.buffers.destinations;
  return Check(LaunchAffineCopy(nullptr, scene.buffers.Pointers(&kernel), scene.affines.data(), count, table),
               "affine launch") &&
         scene.Same(loop, kernel, "affine copy");
}

bool TransposeCase(bool with_programs) {
  Scene scene;
  scene.AddTransposes(Uniform(1, 6), with_programs);
  const AffineTable table = scene.programs.Table();
  std::vector<TransposeRow>& rows = scene.transposes;
  int64_t units = 0;
  if (!Check(CheckAffineTable(table), "transpose programs") ||
      !Check(CheckTransposeRows(rows.data(), static_cast<int64_t>(rows.size()), scene.buffers.SourceBytes(),
                                scene.buffers.DestinationBytes(), table, &units), "transpose rows")) {
    return false;
  }
  SortTransposeRows(&rows);  // one launch per kind, as DirectCopy sorts them; their units again
  if (!Check(CheckTransposeRows(rows.data(), static_cast<int64_t>(rows.size()), scene.buffers.SourceBytes(),
                                scene.buffers.DestinationBytes(), table, &units), "sorted transpose rows")) {
    return false;
  }
  const std::vector<Bytes> loop = scene.ByLoops();
  std::vector<Bytes> kernel = scene.buffers.destinations;
  return Check(LaunchTransposeRows(nullptr, scene.buffers.Pointers(&kernel), rows.data(), rows.data(),
                                   static_cast<int64_t>(rows.size()), units, table), "transpose launch") &&
         scene.Same(loop, kernel, with_programs ? "transpose copy with programs" : "transpose copy");
}

// ---------------------------------------------------------------------------- the direct launch

// Every kind of row in one DirectCopy on the emulated device (fake_driver.cc: device memory is
// host memory): its one device table (rows, transposes, affine rows, affine tables), the bulk
// rows as driver copies, one launch per kernel, against the CPU loops on the same rows.
bool DirectCase() {
  Scene scene;
  scene.AddSegments(&scene.bulk, Uniform(0, 4), int64_t{1} << 20);
  scene.AddSegments(&scene.segments, Uniform(0, 20), kMaxPieceBytes);
  scene.AddTransposes(Uniform(0, 4), true);
  scene.AddAffines(Uniform(0, 6));
  std::vector<Bytes> kernel = scene.buffers.destinations;
  DirectChunk chunk;
  for (size_t s = 0; s < scene.buffers.sources.size(); ++s) chunk.source_slots.push_back(static_cast<int64_t>(s));
  for (Bytes& d : kernel) {
    chunk.destinations.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(d.data())));
    chunk.destination_bytes.push_back(static_cast<int64_t>(d.size()));
  }
  chunk.bulk = scene.bulk;
  chunk.rows = scene.segments;
  chunk.transposes = scene.transposes;
  chunk.affines = scene.affines;
  chunk.affine_programs = static_cast<int64_t>(scene.programs.programs.size());
  const auto* program_words = reinterpret_cast<const int64_t*>(scene.programs.programs.data());
  chunk.affine_table.assign(program_words, program_words + chunk.affine_programs * sizeof(AffineProgram) / 8);
  for (double c : scene.programs.constants) {
    int64_t word;
    std::memcpy(&word, &c, 8);
    chunk.affine_table.push_back(word);
  }
  std::unique_ptr<DirectCopy> copy;
  if (!Check(DirectCopy::Make(0, scene.buffers.SourceBytes(), {chunk}, &copy), "direct copy make")) return false;
  std::vector<int64_t> sources;
  for (const Bytes& b : scene.buffers.sources) sources.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.data())));
  if (!Check(copy->Run(sources.data(), static_cast<int64_t>(sources.size()), nullptr), "direct copy run")) return false;
  int64_t units = 0;  // the loop's rows checked too: the check fills in what the loop reads of them
  if (!Check(CheckTransposeRows(scene.transposes.data(), static_cast<int64_t>(scene.transposes.size()),
                                scene.buffers.SourceBytes(), scene.buffers.DestinationBytes(), scene.programs.Table(),
                                &units), "transpose rows")) {
    return false;
  }
  return scene.Same(scene.ByLoops(), kernel, "direct launch");
}

}  // namespace
}  // namespace amem::copy

int main(int argc, char** argv) {
  using namespace amem::copy;
  const int cases = argc > 1 ? std::atoi(argv[1]) : 10;
  const unsigned long long seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  const std::string only = argc > 3 ? argv[3] : "";  // one suite by name (a kernel's variant), or all
  random_engine.seed(seed);
  struct Suite {
    const char* name;
    bool (*run)();
  };
  const Suite suites[] = {{"segment copy", SegmentCase},
                          {"affine copy", AffineCase},
                          {"transpose copy", [] { return TransposeCase(false); }},
                          {"transpose copy with programs", [] { return TransposeCase(true); }},
                          {"direct launch", DirectCase}};
  int failed = 0;
  for (const Suite& suite : suites) {
    if (!only.empty() && only != suite.name) continue;
    int passed = 0;
    for (int c = 0; c < cases; ++c) passed += suite.run() ? 1 : 0;
    std::printf("%-30s %d of %d cases equal (seed %llu)\n", suite.name, passed, cases, seed);
    failed += cases - passed;
  }
  return failed == 0 ? 0 : 1;
}
