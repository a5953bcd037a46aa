// core_pingpong: the round trip of one cache line between two CPUs, the
// cost under every shared-memory handshake (the shm backend's barriers, the
// hit board's bits). On a VM the two vCPUs a job is given may sit on cores
// that share a cache or on cores far apart, and the hypervisor may move
// them between runs; docs/benchmarks.md ("Where the two vCPUs sit") shows
// that this placement alone moves a 4 KB allreduce from ~2.9 to ~5 us and
// an 800 KB one from ~47 to ~200 us. Run it next to a benchmark to know
// which placement the benchmark had.
//
//   bazel-bin/tools/bench/core_pingpong [--cpus A,B] [--trips N]
//
// Two threads, pinned to CPUs A and B (default: the first two this process
// may run on), hand a counter back and forth N times (default 200000) in
// 10 rounds; prints the median round trip in ns.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace kolo {
namespace bench {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "core_pingpong: %s\n", what.c_str());
  std::exit(1);
}

bool Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

int Main(int argc, char** argv) {
  std::vector<int> cpus;
  int64_t trips = 200000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("usage: %s [--cpus A,B] [--trips N]\n", argv[0]);
      return 0;
    }
    if (i + 1 >= argc) Die("missing value for " + arg);
    const std::string value = argv[++i];
    if (arg == "--cpus") {
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        int cpu;
        if (!absl::SimpleAtoi(s, &cpu) || cpu < 0 || cpu >= CPU_SETSIZE) {
          Die("bad CPU \"" + std::string(s) + "\" in --cpus " + value);
        }
        cpus.push_back(cpu);
      }
      if (cpus.size() != 2) Die("--cpus takes two CPUs, got " + value);
    } else if (arg == "--trips") {
      if (!absl::SimpleAtoi(value, &trips) || trips < 10) {
        Die("--trips must be a number >= 10, got " + value);
      }
    } else {
      Die("unknown flag " + arg + " (--help lists them)");
    }
  }
  if (cpus.empty()) {
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof(mine), &mine) != 0) {
      Die("sched_getaffinity failed");
    }
    for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
      if (CPU_ISSET(c, &mine)) cpus.push_back(c);
    }
    if (cpus.size() < 2) Die("this process may run on one CPU only");
  }
  constexpr int kRounds = 10;
  const int64_t per_round = trips / kRounds;
  alignas(64) std::atomic<int64_t> ball{0};
  std::atomic<bool> pinned_ok{true};
  std::thread peer([&] {
    if (!Pin(cpus[1])) pinned_ok = false;
    // Returns every odd value as the next even one, until the last trip.
    for (int64_t want = 1; want < 2 * per_round * kRounds; want += 2) {
      while (ball.load(std::memory_order_acquire) != want) {
      }
      ball.store(want + 1, std::memory_order_release);
    }
  });
  if (!Pin(cpus[0])) pinned_ok = false;
  std::vector<double> ns(kRounds);
  int64_t value = 0;
  for (int r = 0; r < kRounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t t = 0; t < per_round; ++t) {
      ball.store(value + 1, std::memory_order_release);
      while (ball.load(std::memory_order_acquire) != value + 2) {
      }
      value += 2;
    }
    ns[r] = std::chrono::duration<double, std::nano>(
                std::chrono::steady_clock::now() - start)
                .count() /
            per_round;
  }
  peer.join();
  std::sort(ns.begin(), ns.end());
  if (!pinned_ok)
    Die("could not pin a thread to CPU " + std::to_string(cpus[0]) + " or " +
        std::to_string(cpus[1]));
  std::printf(
      "# core-to-core round trip, CPUs %d and %d: %.0f ns (median "
      "of %d rounds; min %.0f, max %.0f)\n",
      cpus[0], cpus[1], (ns[kRounds / 2 - 1] + ns[kRounds / 2]) / 2, kRounds,
      ns.front(), ns.back());
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace kolo

int main(int argc, char** argv) { return kolo::bench::Main(argc, argv); }
