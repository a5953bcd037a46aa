// shm_backend_bench: the shm backend alone (no runtime, no negotiation),
// its ranks as threads of one process, for tuning the chunk size and the
// spin time. Prints the allreduce time and bus bandwidth per size and chunk,
// next to one core's memcpy rate on the same machine.
//
//   bazel-bin/tools/bench/shm_backend_bench [--ranks 2] [--sizes 64K,1M,16M]
//       [--chunks 256K,1M] [--spin-us 50] [--iters N] [--small BYTES]
//       [--pieces N]
// (--small: ShmOptions::small_allreduce_bytes, the size up to which every
// rank reduces the whole tensor in one stage. --pieces: also the same
// bytes as N tensors of their own, fused without a buffer, as the
// executor fuses a step's gradients: AllreducePieces.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kolo/store.h"
#include "ops/cpu/copy.h"
#include "ops/shm/shm_backend.h"
#include "tools/bench/bench_common.h"

namespace kolo {
namespace bench {
namespace {

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  for (absl::string_view s : absl::StrSplit(text, ',')) {
    int64_t v;
    if (!ParseBytes(std::string(s), &v)) Die("bad size " + std::string(s));
    out.push_back(v);
  }
  return out;
}

double MemcpyGBs(size_t bytes) {
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  const int iters = 5;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) std::memcpy(b.data(), a.data(), bytes);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return bytes * iters / s / 1e9;
}

int Main(int argc, char** argv) {
  int ranks = 2, iters = 0, pieces = 0;
  double spin_us = 50;
  int64_t small = -1;  // ShmOptions' default
  std::vector<int64_t> sizes = {64 << 10, 1 << 20, 16 << 20, 64 << 20};
  std::vector<int64_t> chunks = {256 << 10, 1 << 20, 4 << 20};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--ranks")
      ranks = std::atoi(value.c_str());
    else if (arg == "--sizes")
      sizes = ParseList(value);
    else if (arg == "--chunks")
      chunks = ParseList(value);
    else if (arg == "--spin-us")
      spin_us = std::atof(value.c_str());
    else if (arg == "--iters")
      iters = std::atoi(value.c_str());
    else if (arg == "--small")
      small = ParseList(value).at(0);
    else if (arg == "--pieces")
      pieces = std::atoi(value.c_str());
    else
      Die("unknown flag " + arg);
  }
  std::printf(
      "# shm backend allreduce, float32 sum, %d ranks as threads; memcpy of 64 "
      "MB "
      "on one core: %.2f GB/s\n",
      ranks, MemcpyGBs(64 << 20));
  std::printf("# copies to and from the segment: %s\n",
              cpu::CopyAvoidsMemcpy()
                  ? "vector loop (memcpy measured > 2x slower here: Note "
                    "[Copies without REP MOVSB])"
                  : "memcpy (fast here)");
  if (pieces < 0) Die("--pieces must be >= 0");
  for (int64_t bytes : sizes) {
    if (pieces > bytes / 4) {
      Die("--pieces " + std::to_string(pieces) + " is more than the " +
          std::to_string(bytes / 4) + " floats of size " +
          std::to_string(bytes));
    }
  }
  std::printf("# %10s %10s %12s %10s %10s", "size(B)", "chunk(B)", "time(us)",
              "busbw", "sleeps");
  if (pieces > 0) std::printf(" %14s", "pieces(us)");
  std::printf("\n");
  for (int64_t chunk : chunks) {
    shm::ShmOptions options;
    options.chunk_bytes = chunk;
    options.spin = absl::Microseconds(spin_us);
    if (small >= 0) options.small_allreduce_bytes = small;
    auto store = NewInMemoryStore();
    std::vector<std::unique_ptr<shm::ShmBackend>> group(ranks);
    {
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
          BackendContext c;
          c.rank = r;
          c.size = ranks;
          c.store = store;
          c.all_ranks_on_host = true;
          auto b = shm::ShmBackend::Create(c, options);
          if (!b.ok()) Die(std::string(b.status().message()));
          group[r] = std::move(*b);
        });
      }
      for (auto& t : threads) t.join();
    }
    for (int64_t bytes : sizes) {
      const size_t count = bytes / 4;
      const int n = iters ? iters : IterationsFor(bytes) / 2 + 3;
      // p50 of rank 0's time per allreduce; `split` > 0: over that many
      // tensors of their own (the last one takes the remainder).
      const auto measure = [&](int split) {
        std::vector<double> us(n);
        std::vector<std::thread> threads;
        for (int r = 0; r < ranks; ++r) {
          threads.emplace_back([&, r] {
            std::vector<float> data(count, 1.0f);
            std::vector<std::vector<float>> parts;
            std::vector<FusedPiece> fused;
            for (int k = 0; k < split; ++k) {
              const size_t each = count / split;
              parts.emplace_back(
                  k + 1 < split ? each : count - each * (split - 1), 1.0f);
            }
            for (auto& part : parts) {
              fused.push_back({part.data(), part.data(), part.size()});
            }
            for (int i = -2; i < n; ++i) {
              const auto t0 = std::chrono::steady_clock::now();
              const absl::Status s =
                  split > 0
                      ? group[r]->AllreducePieces(
                            fused, count, DataType::kFloat32, ReduceOp::kSum)
                      : group[r]->Allreduce(data.data(), count,
                                            DataType::kFloat32, ReduceOp::kSum);
              if (!s.ok()) Die("allreduce failed: " + std::string(s.message()));
              if (r == 0 && i >= 0) {
                us[i] = std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
              }
            }
          });
        }
        for (auto& t : threads) t.join();
        return Percentile(us, 0.5);
      };
      const double p50 = measure(0);
      std::printf("  %10lld %10lld %12.1f %10.3f %10llu",
                  static_cast<long long>(bytes),
                  static_cast<long long>(group[0]->chunk_bytes()), p50,
                  bytes / p50 / 1e3 * BusFactor(Collective::kAllreduce, ranks),
                  static_cast<unsigned long long>(group[0]->futex_sleeps()));
      if (pieces > 0) {
        if (!group[0]->SupportsAllreducePieces(count, DataType::kFloat32)) {
          std::printf(" %14s", "(small)");
        } else {
          std::printf(" %14.1f", measure(pieces));
        }
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace kolo

int main(int argc, char** argv) { return kolo::bench::Main(argc, argv); }
