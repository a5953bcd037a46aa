// ConnectGlooContext and the scheduling policy of gloo's event-loop thread
// (Note [gloo's loop thread does not preempt] in ops/gloo/gloo_context.cc).
#include "ops/gloo/gloo_context.h"

#include <dirent.h>
#include <sched.h>

#include <cstdlib>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gloo/allreduce.h"
#include "gtest/gtest.h"
#include "kolo/store.h"

namespace kolo {
namespace gloo_backend {
namespace {

std::set<int> ThreadsOfThisProcess() {
  std::set<int> tids;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') tids.insert(std::atoi(e->d_name));
  }
  closedir(dir);
  return tids;
}

struct Connected {
  std::shared_ptr<::gloo::Context> context;
  int policy_after = -1;  // the connecting thread's, after the call
  bool ok = false;
};

// Two ranks, each connecting on its own thread under `policy`.
std::vector<Connected> ConnectTwo(int policy) {
  std::shared_ptr<Store> store = NewInMemoryStore();
  std::vector<Connected> out(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      sched_param param{};
      if (sched_setscheduler(0, policy, &param) != 0) return;
      auto context = ConnectGlooContext(rank, 2, store, "127.0.0.1",
                                        absl::Seconds(20), absl::Seconds(20));
      out[rank].policy_after = sched_getscheduler(0);
      if (!context.ok()) {
        ADD_FAILURE() << context.status();
        return;
      }
      out[rank].context = *context;
      out[rank].ok = true;
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

TEST(GlooContextTest, TheLoopThreadsRunUnderBatchAndTheCallersPolicyIsBack) {
  const std::set<int> before = ThreadsOfThisProcess();
  std::vector<Connected> ranks = ConnectTwo(SCHED_OTHER);
  ASSERT_TRUE(ranks[0].ok && ranks[1].ok);
  for (const Connected& c : ranks) EXPECT_EQ(c.policy_after, SCHED_OTHER);
  // The threads that came with the two contexts: one event loop each
  // (a sanitizer may add a thread of its own, under the default policy).
  int batch = 0;
  for (int tid : ThreadsOfThisProcess()) {
    if (!before.count(tid) && sched_getscheduler(tid) == SCHED_BATCH) ++batch;
  }
  EXPECT_EQ(batch, 2);
  // And the contexts work: a sum over the two ranks.
  std::vector<std::vector<float>> data = {{1, 2, 3}, {10, 20, 30}};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      ::gloo::AllreduceOptions opts(ranks[rank].context);
      opts.setOutput(data[rank].data(), data[rank].size());
      opts.setReduceFunction([](void* out, const void* a, const void* b,
                                size_t n) {
        for (size_t i = 0; i < n; ++i) {
          static_cast<float*>(out)[i] =
              static_cast<const float*>(a)[i] + static_cast<const float*>(b)[i];
        }
      });
      ::gloo::allreduce(opts);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(data[rank], (std::vector<float>{11, 22, 33})) << rank;
  }
}

TEST(GlooContextTest, ACallerUnderAnotherPolicyIsLeftAsItIs) {
  // SCHED_IDLE: an unprivileged thread may take it but not leave it, so
  // each rank's thread ends with it; the loop threads inherit it as is.
  std::vector<Connected> ranks = ConnectTwo(SCHED_IDLE);
  ASSERT_TRUE(ranks[0].ok && ranks[1].ok);
  for (const Connected& c : ranks) EXPECT_EQ(c.policy_after, SCHED_IDLE);
}

}  // namespace
}  // namespace gloo_backend
}  // namespace kolo
