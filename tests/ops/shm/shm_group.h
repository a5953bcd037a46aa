// Test helpers: the shm backends of one set as threads of this process,
// over one in-memory store (each "rank" maps the segment itself, exactly
// as separate processes would).
#ifndef KOLO_TESTS_OPS_SHM_SHM_GROUP_H_
#define KOLO_TESTS_OPS_SHM_SHM_GROUP_H_

#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kolo/store.h"
#include "ops/shm/shm_backend.h"

namespace kolo {
namespace shm {
namespace testing {

// Runs body(rank) on one thread per rank and joins them.
inline void OnEachRank(int size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
}

inline BackendContext ContextFor(int rank, int size,
                                 std::shared_ptr<Store> store,
                                 absl::Duration op_timeout) {
  BackendContext c;
  c.rank = rank;
  c.size = size;
  c.store = std::move(store);
  c.start_timeout = absl::Seconds(20);
  c.op_timeout = op_timeout;
  c.all_ranks_on_host = true;
  return c;
}

// Creates the set's backends concurrently (creation is collective).
inline std::vector<absl::StatusOr<std::unique_ptr<ShmBackend>>> TryCreateGroup(
    int size, const ShmOptions& options, std::shared_ptr<Store> store,
    absl::Duration op_timeout = absl::Seconds(30)) {
  std::vector<absl::StatusOr<std::unique_ptr<ShmBackend>>> out;
  for (int r = 0; r < size; ++r)
    out.emplace_back(absl::UnknownError("not run"));
  OnEachRank(size, [&](int r) {
    out[r] =
        ShmBackend::Create(ContextFor(r, size, store, op_timeout), options);
  });
  return out;
}

inline std::vector<std::unique_ptr<ShmBackend>> CreateGroup(
    int size, const ShmOptions& options = {},
    absl::Duration op_timeout = absl::Seconds(30),
    std::shared_ptr<Store> store = nullptr) {
  if (!store) store = NewInMemoryStore();
  auto created = TryCreateGroup(size, options, store, op_timeout);
  std::vector<std::unique_ptr<ShmBackend>> group;
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(created[r].ok()) << "rank " << r << ": " << created[r].status();
    group.push_back(created[r].ok() ? std::move(*created[r]) : nullptr);
  }
  return group;
}

// Whether /dev/shm still has an entry for the segment announced in `store`.
inline bool SegmentStillNamed(Store& store) {
  auto announced = store.Get("segment", absl::Seconds(1));
  if (!announced.ok()) return false;
  const std::string name = announced->substr(0, announced->find(' '));
  return access(("/dev/shm" + name).c_str(), F_OK) == 0;
}

}  // namespace testing
}  // namespace shm
}  // namespace kolo

#endif  // KOLO_TESTS_OPS_SHM_SHM_GROUP_H_
