// The affine kernel alone (copy::LaunchAffineCopy: a swap's constant steps, here one scalar
// multiply), against cudaMemcpyAsync of the same buffers (for same-type pairs, what the plain
// swap runs) and the byte copy kernel, measured in the same run with CUDA events; its output
// checked bit for bit against the library's CPU loop. scripts/tune_affine.sh builds it and runs it
// with several piece sizes; by hand, on the GPU machine:
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Isrc -Xcompiler -ffp-contract=off benchmarks/affine_kernel.cu \
//        src/copy/affine_cuda.cu src/copy/affine.cc src/copy/affine_cpu.cc src/copy/copy_cuda.cu \
//        src/copy/segments.cc -o /tmp/affine_kernel && /tmp/affine_kernel
//
//   affine_kernel [--elements N] [--piece N] [--repeats N] [--scale X]
//
// Each pair: 4 source and 4 destination buffers of N elements (default 2^27: swap_scale.py's
// "4 x 512 MiB", 512 MiB of float32, 256 MiB of a 16-bit type), one row per buffer pair split
// into pieces of --piece elements (default copy::kMaxPieceElements, as the swap's tables are),
// one program `x * scale` as jax_amem.affine_copy.encode writes it. Times are medians.
//
// The check: each buffer's first and last MiB of source hold values of every class (random bits:
// subnormals, infinities, NaN with payloads, signed zeros; the narrow types' overflow and rounding
// edges), the rest one value. Per element the kernel's bits must equal the CPU loop's
// (affine_cpu.cc, denormals kept as the GPU keeps them), except that a NaN may be any NaN (the
// GPU's arithmetic gives its canonical NaN, the CPU's keeps the input's payload); the rest of
// each destination must hold the one value the CPU loop gives for the rest. "sample hash" hashes
// the kernel's sampled bytes, NaNs included: every piece size must print the same. A difference prints MISMATCH and the exit status is 1.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "copy/affine.h"
#include "copy/affine_cuda.h"
#include "copy/copy_cuda.h"
#include "copy/segments.h"
#include "cuda_timing.h"

namespace {

using amem::bench::Check;
using amem::bench::MedianMilliseconds;
using amem::Status;
using namespace amem::copy;

constexpr int kBuffers = 4;
constexpr unsigned char kRest = 0x3e;  // the bytes of every source element outside the samples

struct Pair {
  const char* name;
  int64_t src_dtype, dst_dtype;
  int64_t step_dtype;  // JAX's dtype of `x * c`: the source's
  int64_t rounding;    // what encode's _roundings gives: a cast after the step rounds its result
};
const Pair kPairs[] = {{"f32 -> f32", kAffineF32, kAffineF32, kAffineF32, 0},
                       {"bf16 -> bf16", kAffineBf16, kAffineBf16, kAffineBf16, 0},
                       {"f32 -> bf16", kAffineF32, kAffineBf16, kAffineF32, kRoundResult},
                       {"f16 -> f16", kAffineF16, kAffineF16, kAffineF16, 0}};

struct Options {
  int64_t elements = int64_t{1} << 27;
  int64_t piece = kMaxPieceElements;
  int repeats = 20;
  double scale = 0.3;  // not a power of two: the check sees results rounded (the time does not depend on it)
};

void Fail(const std::string& why) {
  std::fprintf(stderr, "affine_kernel: %s\n", why.c_str());
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Fail("missing value after " + flag);
    const char* value = argv[++i];
    if (flag == "--elements") o.elements = std::atoll(value);
    else if (flag == "--piece") o.piece = std::atoll(value);
    else if (flag == "--repeats") o.repeats = std::atoi(value);
    else if (flag == "--scale") o.scale = std::atof(value);
    else Fail("unknown option " + flag + " (--elements, --piece, --repeats, --scale)");
  }
  if (o.elements < 64 || o.elements % 8 != 0 || o.piece < 8 || o.piece % 8 != 0 || o.repeats < 1) {
    Fail("--elements: a multiple of 8, at least 64; --piece: a positive multiple of 8 (pieces keep 16-byte "
         "alignment); --repeats >= 1");
  }
  return o;
}

// Source bits of every class: a few fixed edges first, then random bits and ordinary values.
std::vector<unsigned char> Sample(int64_t elements, int64_t dtype, std::mt19937_64& random) {
  const int64_t item = AffineDtypeBytes(dtype);
  std::vector<unsigned char> out(static_cast<size_t>(elements * item));
  static const uint32_t kF32[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001,
                                  0x7f800001, 0x00000001, 0x807fffff, 0x00800000, 0x7f7fffff, 0x7f7f8000,
                                  0x477fe000, 0x477ff000, 0x33000000, 0x33000001, 0x3f808000, 0x3f818000};
  static const uint16_t k16[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x007f, 0x0080,
                                 0x7c00, 0xfc00, 0x7f80, 0xff80, 0x7e01, 0xffc1, 0x7bff, 0x7f7f};
  for (int64_t i = 0; i < elements; ++i) {
    const uint64_t r = random();
    if (item == 4) {
      uint32_t bits = static_cast<uint32_t>(r >> 32);  // random bits: every class
      if (i < static_cast<int64_t>(std::size(kF32))) {
        bits = kF32[i];
      } else if (r % 2 == 0) {  // an ordinary value, 2^-30 .. 2^31
        const float v = std::ldexp(1.0f + static_cast<float>(r % 4096) / 4096.0f, static_cast<int>(r >> 8 & 63) - 32);
        std::memcpy(&bits, &v, 4);
        bits |= static_cast<uint32_t>(r & 2) << 30;  // either sign
      }
      std::memcpy(&out[i * 4], &bits, 4);
    } else {
      const auto bits = static_cast<uint16_t>(i < static_cast<int64_t>(std::size(k16)) ? k16[i] : r >> 48);
      std::memcpy(&out[i * 2], &bits, 2);
    }
  }
  return out;
}

bool IsNan(const unsigned char* p, int64_t dtype) {
  if (dtype == kAffineF32) {
    uint32_t bits;
    std::memcpy(&bits, p, 4);
    return (bits & 0x7fffffffu) > 0x7f800000u;
  }
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return dtype == kAffineBf16 ? (bits & 0x7fff) > 0x7f80 : (bits & 0x7fff) > 0x7c00;
}

uint64_t Fnv(uint64_t hash, const std::vector<unsigned char>& bytes) {
  for (unsigned char b : bytes) hash = (hash ^ b) * 0x100000001b3ull;
  return hash;
}

// Counts the 32-bit words of `words` that are not `want`.
__global__ void CountOther(const uint32_t* words, int64_t count, uint32_t want, unsigned long long* other) {
  unsigned long long mine = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    mine += words[i] != want;
  }
  if (mine) atomicAdd(other, mine);
}

struct Figures {
  float kernel_ms = 0, memcpy_dst_ms = 0, memcpy_src_ms = 0, byte_kernel_ms = 0;
  uint64_t hash = 0;
  bool equal = true;
};

class PairRun {
 public:
  PairRun(const Pair& pair, const Options& o) : pair_(pair), o_(o) {
    src_item_ = AffineDtypeBytes(pair.src_dtype);
    dst_item_ = AffineDtypeBytes(pair.dst_dtype);
    src_bytes_ = o.elements * src_item_;
    dst_bytes_ = o.elements * dst_item_;
    sample_ = std::min<int64_t>((int64_t{1} << 20) / src_item_, o.elements / 2) / 8 * 8;
    Check(cudaStreamCreate(&stream_), "cudaStreamCreate");
    for (int i = 0; i < kBuffers; ++i) {
      Check(cudaMalloc(&src_[i], src_bytes_), "cudaMalloc (source)");
      // Room for the memcpy of the source's bytes too.
      Check(cudaMalloc(&dst_[i], std::max(src_bytes_, dst_bytes_)), "cudaMalloc (destination)");
      Check(cudaMemset(src_[i], kRest, src_bytes_), "cudaMemset");
      pointers_.sources[i] = src_[i];
      pointers_.destinations[i] = dst_[i];
    }
    BuildTable();
    BuildRows();
  }
  ~PairRun() {
    for (int i = 0; i < kBuffers; ++i) {
      cudaFree(src_[i]);
      cudaFree(dst_[i]);
    }
    cudaFree(device_words_);
    cudaFree(device_rows_);
    cudaFree(device_segments_);
    cudaStreamDestroy(stream_);
  }

  Figures Run() {
    Figures f;
    f.equal = Verify(&f.hash);
    f.kernel_ms = MedianMilliseconds([this] { LaunchKernel(); }, stream_, o_.repeats);
    f.memcpy_dst_ms = MemcpyMilliseconds(dst_bytes_);
    f.memcpy_src_ms = src_bytes_ == dst_bytes_ ? f.memcpy_dst_ms : MemcpyMilliseconds(src_bytes_);
    f.byte_kernel_ms = MedianMilliseconds([this] {
      const auto stream = reinterpret_cast<CUstream>(stream_);
      Check(ToCuda(LaunchBufferSegmentCopy(stream, pointers_, device_segments_, segments_)), "byte copy launch");
    }, stream_, o_.repeats);
    Check(cudaGetLastError(), "kernels");
    return f;
  }

  int64_t src_bytes() const { return src_bytes_ * kBuffers; }
  int64_t dst_bytes() const { return dst_bytes_ * kBuffers; }

 private:
  void LaunchKernel() {
    const auto stream = reinterpret_cast<CUstream>(stream_);
    Check(ToCuda(LaunchAffineCopy(stream, pointers_, device_rows_, rows_, device_table_)), "affine launch");
  }

  static cudaError_t ToCuda(const Status& status) {
    if (!status.ok()) std::fprintf(stderr, "%s\n", status.message().c_str());
    return status.ok() ? cudaSuccess : cudaErrorUnknown;
  }

  // One program, then its one constant: AffineTableAt's layout, as the table operand holds it.
  void BuildTable() {
    AffineProgram program{};
    program.src_dtype = pair_.src_dtype;
    program.dst_dtype = pair_.dst_dtype;
    program.steps = 1;
    program.step[0] = AffineStep{kAffineMul, pair_.step_dtype, 0, 0, 1, pair_.rounding};
    words_.resize(sizeof(AffineProgram) / 8 + 1);
    std::memcpy(words_.data(), &program, sizeof program);
    std::memcpy(&words_.back(), &o_.scale, 8);
    const auto bytes = static_cast<int64_t>(words_.size() * 8);
    host_table_ = AffineTableAt(words_.data(), bytes, 1);
    if (Status ok = CheckAffineTable(host_table_); !ok.ok()) Fail(ok.message());
    Check(cudaMalloc(&device_words_, bytes), "cudaMalloc (table)");
    Check(cudaMemcpy(device_words_, words_.data(), bytes, cudaMemcpyHostToDevice), "table upload");
    device_table_ = AffineTableAt(device_words_, bytes, 1);
  }

  // One row per buffer pair through program 0, split into pieces of --piece elements.
  void BuildRows() {
    std::vector<AffineRow> whole;
    std::vector<BufferSegment> dst_whole;
    for (int i = 0; i < kBuffers; ++i) {
      whole.push_back({i, i, 0, 0, o_.elements, 0});
      dst_whole.push_back({i, i, 0, 0, dst_bytes_, 0});
    }
    const std::vector<AffineRow> rows = SplitAffineRows(whole.data(), kBuffers, o_.piece);
    rows_ = static_cast<int64_t>(rows.size());
    std::vector<int64_t> sources(kBuffers, src_bytes_), destinations(kBuffers, dst_bytes_);
    if (Status ok = CheckAffineRowsInBounds(rows.data(), rows_, host_table_, sources, destinations); !ok.ok()) {
      Fail(ok.message());
    }
    Check(cudaMalloc(&device_rows_, rows.size() * sizeof(AffineRow)), "cudaMalloc (rows)");
    Check(cudaMemcpy(device_rows_, rows.data(), rows.size() * sizeof(AffineRow), cudaMemcpyHostToDevice), "rows");
    // The byte copy kernel's rows for the destination bytes (its own pieces, kMaxPieceBytes).
    const std::vector<BufferSegment> pieces = SplitBufferSegments(dst_whole.data(), kBuffers);
    segments_ = static_cast<int64_t>(pieces.size());
    Check(cudaMalloc(&device_segments_, pieces.size() * sizeof(BufferSegment)), "cudaMalloc (segments)");
    Check(cudaMemcpy(device_segments_, pieces.data(), pieces.size() * sizeof(BufferSegment), cudaMemcpyHostToDevice),
          "segments");
  }

  float MemcpyMilliseconds(int64_t bytes) {
    return MedianMilliseconds([&] {
      for (int i = 0; i < kBuffers; ++i) cudaMemcpyAsync(dst_[i], src_[i], bytes, cudaMemcpyDeviceToDevice, stream_);
    }, stream_, o_.repeats);
  }

  // The CPU loop's output for `count` source elements.
  std::vector<unsigned char> Reference(const std::vector<unsigned char>& in, int64_t count) const {
    std::vector<unsigned char> out(static_cast<size_t>(count * dst_item_));
    const AffineRow row{0, 0, 0, 0, count, 0};  // a scalar step: the element number plays no part
    const char* sources[] = {reinterpret_cast<const char*>(in.data())};
    char* destinations[] = {reinterpret_cast<char*>(out.data())};
    AffineCopyOnHost(sources, destinations, &row, 1, host_table_);
    return out;
  }

  // Runs the kernel once over destinations filled with 0xff and checks what it wrote.
  bool Verify(uint64_t* hash) {
    std::mt19937_64 random(7);
    const std::vector<unsigned char> rest_in(static_cast<size_t>(src_item_ * 2), kRest);
    const std::vector<unsigned char> rest_out = Reference(rest_in, 2);  // two elements: a 32-bit word
    uint32_t rest_word;
    std::memcpy(&rest_word, rest_out.data(), 4);
    const int64_t starts[] = {0, o_.elements - sample_};
    std::vector<std::vector<unsigned char>> inputs;
    for (int i = 0; i < kBuffers; ++i) {
      Check(cudaMemset(dst_[i], 0xff, dst_bytes_), "cudaMemset");
      for (int64_t start : starts) {
        inputs.push_back(Sample(sample_, pair_.src_dtype, random));
        const std::vector<unsigned char>& in = inputs.back();
        Check(cudaMemcpy(src_[i] + start * src_item_, in.data(), in.size(), cudaMemcpyHostToDevice), "sample upload");
      }
    }
    Check(cudaStreamSynchronize(stream_), "fill");
    LaunchKernel();
    Check(cudaStreamSynchronize(stream_), "affine kernel");
    unsigned long long* other = nullptr;
    Check(cudaMallocManaged(&other, sizeof *other), "cudaMallocManaged");
    *other = 0;
    int64_t mismatched = 0, nan_payloads = 0;
    *hash = 0xcbf29ce484222325ull;
    for (int i = 0; i < kBuffers; ++i) {
      const int64_t middle = (o_.elements - 2 * sample_) * dst_item_ / 4;  // words between the samples
      CountOther<<<264, 256, 0, stream_>>>(reinterpret_cast<const uint32_t*>(dst_[i] + sample_ * dst_item_), middle,
                                           rest_word, other);
      for (int part = 0; part < 2; ++part) {
        const std::vector<unsigned char>& in = inputs[2 * i + part];
        const std::vector<unsigned char> want = Reference(in, sample_);
        std::vector<unsigned char> got(want.size());
        Check(cudaMemcpy(got.data(), dst_[i] + starts[part] * dst_item_, got.size(), cudaMemcpyDeviceToHost), "sample");
        *hash = Fnv(*hash, got);
        for (int64_t e = 0; e < sample_; ++e) {
          const unsigned char* w = &want[e * dst_item_];
          const unsigned char* g = &got[e * dst_item_];
          if (std::memcmp(w, g, dst_item_) == 0) continue;
          if (IsNan(w, pair_.dst_dtype) && IsNan(g, pair_.dst_dtype)) {
            ++nan_payloads;
            continue;
          }
          if (mismatched++ < 5) {
            uint64_t a = 0, b = 0, x = 0;
            std::memcpy(&a, &in[e * src_item_], src_item_);
            std::memcpy(&b, w, dst_item_);
            std::memcpy(&x, g, dst_item_);
            std::printf("MISMATCH %s: buffer %d element %lld: source %#llx, CPU loop %#llx, kernel %#llx\n", pair_.name,
                        i, static_cast<long long>(starts[part] + e), static_cast<unsigned long long>(a),
                        static_cast<unsigned long long>(b), static_cast<unsigned long long>(x));
          }
        }
      }
    }
    Check(cudaStreamSynchronize(stream_), "CountOther");
    const unsigned long long wrong_rest = *other;
    cudaFree(other);
    if (wrong_rest) std::printf("MISMATCH %s: %llu words between the samples differ\n", pair_.name, wrong_rest);
    if (mismatched) {
      std::printf("MISMATCH %s: %lld sampled elements differ\n", pair_.name, static_cast<long long>(mismatched));
    }
    if (nan_payloads) {
      std::printf("  %s: %lld NaNs whose payload or sign differs from the CPU loop's (allowed)\n", pair_.name,
                  static_cast<long long>(nan_payloads));
    }
    return mismatched == 0 && wrong_rest == 0;
  }

  const Pair& pair_;
  const Options& o_;
  int64_t src_item_ = 0, dst_item_ = 0, src_bytes_ = 0, dst_bytes_ = 0, sample_ = 0;
  cudaStream_t stream_ = nullptr;
  char* src_[kBuffers] = {};
  char* dst_[kBuffers] = {};
  BufferPointers pointers_{};
  std::vector<int64_t> words_;
  AffineTable host_table_{}, device_table_{};
  void* device_words_ = nullptr;
  AffineRow* device_rows_ = nullptr;
  int64_t rows_ = 0;
  BufferSegment* device_segments_ = nullptr;
  int64_t segments_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  cudaDeviceProp device{};
  Check(cudaGetDeviceProperties(&device, 0), "cudaGetDeviceProperties");
  std::printf("affine kernel, x * %g, on %s: %d x %lld elements, pieces of %lld, medians of %d (ms; GB/s: bytes "
              "read + written)\n", o.scale, device.name, kBuffers, static_cast<long long>(o.elements),
              static_cast<long long>(o.piece), o.repeats);
  std::printf("%14s %8s %8s %9s %7s %11s %7s %9s %11s %12s %8s  %s\n", "pair", "src MiB", "dst MiB", "kernel", "GB/s",
              "memcpy dst", "GB/s", "of memcpy", "memcpy src", "byte kernel", "of byte", "sample hash");
  bool all_equal = true;
  for (const Pair& pair : kPairs) {
    PairRun run(pair, o);
    const Figures f = run.Run();
    all_equal = all_equal && f.equal;
    const double traffic = static_cast<double>(run.src_bytes() + run.dst_bytes());
    const double kernel_rate = traffic / f.kernel_ms / 1e6;
    const double memcpy_rate = 2.0 * run.dst_bytes() / f.memcpy_dst_ms / 1e6;
    const double byte_rate = 2.0 * run.dst_bytes() / f.byte_kernel_ms / 1e6;
    std::printf("%14s %8.0f %8.0f %9.3f %7.0f %11.3f %7.0f %8.1f%% %11.3f %12.3f %7.1f%%  %016llx%s\n", pair.name,
                run.src_bytes() / 1048576.0, run.dst_bytes() / 1048576.0, f.kernel_ms, kernel_rate, f.memcpy_dst_ms,
                memcpy_rate, 100.0 * kernel_rate / memcpy_rate, f.memcpy_src_ms, f.byte_kernel_ms,
                100.0 * kernel_rate / byte_rate, static_cast<unsigned long long>(f.hash), f.equal ? "" : "  MISMATCH");
    // One line a script reads (scripts/tune_affine.sh).
    std::printf("RESULT %s|%.4f|%.4f|%.2f|%016llx|%s\n", pair.name, f.kernel_ms, f.memcpy_dst_ms,
                100.0 * kernel_rate / memcpy_rate, static_cast<unsigned long long>(f.hash),
                f.equal ? "ok" : "MISMATCH");
  }
  std::printf("\"of memcpy\": the kernel's bytes read + written per second against cudaMemcpyAsync of the destination "
              "bytes (for same-type pairs the plain swap); \"of byte\": against the byte copy kernel's.\n");
  return all_equal ? 0 : 1;
}
