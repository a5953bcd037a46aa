// LocalJob: N Runtimes of one job as threads of this process, over one
// in-memory store and real loopback TCP (control plane, gloo), on one
// "host" or placed on several by their cross ranks (Setup).
#ifndef KOLO_TESTS_TESTING_LOCAL_JOB_H_
#define KOLO_TESTS_TESTING_LOCAL_JOB_H_

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kolo/runtime.h"
#include "kolo/store.h"

namespace kolo {
namespace testing {

// Runtime::Counters(), which the tests compare.
using Counts = std::map<std::string, int64_t>;

inline Options JobOptions(int rank, int size, std::shared_ptr<Store> store) {
  Options o;
  o.rank = rank;
  o.size = size;
  o.local_rank = rank;
  o.local_size = size;
  o.store = std::move(store);
  o.secret = "test-secret";
  o.start_timeout = absl::Seconds(30);
  o.op_timeout = absl::Seconds(30);
  return o;
}

// Creates `size` Runtimes (concurrently: creation is collective).
// `tweak` may adjust each rank's options.
inline std::vector<std::unique_ptr<Runtime>> StartJob(
    int size, std::function<void(Options&)> tweak = nullptr) {
  auto store = NewInMemoryStore();
  std::vector<std::unique_ptr<Runtime>> runtimes(size);
  std::vector<absl::Status> status(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Options o = JobOptions(r, size, store);
      if (tweak) tweak(o);
      auto rt = Runtime::Create(o);
      if (rt.ok()) {
        runtimes[r] = std::move(*rt);
      } else {
        status[r] = rt.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  }
  return runtimes;
}

// The ways a job's ranks agree on what to run (docs/design/negotiation.md):
// the in-process collective suites run over each.
enum class Transport {
  kBoard,        // one host: hits ANDed on the shared-memory hit board
  kCoordinator,  // one host, every rank negotiating with rank 0
  kLeaders,      // hosts of two ranks: each host's leader relays its ranks'
                 // lists and sends their common hits once
  kHosts,        // hosts of two ranks, every rank negotiating with rank 0
};

struct Setup {
  Transport transport = Transport::kBoard;
  int size = 1;
};

inline const char* TransportName(Transport t) {
  switch (t) {
    case Transport::kBoard:
      return "board";
    case Transport::kCoordinator:
      return "coordinator";
    case Transport::kLeaders:
      return "leaders";
    case Transport::kHosts:
      return "hosts";
  }
  return "?";
}

// gtest prints a Setup as "board, 3 ranks".
inline void PrintTo(const Setup& setup, std::ostream* os) {
  *os << TransportName(setup.transport) << ", " << setup.size << " ranks";
}

// For INSTANTIATE_TEST_SUITE_P: "board_np3".
inline std::string SetupName(const ::testing::TestParamInfo<Setup>& info) {
  return absl::StrCat(TransportName(info.param.transport), "_np",
                      info.param.size);
}

// Under a sanitizer (tools/sanitize.sh) every rank's threads run several
// times slower: the suites keep every transport but no job above 4 ranks.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KOLO_TESTS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KOLO_TESTS_SANITIZED 1
#endif
#endif
#ifdef KOLO_TESTS_SANITIZED
constexpr int kMaxJobSize = 4;
#else
constexpr int kMaxJobSize = 8;
#endif

// Every transport at the sizes given (up to kMaxJobSize): `one_host` for
// the two one-host transports, `hosts` (even: hosts of two ranks) for the
// other two.
inline std::vector<Setup> Setups(const std::vector<int>& one_host,
                                 const std::vector<int>& hosts) {
  std::vector<Setup> setups;
  for (Transport t : {Transport::kBoard, Transport::kCoordinator}) {
    for (int n : one_host) {
      if (n <= kMaxJobSize) setups.push_back({t, n});
    }
  }
  for (Transport t : {Transport::kLeaders, Transport::kHosts}) {
    for (int n : hosts) {
      if (n <= kMaxJobSize) setups.push_back({t, n});
    }
  }
  return setups;
}

// Places rank o.rank for `setup`.
inline void Place(const Setup& setup, Options& o) {
  const bool hosts = setup.transport == Transport::kLeaders ||
                     setup.transport == Transport::kHosts;
  const int per_host = hosts ? 2 : setup.size;
  o.local_rank = o.rank % per_host;
  o.local_size = per_host;
  o.cross_rank = o.rank / per_host;
  o.cross_size = setup.size / per_host;
  o.negotiate_within_hosts = setup.transport == Transport::kBoard ||
                             setup.transport == Transport::kLeaders;
}

inline std::vector<std::unique_ptr<Runtime>> StartJob(
    const Setup& setup, std::function<void(Options&)> tweak = nullptr) {
  EXPECT_TRUE(setup.transport == Transport::kBoard ||
              setup.transport == Transport::kCoordinator || setup.size % 2 == 0)
      << "hosts of two ranks need an even size, not " << setup.size;
  return StartJob(setup.size, [&](Options& o) {
    Place(setup, o);
    if (tweak) tweak(o);
  });
}

// Runs body(rank) on one thread per rank and joins them.
inline void OnEachRank(int size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
}

// Shuts every runtime down concurrently (shutdown is collective).
inline void ShutdownJob(std::vector<std::unique_ptr<Runtime>>& runtimes) {
  OnEachRank(static_cast<int>(runtimes.size()), [&](int r) {
    if (runtimes[r]) {
      absl::Status s = runtimes[r]->Shutdown(absl::Seconds(30));
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
    }
  });
}

}  // namespace testing
}  // namespace kolo

#endif  // KOLO_TESTS_TESTING_LOCAL_JOB_H_
