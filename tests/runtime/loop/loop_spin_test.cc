// The background loop's waits around a burst of submissions (Note [Spin
// then block] in runtime/sync/wakeup.h), in a real one-rank Runtime: a
// burst of asynchronous allreduces a few tens of microseconds apart, as
// a backward pass's gradient hooks come, is caught by the loop's polling;
// it does not go to sleep in the kernel between them (each such sleep
// costs the next submission a system call). RuntimeStats::loop_sleeps
// counts the sleeps.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kolo/work.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

constexpr int kTensors = 100;
constexpr int64_t kLen = 64;

// Keeps this thread busy (no sleep, no yield) for `us`: the compute
// between two gradients.
void Compute(int64_t us) {
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < end) {
  }
}

// A burst of kTensors async allreduces `gap_us` apart, then a wait for
// all (results checked: one rank, so each tensor is unchanged). Returns
// the loop's sleeps during the burst and the wait.
int64_t Burst(Runtime& rt, int step, int64_t gap_us) {
  std::vector<std::vector<float>> tensors(kTensors, std::vector<float>(kLen));
  std::vector<Work> works;
  const int64_t before = rt.Counters().at("loop.sleeps");
  for (int t = 0; t < kTensors; ++t) {
    for (int64_t e = 0; e < kLen; ++e) tensors[t][e] = t + step + e;
    AllreduceRequest req;
    req.name = absl::StrCat("burst/", t);
    req.op = ReduceOp::kSum;
    req.input = req.output =
        TensorView(tensors[t].data(), DataType::kFloat32, {kLen});
    auto work = rt.Allreduce(req);
    EXPECT_TRUE(work.ok()) << work.status();
    if (!work.ok()) return -1;
    works.push_back(std::move(*work));
    Compute(gap_us);
  }
  for (int t = 0; t < kTensors; ++t) {
    const absl::Status s = works[t].Wait(absl::Seconds(30));
    EXPECT_TRUE(s.ok()) << "tensor " << t << ": " << s;
    for (int64_t e = 0; e < kLen; ++e) {
      if (tensors[t][e] != static_cast<float>(t + step + e)) {
        ADD_FAILURE() << "step " << step << " tensor " << t;
        break;
      }
    }
  }
  return rt.Counters().at("loop.sleeps") - before;
}

TEST(LoopSpin, ABurstOfSubmissionsIsPolledNotWokenForEach) {
  auto rts = testing::StartJob(1, [](Options& o) {
    // Far longer than the gaps, so that a scheduler that delays this
    // thread cannot end the loop's polling between two submissions.
    o.spin_time = absl::Milliseconds(200);
  });
  ASSERT_TRUE(rts[0]);
  // The first burst negotiates the names; the second is all cache hits.
  for (int step = 0; step < 2; ++step) {
    const int64_t sleeps = Burst(*rts[0], step, /*gap_us=*/30);
    // Without the polling, every gap longer than the loop's pass (a few
    // microseconds here) is a sleep: about kTensors of them.
    EXPECT_LE(sleeps, 2) << "step " << step;
  }
  EXPECT_GT(rts[0]->stats().tensors_executed, 0);
  testing::ShutdownJob(rts);
}

// KOLO_SPIN_TIME=0 still polls nothing: the loop sleeps between
// submissions that come apart (and the burst's results are the same).
TEST(LoopSpin, NoSpinTimeNoPolling) {
  auto rts = testing::StartJob(
      1, [](Options& o) { o.spin_time = absl::ZeroDuration(); });
  ASSERT_TRUE(rts[0]);
  // Gaps long enough that the loop finishes each pass and goes back to
  // sleep before the next submission, even on a busy machine.
  const int64_t sleeps = Burst(*rts[0], 0, /*gap_us=*/2000);
  EXPECT_GT(sleeps, kTensors / 4);
  testing::ShutdownJob(rts);
}

}  // namespace
}  // namespace kolo
