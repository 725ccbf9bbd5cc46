// The fused transpose-and-cast kernel alone (copy::LaunchTransposeRows, what the swap's direct
// launch runs), on the real-size case: Qwen3-1.7B's weights as a Flax trainer holds them (f32,
// [in, out]) written into a PyTorch model's (bf16, [out, in]); 28 layers of q/k/v/o, gate/up/down
// and four norms, the final norm and the 151936 x 2048 embedding (a cast): 310 rows, 6.88 GB read,
// 3.44 GB written. Timed with CUDA events (medians of 15) against cudaMemcpyAsync moving the same
// bytes (read + written) tensor by tensor, in the same run; then its output bits are checked
// against the CPU conversion (transpose_convert.h) on a sample of every tensor. On the GPU machine:
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Isrc benchmarks/transpose_kernel.cu src/copy/transpose_cuda.cu \
//        src/copy/transpose.cc -o /tmp/transpose_kernel && /tmp/transpose_kernel
//
// scripts/tune_transpose.sh builds and runs it. Exits 1 on any mismatch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "copy/transpose.h"
#include "copy/transpose_convert.h"
#include "cuda_timing.h"

namespace {

using amem::copy::BufferPointers;
using amem::copy::TransposeRow;

using amem::bench::Check;
using amem::bench::MedianMilliseconds;

constexpr int kRuns = 15;  // timed runs per figure (medians)

void Check(const amem::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.message().c_str());
    std::exit(2);
  }
}

// Random bit patterns (every class of f32: NaNs, infinities, subnormals, ties), a function of the
// tensor and the element alone: the check recomputes the sources on the host.
__host__ __device__ inline uint32_t SourceBits(uint32_t tensor, int64_t element) {
  uint64_t x = (static_cast<uint64_t>(tensor) << 40) ^ static_cast<uint64_t>(element);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

__global__ void FillBits(uint32_t* out, int64_t n, uint32_t tensor) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n; k += int64_t{gridDim.x} * blockDim.x) {
    out[k] = SourceBits(tensor, k);
  }
}

// One tensor: Flax holds it as f32 [in, out]; the destination is bf16 [out, in] (in == 1: a
// cast of `out` elements).
struct Tensor {
  std::string name;
  int64_t in, out;
  uint32_t* src = nullptr;
  uint16_t* dst = nullptr;
  int64_t elements() const { return in * out; }
};

std::vector<Tensor> Qwen3Tensors() {
  constexpr int64_t kHidden = 2048, kIntermediate = 6144, kHeads = 16, kKvHeads = 8, kHeadDim = 128;
  constexpr int64_t kVocabulary = 151936, kLayers = 28;
  std::vector<Tensor> tensors;
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    const std::string at = "layer" + std::to_string(layer) + ".";
    tensors.push_back({at + "q", kHidden, kHeads * kHeadDim});
    tensors.push_back({at + "k", kHidden, kKvHeads * kHeadDim});
    tensors.push_back({at + "v", kHidden, kKvHeads * kHeadDim});
    tensors.push_back({at + "o", kHeads * kHeadDim, kHidden});
    tensors.push_back({at + "gate", kHidden, kIntermediate});
    tensors.push_back({at + "up", kHidden, kIntermediate});
    tensors.push_back({at + "down", kIntermediate, kHidden});
    tensors.push_back({at + "input_norm", 1, kHidden});
    tensors.push_back({at + "post_norm", 1, kHidden});
    tensors.push_back({at + "q_norm", 1, kHeadDim});
    tensors.push_back({at + "k_norm", 1, kHeadDim});
  }
  tensors.push_back({"norm", 1, kHidden});
  tensors.push_back({"embedding", 1, kVocabulary * kHidden});
  return tensors;
}

// The rows the swap makes for `tensors` (one each: the source read as (1, in, out), its view
// (1, out, in)), or with `as_casts` every one a cast of its elements in order; checked and sorted
// by the library's own functions as the direct launch does, and uploaded.
struct Table {
  std::vector<TransposeRow> rows;
  TransposeRow* device = nullptr;
  int64_t units = 0;
  int64_t read = 0, written = 0;  // bytes
};

Table MakeTable(const std::vector<Tensor>& tensors, const std::vector<int>& which, bool as_casts) {
  Table table;
  std::vector<int64_t> src_bytes, dst_bytes;
  for (const Tensor& t : tensors) {
    src_bytes.push_back(t.elements() * 4);
    dst_bytes.push_back(t.elements() * 2);
  }
  for (int k : which) {
    const Tensor& t = tensors[k];
    TransposeRow row{};
    row.src_index = row.dst_index = k;
    row.count = t.elements();
    row.batch = 1;
    row.rows = as_casts ? 1 : t.in;
    row.cols = as_casts ? t.elements() : t.out;
    row.kind = amem::copy::kTransposeF32ToBF16;
    row.program = -1;
    table.rows.push_back(row);
    table.read += t.elements() * 4;
    table.written += t.elements() * 2;
  }
  const amem::copy::AffineTable none{nullptr, 0, nullptr, 0};
  const auto count = static_cast<int64_t>(table.rows.size());
  Check(amem::copy::CheckTransposeRows(table.rows.data(), count, src_bytes, dst_bytes, none, &table.units), "rows");
  amem::copy::SortTransposeRows(&table.rows);
  Check(amem::copy::CheckTransposeRows(table.rows.data(), count, src_bytes, dst_bytes, none, &table.units), "rows");
  Check(cudaMalloc(&table.device, count * sizeof(TransposeRow)), "cudaMalloc");
  Check(cudaMemcpy(table.device, table.rows.data(), count * sizeof(TransposeRow), cudaMemcpyHostToDevice), "upload");
  return table;
}

void Launch(const Table& table, const BufferPointers& pointers, cudaStream_t stream) {
  const amem::copy::AffineTable none{nullptr, 0, nullptr, 0};
  Check(amem::copy::LaunchTransposeRows(reinterpret_cast<CUstream>(stream), pointers, table.rows.data(), table.device,
                                        static_cast<int64_t>(table.rows.size()), table.units, none),
        "launch");
}

// The ceiling: per tensor, one cudaMemcpyAsync of (read + written) / 2 bytes from its source
// into `scratch`, so that it moves the bytes the kernel reads and writes.
float MemcpyMilliseconds(const std::vector<Tensor>& tensors, const std::vector<int>& which, char* scratch,
                         cudaStream_t stream) {
  return MedianMilliseconds([&] {
    for (int k : which) {
      cudaMemcpyAsync(scratch, tensors[k].src, tensors[k].elements() * 3, cudaMemcpyDeviceToDevice, stream);
    }
  }, stream, kRuns);
}

// Sampled lines of tensor `k`'s destination (view rows; runs of 4096 elements of a cast) against
// the CPU conversion of their source elements; a NaN only has to stay a NaN (the GPU's quiet NaN
// differs from the CPU's).
int64_t Mismatches(const Tensor& t, uint32_t k, bool cast, const std::vector<int64_t>& lines, int64_t* shown) {
  const int64_t line = cast ? std::min<int64_t>(t.elements(), 4096) : t.in;  // elements a line
  std::vector<uint16_t> got(line);
  int64_t bad = 0;
  for (int64_t j : lines) {
    const int64_t first = cast ? std::min(j * line, t.elements() - line) : j * t.in;
    Check(cudaMemcpy(got.data(), t.dst + first, line * 2, cudaMemcpyDeviceToHost), "read back");
    for (int64_t i = 0; i < line; ++i) {
      // View row j, column i is source row i, column j.
      const uint32_t from = SourceBits(k, cast ? first + i : i * t.out + j);
      const uint16_t want = amem::copy::F32BitsToBF16(from);
      const bool nan = (from & 0x7fffffffu) > 0x7f800000u;
      const bool same = nan ? (got[i] & 0x7fffu) > 0x7f80u : got[i] == want;
      if (!same && (*shown)++ < 10) {
        std::printf("MISMATCH %s element %ld: source 0x%08x, want 0x%04x, got 0x%04x\n", t.name.c_str(),
                    static_cast<long>(first + i), from, want, got[i]);
      }
      bad += same ? 0 : 1;
    }
  }
  return bad;
}

// A sample of every tensor: its first and last view rows and 14 random ones (every view row of
// layer 0's); casts, 16 runs of 4096 elements.
int64_t Verify(const std::vector<Tensor>& tensors, const std::vector<int>& which, bool as_casts) {
  std::mt19937_64 random(7);
  int64_t bad = 0, shown = 0;
  for (int k : which) {
    const Tensor& t = tensors[k];
    const bool cast = as_casts || t.in == 1;
    const int64_t lines = cast ? (t.elements() + 4095) / 4096 : t.out;
    std::vector<int64_t> sample = {0, lines - 1};
    if (t.name.rfind("layer0.", 0) == 0 && !cast) {
      for (int64_t j = 1; j < lines - 1; ++j) sample.push_back(j);
    } else {
      for (int s = 0; s < 14; ++s) sample.push_back(static_cast<int64_t>(random() % lines));
    }
    bad += Mismatches(t, static_cast<uint32_t>(k), cast, sample, &shown);
  }
  return bad;
}

}  // namespace

int main() {
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  std::vector<Tensor> tensors = Qwen3Tensors();
  BufferPointers pointers{};
  int64_t largest = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    Tensor& t = tensors[k];
    Check(cudaMalloc(&t.src, t.elements() * 4), "cudaMalloc");
    Check(cudaMalloc(&t.dst, t.elements() * 2), "cudaMalloc");
    FillBits<<<1024, 256, 0, stream>>>(t.src, t.elements(), static_cast<uint32_t>(k));
    pointers.sources[k] = reinterpret_cast<const char*>(t.src);
    pointers.destinations[k] = reinterpret_cast<char*>(t.dst);
    largest = std::max(largest, t.elements());
  }
  char* scratch = nullptr;
  Check(cudaMalloc(&scratch, largest * 3), "cudaMalloc");
  Check(cudaStreamSynchronize(stream), "fill");

  std::vector<int> all, transposed;
  for (size_t k = 0; k < tensors.size(); ++k) {
    all.push_back(static_cast<int>(k));
    if (tensors[k].in > 1) transposed.push_back(static_cast<int>(k));
  }
  std::printf("%-28s %6s %9s %9s %9s %9s %8s\n", "case", "rows", "GB moved", "kernel ms", "GB/s", "memcpy ms",
              "of memcpy");
  struct Case {
    const char* name;
    const std::vector<int>* which;
    bool as_casts;
    const char* key;
  };
  const Case cases[] = {{"swap (310 rows, as the swap)", &all, false, "swap"},
                        {"transposed rows only", &transposed, false, "tiles"},
                        {"the same bytes as casts", &all, true, "casts"}};
  std::string summary = "RESULT";
  int64_t bad = 0;
  for (const Case& c : cases) {
    const Table table = MakeTable(tensors, *c.which, c.as_casts);
    for (int k : *c.which) Check(cudaMemsetAsync(tensors[k].dst, 0x5a, tensors[k].elements() * 2, stream), "clear");
    const float kernel_ms = MedianMilliseconds([&] { Launch(table, pointers, stream); }, stream, kRuns);
    Check(cudaGetLastError(), "kernel");
    const float memcpy_ms = MemcpyMilliseconds(tensors, *c.which, scratch, stream);
    const double gb = (table.read + table.written) / 1e9;
    std::printf("%-28s %6zu %9.2f %9.3f %9.0f %9.3f %7.0f%%\n", c.name, table.rows.size(), gb, kernel_ms,
                gb / kernel_ms * 1e3, memcpy_ms, 100.0 * memcpy_ms / kernel_ms);
    char part[96];
    std::snprintf(part, sizeof(part), " %s_ms=%.3f %s_pct=%.0f", c.key, kernel_ms, c.key,
                  100.0 * memcpy_ms / kernel_ms);
    summary += part;
    bad += Verify(tensors, *c.which, c.as_casts);
    cudaFree(table.device);
  }
  std::printf("%s\n", summary.c_str());
  if (bad > 0) {
    std::printf("MISMATCH: %ld elements differ from the CPU conversion\n", static_cast<long>(bad));
    return 1;
  }
  std::printf("bits: every sampled element equals the CPU conversion\n");
  return 0;
}
