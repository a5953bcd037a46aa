// Negotiation behaviour with N Runtimes as threads: the response cache's
// steady state (counted), the timeline file, stall shutdown.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

using testing::Counts;
using ::testing::HasSubstr;
using testing::OnEachRank;

// One training-like step: every rank allreduces `tensors` gradients, in a
// rank-dependent order, and waits for all.
void Step(Runtime& rt, int tensors) {
  std::vector<std::vector<float>> grads(tensors, std::vector<float>(16, 1.0f));
  std::vector<Work> works;
  for (int k = 0; k < tensors; ++k) {
    const int t = (rt.rank() % 2) ? tensors - 1 - k : k;
    AllreduceRequest req;
    req.name = absl::StrCat("grad/", t);
    req.op = ReduceOp::kAverage;
    req.input = req.output =
        TensorView(grads[t].data(), DataType::kFloat32, {16});
    auto w = rt.Allreduce(req);
    ASSERT_TRUE(w.ok()) << w.status();
    works.push_back(*w);
  }
  for (Work& w : works)
    ASSERT_TRUE(w.Wait(absl::Seconds(30)).ok()) << w.status();
  for (auto& g : grads) ASSERT_EQ(g[0], 1.0f);
}

// Steady state with the hit board (Note [Hits on the board] in
// runtime/control/hit_board.h; these runtimes share one host) and without.
class SteadyState : public ::testing::TestWithParam<bool> {};

TEST_P(SteadyState, SendsNoRequestToTheCoordinator) {
  const bool board = GetParam();
  const int n = 3, tensors = 200;
  auto rts = testing::StartJob(
      n, [&](Options& o) { o.negotiate_within_hosts = board; });
  OnEachRank(n, [&](int r) { Step(*rts[r], tensors); });
  std::vector<Counts> warm(n);
  for (int r = 0; r < n; ++r) warm[r] = rts[r]->Counters();
  EXPECT_EQ(warm[0].at("coordinator.requests_received"), n * tensors);
  const int steps = 5;
  OnEachRank(n, [&](int r) {
    for (int i = 0; i < steps; ++i) Step(*rts[r], tensors);
  });
  const Counts steady = rts[0]->Counters();
  // Not one more full request: every rank sent cache ids only, to the
  // coordinator or onto the board (which gives them to the coordinator
  // when it closes), each counted once.
  EXPECT_EQ(steady.at("coordinator.requests_received"),
            warm[0].at("coordinator.requests_received"));
  int64_t on_board = 0, records = 0;
  for (int r = 0; r < n; ++r) {
    const Counts st = rts[r]->Counters();
    EXPECT_EQ(st.at("negotiation.cache_hits_sent") -
                  warm[r].at("negotiation.cache_hits_sent"),
              steps * tensors)
        << "rank " << r;
    on_board += st.at("board.hits") - warm[r].at("board.hits");
    records +=
        st.at("board.records_executed") - warm[r].at("board.records_executed");
  }
  const int64_t at_coordinator = steady.at("coordinator.cache_hits_received") -
                                 warm[0].at("coordinator.cache_hits_received");
  if (board) {
    // After the first step the board opens once the coordinator is quiet,
    // before any rank has its Works back: every later step is the board's.
    EXPECT_EQ(on_board, steps * n * tensors);
    EXPECT_EQ(at_coordinator, 0);
    EXPECT_GE(records, n * steps);
  } else {
    EXPECT_EQ(on_board, 0);
    EXPECT_EQ(records, 0);
    EXPECT_EQ(at_coordinator, steps * n * tensors);
  }
  int64_t lists_in = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(rts[r]->Counters().at("negotiation.requests_sent"), tensors)
        << "rank " << r;
    if (r > 0)
      lists_in += rts[r]->Counters().at("negotiation.request_lists_sent") -
                  warm[r].at("negotiation.request_lists_sent");
  }
  const int64_t lists_out =
      rts[1]->Counters().at("negotiation.response_lists_received") -
      warm[1].at("negotiation.response_lists_received");
  // Reported, not asserted: it depends on timing.
  std::printf(
      "steady state, %d tensors on %d ranks, board %s: per step "
      "%.1f request lists reach the coordinator, each rank receives "
      "%.1f response lists, %.1f board records\n",
      tensors, n, board ? "on" : "off", lists_in / static_cast<double>(steps),
      lists_out / static_cast<double>(steps),
      records / static_cast<double>(n * steps));
  testing::ShutdownJob(rts);
}

INSTANTIATE_TEST_SUITE_P(Board, SteadyState, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "BoardOn" : "BoardOff";
                         });

TEST(ResponseCache, CapacityZeroSendsFullRequestsEveryStep) {
  const int n = 2, tensors = 20;
  auto rts = testing::StartJob(n, [](Options& o) { o.cache_capacity = 0; });
  OnEachRank(n, [&](int r) {
    for (int i = 0; i < 3; ++i) Step(*rts[r], tensors);
  });
  EXPECT_EQ(rts[0]->Counters().at("coordinator.requests_received"),
            3 * n * tensors);
  EXPECT_EQ(rts[0]->Counters().at("coordinator.cache_hits_received"), 0);
  testing::ShutdownJob(rts);
}

TEST(ResponseCache, ChangedShapeUnderACachedNameIsRenegotiated) {
  const int n = 2;
  auto rts = testing::StartJob(n);
  OnEachRank(n, [&](int r) {
    for (int64_t len : {4, 4, 6, 6, 4}) {
      std::vector<float> v(len, 1.0f);
      AllreduceRequest req;
      req.name = "resized";
      req.input = req.output = TensorView(v.data(), DataType::kFloat32, {len});
      ASSERT_TRUE(rts[r]->Allreduce(req)->Wait(absl::Seconds(30)).ok());
      EXPECT_EQ(v, std::vector<float>(len, 2.0f));
    }
  });
  // Full requests for the first use and each change of shape (3 per rank).
  EXPECT_EQ(rts[0]->Counters().at("coordinator.requests_received"), 3 * n);
  testing::ShutdownJob(rts);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Valid JSON according to Python's parser (Debian's python3 is a test
// dependency of the project).
bool ValidJson(const std::string& path) {
  const std::string cmd = absl::StrCat(
      "python3 -c 'import json,sys; json.load(open(sys.argv[1]))' ", path);
  return std::system(cmd.c_str()) == 0;
}

TEST(Timeline, Rank0WritesChromeTraceWithEveryPhase) {
  const std::string path = ::testing::TempDir() + "/timeline.json";
  const int n = 2;
  auto rts = testing::StartJob(n, [&](Options& o) {
    o.timeline_path = path;
    o.timeline_mark_cycles = true;
  });
  OnEachRank(n, [&](int r) { Step(*rts[r], 8); });
  testing::ShutdownJob(rts);
  const std::string json = ReadFile(path);
  ASSERT_TRUE(ValidJson(path)) << json.substr(0, 2000);
  // Horovod's activity names, which users' tools read.
  for (const char* phase :
       {"\"NEGOTIATE_ALLREDUCE\"", "\"ALLREDUCE\"", "QUEUE",
        "MEMCPY_IN_FUSION_BUFFER", "_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER",
        "CYCLE_START", "grad/7", "\"size\"", "\"batch\""}) {
    EXPECT_THAT(json, HasSubstr(phase));
  }
}

TEST(Timeline, StartedAtRunTimeAndValidAfterAbort) {
  const std::string path = ::testing::TempDir() + "/timeline_abort.json";
  const int n = 2;
  auto rts = testing::StartJob(n);
  ASSERT_TRUE(rts[0]->StartTimeline(path).ok());
  OnEachRank(n, [&](int r) { Step(*rts[r], 4); });
  rts[0]->Abort();
  ASSERT_TRUE(ValidJson(path)) << ReadFile(path).substr(0, 2000);
  EXPECT_THAT(ReadFile(path), HasSubstr("_ALLREDUCE"));  // GLOO_ or SHM_
  rts[1]->Abort();
}

TEST(Stall, ShutdownTimeFailsEveryRank) {
  const int n = 3;
  auto rts = testing::StartJob(n, [](Options& o) {
    o.stall_check_time = absl::Milliseconds(200);
    o.stall_shutdown_time = absl::Seconds(1);
  });
  std::vector<float> a(4), b(4);
  AllreduceRequest req;
  req.name = "A";
  req.input = req.output = TensorView(a.data(), DataType::kFloat32, {4});
  auto w0 = rts[0]->Allreduce(req);  // only rank 0 submits A
  ASSERT_TRUE(w0.ok());
  absl::Status s = w0->Wait(absl::Seconds(20));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("for ranks 1, 2 to submit it"));
  // The other ranks are told too: their next submit fails the same way.
  for (int r = 1; r < n; ++r) {
    req.name = "later";
    req.input = req.output = TensorView(b.data(), DataType::kFloat32, {4});
    auto w = rts[r]->Allreduce(req);
    const absl::Status later = w.ok() ? w->Wait(absl::Seconds(20)) : w.status();
    EXPECT_EQ(later.code(), absl::StatusCode::kDeadlineExceeded) << later;
    EXPECT_THAT(std::string(later.message()), HasSubstr("stalled"));
  }
  for (auto& rt : rts) rt->Abort();
}

// A cached name that one rank stops submitting: its bits wait on the hit
// board, which hands them to the coordinator when they are as old as the
// stall check, so the stall report and the stall shutdown still name the
// rank; also when the missing rank is rank 0, whose background thread
// nothing wakes while the others' bits wait on the board.
class StallOnTheBoard : public ::testing::TestWithParam<int> {};

TEST_P(StallOnTheBoard, CachedNameNamesTheMissingRank) {
  const int n = 3, missing = GetParam();
  auto rts = testing::StartJob(n, [](Options& o) {
    o.stall_check_time = absl::Milliseconds(200);
    o.stall_shutdown_time = absl::Seconds(1);
  });
  std::vector<std::vector<float>> a(n, std::vector<float>(4, 1.0f));
  auto submit = [&](int r) {
    AllreduceRequest req;
    req.name = "A";
    req.input = req.output = TensorView(a[r].data(), DataType::kFloat32, {4});
    return rts[r]->Allreduce(req);
  };
  OnEachRank(n, [&](int r) {
    for (int i = 0; i < 3; ++i) {
      auto w = submit(r);
      ASSERT_TRUE(w.ok()) << w.status();
      ASSERT_TRUE(w->Wait(absl::Seconds(20)).ok());
    }
  });
  const int submitter = missing == 0 ? 1 : 0;
  ASSERT_GT(rts[submitter]->Counters().at("board.hits"), 0)
      << "the cached name never used the board";
  std::vector<Work> works;
  for (int r = 0; r < n; ++r) {
    if (r == missing) continue;  // never submits
    auto w = submit(r);
    ASSERT_TRUE(w.ok()) << w.status();
    works.push_back(*w);
  }
  for (Work& w : works) {
    const absl::Status s = w.Wait(absl::Seconds(20));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("for rank ", missing, " to submit it")));
  }
  for (auto& rt : rts) rt->Abort();
}

INSTANTIATE_TEST_SUITE_P(Missing, StallOnTheBoard, ::testing::Values(2, 0),
                         [](const auto& info) {
                           return absl::StrCat("Rank", info.param);
                         });

// Names served from the board stay recently used: with a cache of 4 and
// a new cacheable name every step, three hot names are never evicted (each
// step is one full request per rank, for the new name).
TEST(ResponseCache, NamesServedFromTheBoardStayRecentlyUsed) {
  const int n = 2, steps = 12;
  auto rts = testing::StartJob(n, [](Options& o) { o.cache_capacity = 4; });
  auto step = [&](int r, int s) {
    std::vector<std::vector<float>> v(4, std::vector<float>(3, 1.0f));
    std::vector<Work> works;
    for (int k = 0; k < 4; ++k) {
      AllreduceRequest req;
      req.name = k < 3 ? absl::StrCat("hot/", k) : absl::StrCat("new/", s);
      req.input = req.output = TensorView(v[k].data(), DataType::kFloat32, {3});
      auto w = rts[r]->Allreduce(req);
      ASSERT_TRUE(w.ok()) << w.status();
      works.push_back(*w);
    }
    for (Work& w : works)
      ASSERT_TRUE(w.Wait(absl::Seconds(20)).ok()) << w.status();
    // The hot names again, alone, so that they run from the board.
    for (int k = 0; k < 3; ++k) {
      AllreduceRequest req;
      req.name = absl::StrCat("hot/", k);
      req.input = req.output = TensorView(v[k].data(), DataType::kFloat32, {3});
      auto w = rts[r]->Allreduce(req);
      ASSERT_TRUE(w.ok() && w->Wait(absl::Seconds(20)).ok());
    }
  };
  OnEachRank(n, [&](int r) { step(r, 0); });
  const int64_t warm = rts[0]->Counters().at("coordinator.requests_received");
  EXPECT_EQ(warm, n * 4);
  OnEachRank(n, [&](int r) {
    for (int s = 1; s <= steps; ++s) step(r, s);
  });
  EXPECT_GT(rts[0]->Counters().at("board.hits"), 0);
  EXPECT_EQ(rts[0]->Counters().at("coordinator.requests_received") - warm,
            n * steps);
  testing::ShutdownJob(rts);
}

}  // namespace
}  // namespace kolo
