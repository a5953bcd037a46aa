// Options::phase_times (KOLO_PHASE_TIMES): RuntimeStats' phase sums, in
// real Runtimes (threads of one process, one host). The phases of a rank
// run under its loop's turn, one at a time, so their sum never exceeds the
// time the rank spent in the steps; without the option nothing is timed.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kolo/work.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

using testing::Counts;
using testing::OnEachRank;

constexpr int kTensors = 40;
constexpr int64_t kLen = 256;

// `steps` steps of kTensors async allreduces, then a wait for all, on rank
// r (results checked).
void Steps(Runtime& rt, int n, int r, int steps) {
  std::vector<std::vector<float>> tensors(kTensors, std::vector<float>(kLen));
  for (int step = 0; step < steps; ++step) {
    std::vector<Work> works;
    for (int t = 0; t < kTensors; ++t) {
      for (int64_t e = 0; e < kLen; ++e) tensors[t][e] = r + t + step + e;
      AllreduceRequest req;
      req.name = absl::StrCat("phase/", t);
      req.input = req.output =
          TensorView(tensors[t].data(), DataType::kFloat32, {kLen});
      auto work = rt.Allreduce(req);
      EXPECT_TRUE(work.ok()) << work.status();
      if (!work.ok()) return;
      works.push_back(std::move(*work));
    }
    for (int t = 0; t < kTensors; ++t) {
      const absl::Status s = works[t].Wait(absl::Seconds(30));
      EXPECT_TRUE(s.ok()) << "rank " << r << " step " << step << ": " << s;
      for (int64_t e = 0; e < kLen; ++e) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += q + t + step + e;
        if (tensors[t][e] != want) {
          ADD_FAILURE() << "rank " << r << " step " << step << " tensor " << t;
          return;
        }
      }
    }
  }
}

// `calls` blocking allreduces of one cached name on rank r (results
// checked).
void BlockingCalls(Runtime& rt, int r, int calls) {
  std::vector<float> v(kLen);
  for (int i = 0; i < calls; ++i) {
    for (int64_t e = 0; e < kLen; ++e) v[e] = r + i + e;
    AllreduceRequest req;
    req.name = "phase/blocking";
    req.input = req.output = TensorView(v.data(), DataType::kFloat32, {kLen});
    const absl::Status s = rt.AllreduceAndWait(req, absl::Seconds(30)).status;
    ASSERT_TRUE(s.ok()) << "rank " << r << " call " << i << ": " << s;
    for (int64_t e = 0; e < kLen; ++e) {
      ASSERT_EQ(v[e], static_cast<float>(2 * (i + e) + 1))
          << "rank " << r << " call " << i;
    }
  }
}

// Runs body(r) on each rank of a fresh 2-rank job with phase_times on
// (tweaked further by `tweak`), then reads each rank's stats; checks that
// the phases each rank timed fit in its window (they run one turn at a
// time, so they never overlap) and returns the stats.
std::vector<Counts> TimedJob(const std::function<void(Options&)>& tweak,
                             const std::function<void(Runtime&, int)>& body) {
  constexpr int n = 2;
  auto rts = testing::StartJob(n, [&](Options& o) {
    o.phase_times = true;
    if (tweak) tweak(o);
  });
  std::vector<Counts> stats(n);
  std::vector<int64_t> window(n);
  OnEachRank(n, [&](int r) {
    // A rank times nothing before its first submission (a fresh job), and
    // whatever it has timed when its stats are read lies before the end.
    const auto start = std::chrono::steady_clock::now();
    body(*rts[r], r);
    stats[r] = rts[r]->Counters();
    window[r] = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - start)
                    .count();
  });
  for (int r = 0; r < n; ++r) {
    const Counts& s = stats[r];
    EXPECT_LE(s.at("phase.send_ns") + s.at("phase.prepare_ns") +
                  s.at("phase.collective_ns") + s.at("phase.complete_ns") +
                  s.at("phase.recycle_ns"),
              window[r])
        << "rank " << r;
  }
  testing::ShutdownJob(rts);
  return stats;
}

TEST(PhaseTimes, EveryPhaseIsTimedAndTheyDoNotOverlap) {
  const std::vector<Counts> stats =
      TimedJob(nullptr, [](Runtime& rt, int r) { Steps(rt, 2, r, 50); });
  for (size_t r = 0; r < stats.size(); ++r) {
    const Counts& s = stats[r];
    EXPECT_GT(s.at("phase.send_ns"), 0) << "rank " << r;
    EXPECT_GT(s.at("phase.prepare_ns"), 0) << "rank " << r;
    EXPECT_GT(s.at("phase.collective_ns"), 0) << "rank " << r;
    EXPECT_GT(s.at("phase.complete_ns"), 0) << "rank " << r;
    EXPECT_GT(s.at("phase.recycle_ns"), 0) << "rank " << r;
  }
}

// Blocking allreduces: on one host a cached one runs in the caller's turn
// (Note [Caller turns]), timed like the thread's passes, and still one
// turn at a time.
TEST(PhaseTimes, CallersTurnsAreTimedWithoutOverlap) {
  const std::vector<Counts> stats = TimedJob(
      [](Options& o) {
        // A long spin, so that a caller waits in its turn for a peer
        // thread that the test machine's scheduler delays.
        o.spin_time = absl::Milliseconds(2);
      },
      [](Runtime& rt, int r) { BlockingCalls(rt, r, 300); });
  for (size_t r = 0; r < stats.size(); ++r) {
    EXPECT_GT(stats[r].at("loop.caller_turns_completed"), 0) << "rank " << r;
    EXPECT_GT(stats[r].at("phase.send_ns"), 0) << "rank " << r;
    EXPECT_GT(stats[r].at("phase.collective_ns"), 0) << "rank " << r;
  }
}

TEST(PhaseTimes, OffByDefaultNothingIsTimed) {
  constexpr int n = 2;
  auto rts = testing::StartJob(n);
  OnEachRank(n, [&](int r) { Steps(*rts[r], n, r, 10); });
  for (int r = 0; r < n; ++r) {
    const Counts s = rts[r]->Counters();
    EXPECT_GT(rts[r]->stats().collectives_executed, 0) << "rank " << r;
    EXPECT_EQ(s.at("phase.send_ns"), 0) << "rank " << r;
    EXPECT_EQ(s.at("phase.prepare_ns"), 0) << "rank " << r;
    EXPECT_EQ(s.at("phase.collective_ns"), 0) << "rank " << r;
    EXPECT_EQ(s.at("phase.complete_ns"), 0) << "rank " << r;
    EXPECT_EQ(s.at("phase.recycle_ns"), 0) << "rank " << r;
  }
  testing::ShutdownJob(rts);
}

}  // namespace
}  // namespace kolo
