// LocalJob: N Runtimes of one job as threads of this process, over one
// in-memory store and real loopback TCP (control plane, gloo).
#ifndef KOLO_TESTS_TESTING_LOCAL_JOB_H_
#define KOLO_TESTS_TESTING_LOCAL_JOB_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
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
