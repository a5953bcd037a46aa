// The reduction kernels of ops/cpu on one core, against memcpy and a plain
// scalar loop (what a reduction without vector code runs at):
//
//   bazel run //tools/bench:reduce_bench [-- --sizes 256K,64M]
//
// GB/s counts the bytes of one operand per second (n elements x size), the
// convention of "a sum at N GB/s"; the memory traffic is three times that
// (two reads, one write).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ops/cpu/reduce.h"

namespace {

using Clock = std::chrono::steady_clock;

// Best of `reps` runs of `body` over `bytes`, in GB/s.
template <typename F>
double Rate(size_t bytes, F&& body) {
  const int reps = std::max<int>(5, static_cast<int>((512ull << 20) / bytes));
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    body();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s);
  }
  return bytes / best / 1e9;
}

// A sum as a reduction loop without vector code runs it.
__attribute__((noinline, optimize("no-tree-vectorize"))) void ScalarSum(
    float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {256 << 10, 64 << 20};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) != "--sizes") {
      std::fprintf(stderr, "usage: %s [--sizes 256K,64M]\n", argv[0]);
      return 2;
    }
    sizes.clear();
    for (absl::string_view part : absl::StrSplit(argv[i + 1], ',')) {
      std::string p(part);
      int64_t mult = 1;
      if (!p.empty() && (p.back() == 'K' || p.back() == 'M')) {
        mult = p.back() == 'K' ? 1 << 10 : 1 << 20;
        p.pop_back();
      }
      int64_t v = 0;
      if (!absl::SimpleAtoi(p, &v) || v <= 0) {
        std::fprintf(stderr, "bad size %s\n", std::string(part).c_str());
        return 2;
      }
      sizes.push_back(v * mult);
    }
  }
  std::printf("# one core; GB/s of one operand (traffic: x3)\n");
  std::printf("# %10s %10s %10s %10s %10s %10s %10s\n", "bytes", "memcpy",
              "scalar", "f32 sum", "f32 max", "f16 sum", "bf16 sum");
  for (int64_t bytes : sizes) {
    const size_t n = bytes / 4;
    std::vector<float> a(n, 1.5f), b(n, 2.25f), out(n);
    std::vector<uint16_t> ha(2 * n, kolo::cpu::FloatToHalf(1.5f)),
        hb(2 * n, kolo::cpu::FloatToHalf(2.25f)), hout(2 * n);
    const double copy =
        Rate(bytes, [&] { std::memcpy(out.data(), a.data(), bytes); });
    const double scalar =
        Rate(bytes, [&] { ScalarSum(out.data(), a.data(), b.data(), n); });
    const double sum = Rate(bytes, [&] {
      kolo::cpu::Reduce(kolo::ReduceOp::kSum, kolo::DataType::kFloat32,
                        out.data(), a.data(), b.data(), n);
    });
    const double max = Rate(bytes, [&] {
      kolo::cpu::Reduce(kolo::ReduceOp::kMax, kolo::DataType::kFloat32,
                        out.data(), a.data(), b.data(), n);
    });
    const double half = Rate(bytes, [&] {
      kolo::cpu::Reduce(kolo::ReduceOp::kSum, kolo::DataType::kFloat16,
                        hout.data(), ha.data(), hb.data(), 2 * n);
    });
    const double bf16 = Rate(bytes, [&] {
      kolo::cpu::Reduce(kolo::ReduceOp::kSum, kolo::DataType::kBfloat16,
                        hout.data(), ha.data(), hb.data(), 2 * n);
    });
    std::printf("  %10lld %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f\n",
                static_cast<long long>(bytes), copy, scalar, sum, max, half,
                bf16);
    if (out[n / 2] != 3.75f && out[n / 2] != 2.25f) return 1;  // keep the work
  }
  return 0;
}
