// JobState on its own (runtime/loop/job_state.h): the first error is the
// job's, waits end at the failure or the loop's end, and the coordinator's
// word on who a shutdown waits for.
#include "runtime/loop/job_state.h"

#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kolo {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(JobStateTest, TheFirstErrorIsTheJobs) {
  JobState job;
  EXPECT_FALSE(job.failed());
  EXPECT_TRUE(job.status().ok());
  EXPECT_TRUE(job.Fail(absl::UnavailableError("rank 2 was lost")));
  EXPECT_TRUE(job.failed());
  EXPECT_FALSE(job.Fail(absl::AbortedError("Abort() was called")));
  EXPECT_EQ(job.status(), absl::UnavailableError("rank 2 was lost"));
}

TEST(JobStateTest, WaitForFailureEndsAtTheFailureOrTheDeadline) {
  JobState job;
  // Nothing failed: the wait ends at its deadline, OK.
  EXPECT_TRUE(job.WaitForFailure(absl::Now()).ok());
  // Another thread's failure ends a wait that could last an hour.
  std::thread failer(
      [&] { job.Fail(absl::UnavailableError("rank 1 was lost")); });
  EXPECT_EQ(job.WaitForFailure(absl::Now() + absl::Hours(1)),
            absl::UnavailableError("rank 1 was lost"));
  failer.join();
}

TEST(JobStateTest, WaitLoopEndedSaysWhetherTheLoopEnded) {
  JobState job;
  EXPECT_FALSE(job.WaitLoopEnded(absl::Now()));
  std::thread loop([&] { job.LoopEnded(); });
  EXPECT_TRUE(job.WaitLoopEnded(absl::Now() + absl::Hours(1)));
  loop.join();
  EXPECT_TRUE(job.WaitLoopEnded(absl::InfinitePast()));
}

TEST(JobStateTest, ShutdownWaitingChangesOnlyWhenTheRanksDo) {
  JobState job;
  EXPECT_THAT(job.ShutdownWaiting(), IsEmpty());
  EXPECT_TRUE(job.SetShutdownWaiting({1, 3}));
  EXPECT_FALSE(job.SetShutdownWaiting({1, 3}));
  EXPECT_THAT(job.ShutdownWaiting(), ElementsAre(1, 3));
  EXPECT_TRUE(job.SetShutdownWaiting({3}));
  // Every rank asked: said once.
  EXPECT_TRUE(job.SetShutdownWaiting({}));
  EXPECT_FALSE(job.SetShutdownWaiting({}));
  EXPECT_THAT(job.ShutdownWaiting(), IsEmpty());
}

}  // namespace
}  // namespace kolo
