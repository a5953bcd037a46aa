// WorkState on its own: completed once, waited for by polling or asleep,
// without a lock on either side (Note [Completion without a lock] in
// runtime/api/work_state.cc), and renewed for a later collective (Note [Works
// recycled] in runtime/loop/tensor_queue.cc).
#include "runtime/api/work_state.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kolo/work.h"

namespace kolo {
namespace internal {
namespace {

TEST(WorkState, CompletesOnceAndKeepsTheFirstResult) {
  WorkState w;
  EXPECT_FALSE(w.IsCompleted());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnknown);  // pending
  EXPECT_TRUE(w.splits().empty());
  w.SetValue(7);
  EXPECT_TRUE(w.Complete(absl::AbortedError("rank 2 left"), {1, 2}));
  EXPECT_FALSE(w.Complete(absl::OkStatus(), {9}));
  w.SetValue(8);  // After completion: ignored.
  ASSERT_TRUE(w.IsCompleted());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(w.Wait(absl::ZeroDuration()).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(w.WaitQuietly(absl::ZeroDuration()).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(w.splits(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(w.value(), 7);
}

TEST(WorkState, AWaitThatRunsOutSaysSoAndLeavesThePendingState) {
  WorkState w;
  absl::Status s = w.Wait(absl::Milliseconds(20));
  EXPECT_TRUE(IsWaitTimeout(s)) << s;
  s = w.WaitQuietly(absl::Milliseconds(1));
  EXPECT_TRUE(IsWaitTimeout(s)) << s;
  EXPECT_FALSE(w.IsCompleted());
  EXPECT_TRUE(w.Complete(absl::OkStatus()));
  EXPECT_TRUE(w.Wait(absl::ZeroDuration()).ok());
}

TEST(WorkState, RenewMakesACompletedStatePendingAndEmpty) {
  WorkState w;
  w.SetValue(3);
  ASSERT_TRUE(w.Complete(absl::InternalError("first"), {4}));
  w.Renew();
  EXPECT_FALSE(w.IsCompleted());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnknown);
  EXPECT_TRUE(w.splits().empty());
  EXPECT_EQ(w.value(), 0);
  EXPECT_TRUE(IsWaitTimeout(w.WaitQuietly(absl::Milliseconds(1))));
  EXPECT_TRUE(w.Complete(absl::OkStatus(), {5}));
  EXPECT_TRUE(w.status().ok());
  EXPECT_EQ(w.splits(), (std::vector<int64_t>{5}));
}

// Many rounds of: sleepers (no spin), pollers (spin) and a racing second
// completer against one completion. A lost wake-up would leave a sleeper
// until its (long) timeout, which the test reports; every waiter must see
// the winner's status. The state is renewed between rounds, as a recycled
// entry's is, once every waiter has let go.
TEST(WorkState, EveryWaiterSeesTheOneCompletionWithoutLostWakeUps) {
  constexpr int kRounds = 300;
  constexpr int kSleepers = 2;
  constexpr int kPollers = 2;
  auto waiters = std::make_shared<std::atomic<int>>(0);
  auto state = std::make_shared<WorkState>();
  for (int round = 0; round < kRounds; ++round) {
    state->SetWaitPolicy(absl::Microseconds(round % 2 ? 50 : 0), waiters);
    std::atomic<int> seen_ok{0}, seen_error{0}, timed_out{0}, winners{0};
    auto wait = [&](bool sleep) {
      const absl::Status s = sleep ? state->WaitQuietly(absl::Seconds(10))
                                   : state->Wait(absl::Seconds(10));
      if (IsWaitTimeout(s)) {
        timed_out.fetch_add(1);
      } else if (s.ok()) {
        seen_ok.fetch_add(1);
      } else {
        seen_error.fetch_add(1);
      }
    };
    std::vector<std::thread> threads;
    for (int i = 0; i < kSleepers; ++i) threads.emplace_back(wait, true);
    for (int i = 0; i < kPollers; ++i) threads.emplace_back(wait, false);
    // Two completers race: exactly one wins, and its status is the one seen.
    const bool error_first = round % 3 == 0;
    auto complete = [&](bool error) {
      if (state->Complete(error ? absl::UnavailableError("lost rank 1")
                                : absl::OkStatus())) {
        winners.fetch_add(1);
      }
    };
    threads.emplace_back(complete, error_first);
    threads.emplace_back(complete, !error_first);
    for (std::thread& t : threads) t.join();
    ASSERT_EQ(winners.load(), 1) << "round " << round;
    ASSERT_EQ(timed_out.load(), 0) << "round " << round;
    const bool ok = state->status().ok();
    EXPECT_EQ(seen_ok.load(), ok ? kSleepers + kPollers : 0) << round;
    EXPECT_EQ(seen_error.load(), ok ? 0 : kSleepers + kPollers) << round;
    EXPECT_EQ(waiters->load(), 0);
    state->Renew();
  }
}

}  // namespace
}  // namespace internal
}  // namespace kolo
