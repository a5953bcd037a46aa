// Runtime::AllreduceAndWait and the caller's turn (Note [Caller turns] in
// runtime/loop/caller_turn.cc), in real Runtimes (threads of one process)
// over every transport (testing::Setup): a caller runs the turn on every
// rank, a host leader's relaying its host's lists included (on rank 0 off
// the board, where it submitted last), and the calls mean the same
// everywhere. Results are checked
// exactly on every call; every wait has a deadline.
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kolo/work.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

using testing::Counts;
using ::testing::HasSubstr;
using testing::OnEachRank;

float Value(int rank, int i, int64_t e) {
  return static_cast<float>(rank * 3 + i % 11 + e);
}

// `calls` blocking allreduces of `len` floats named name/(i % names) on
// rank r; each result checked.
void BlockingCalls(Runtime& rt, int n, int r, const std::string& name,
                   int names, int calls, int64_t len) {
  std::vector<float> v(len);
  for (int i = 0; i < calls; ++i) {
    for (int64_t e = 0; e < len; ++e) v[e] = Value(r, i, e);
    AllreduceRequest req;
    req.name = absl::StrCat(name, "/", i % names);
    req.input = req.output = TensorView(v.data(), DataType::kFloat32, {len});
    const absl::Status s = rt.AllreduceAndWait(req, absl::Seconds(30)).status;
    ASSERT_TRUE(s.ok()) << "rank " << r << " call " << i << ": " << s;
    for (int64_t e = 0; e < len; ++e) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += Value(q, i, e);
      ASSERT_EQ(v[e], want)
          << "rank " << r << " call " << i << " [" << e << "]";
    }
  }
}

// A long spin, so that a caller waits in its turn for a peer thread that
// the test machine's scheduler delays.
void LongSpin(Options& o) { o.spin_time = absl::Milliseconds(2); }

class CallerTurn : public ::testing::TestWithParam<testing::Setup> {
 protected:
  int size() const { return GetParam().size; }
  bool board() const {
    return GetParam().transport == testing::Transport::kBoard;
  }
  // A host leader other than rank 0: it relays its host's lists.
  bool Leader(int r) const {
    return GetParam().transport == testing::Transport::kLeaders && r != 0 &&
           r % 2 == 0;
  }
  // Rank 0 off the board completes a call in its turn only where it
  // submitted last (its coordinators' step answers at once), which the
  // threads' timing decides here; background_loop_test pins it down.
  bool WhenLast(int r) const { return r == 0 && !board(); }
  std::vector<std::unique_ptr<Runtime>> Start(
      std::function<void(Options&)> tweak = nullptr) {
    return testing::StartJob(GetParam(), [&](Options& o) {
      LongSpin(o);
      if (tweak) tweak(o);
    });
  }
};

TEST_P(CallerTurn, LoneCachedAllreducesRunOnTheCallersThread) {
  const int n = size();
  auto rts = Start();
  OnEachRank(n,
             [&](int r) { BlockingCalls(*rts[r], n, r, "lone", 1, 300, 5); });
  for (int r = 0; r < n; ++r) {
    const Counts s = rts[r]->Counters();
    EXPECT_EQ(s.at("board.hits") > 0, board()) << "rank " << r;
    if (!WhenLast(r)) {
      // Every call was offered a turn unless the thread was in a pass; a
      // turn that completed its collective ran it on the caller's thread
      // (on the board a record of its hits, elsewhere the coordinator's
      // response list; a leader relayed its host's lists in it).
      EXPECT_GT(s.at("loop.caller_turns_completed"), 0) << "rank " << r;
    }
    if (Leader(r)) {
      // The host's hits still went once for the host, whoever relayed.
      EXPECT_GT(s.at("relay.host_hits_sent"), 0) << "rank " << r;
    }
    std::printf("rank %d: 300 calls, %lld turns, %lld completed\n", r,
                static_cast<long long>(s.at("loop.caller_turns")),
                static_cast<long long>(s.at("loop.caller_turns_completed")));
  }
  testing::ShutdownJob(rts);
}

// Rank 0 calls the blocking form, the others submit and wait: the same
// collectives, whoever runs them on each rank.
TEST_P(CallerTurn, BlockingOnOneRankAsyncOnTheOthers) {
  const int n = size();
  auto rts = Start();
  const int calls = 200;
  OnEachRank(n, [&](int r) {
    if (r == 0) {
      BlockingCalls(*rts[0], n, 0, "mixed", 3, calls, 4);
      return;
    }
    std::vector<float> v(4);
    for (int i = 0; i < calls; ++i) {
      for (int64_t e = 0; e < 4; ++e) v[e] = Value(r, i, e);
      AllreduceRequest req;
      req.name = absl::StrCat("mixed/", i % 3);
      req.input = req.output = TensorView(v.data(), DataType::kFloat32, {4});
      auto w = rts[r]->Allreduce(req);
      ASSERT_TRUE(w.ok()) << w.status();
      ASSERT_TRUE(w->Wait(absl::Seconds(30)).ok()) << "call " << i;
      for (int64_t e = 0; e < 4; ++e) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += Value(q, i, e);
        ASSERT_EQ(v[e], want) << "rank " << r << " call " << i;
      }
    }
  });
  testing::ShutdownJob(rts);
}

// On each rank one thread makes blocking calls while another submits
// bursts of async allreduces and waits for them: the turn is taken by
// whichever thread gets it, and every result is exact.
TEST_P(CallerTurn, BlockingCallsBesideAsyncBurstsOfAnotherThread) {
  const int n = size();
  auto rts = Start();
  OnEachRank(n, [&](int r) {
    std::thread bursts([&] {
      for (int step = 0; step < 60; ++step) {
        std::vector<std::vector<float>> data(8, std::vector<float>(6));
        std::vector<Work> works;
        for (int k = 0; k < 8; ++k) {
          for (int64_t e = 0; e < 6; ++e) data[k][e] = Value(r, step + k, e);
          AllreduceRequest req;
          req.name = absl::StrCat("burst/", k);
          req.input = req.output =
              TensorView(data[k].data(), DataType::kFloat32, {6});
          auto w = rts[r]->Allreduce(req);
          ASSERT_TRUE(w.ok()) << w.status();
          works.push_back(*w);
        }
        for (int k = 0; k < 8; ++k) {
          ASSERT_TRUE(works[k].Wait(absl::Seconds(30)).ok())
              << "rank " << r << " step " << step << ": " << works[k].status();
          for (int64_t e = 0; e < 6; ++e) {
            float want = 0;
            for (int q = 0; q < n; ++q) want += Value(q, step + k, e);
            ASSERT_EQ(data[k][e], want) << "rank " << r << " step " << step;
          }
        }
      }
    });
    BlockingCalls(*rts[r], n, r, "beside", 2, 300, 3);
    bursts.join();
  });
  testing::ShutdownJob(rts);
}

// A cached name submitted with another shape on one rank is not a hit
// there: the coordinator finds the mismatch and every rank's call fails
// naming the tensor; the calls after it run as before.
TEST_P(CallerTurn, AShapeMismatchOnACachedNameFailsEveryRankThenCallsGoOn) {
  const int n = size();
  auto rts = Start();
  OnEachRank(n, [&](int r) {
    BlockingCalls(*rts[r], n, r, "shape", 1, 30, 4);
    std::vector<float> v(r == 1 ? 5 : 4, 1.0f);
    AllreduceRequest req;
    req.name = "shape/0";
    req.input = req.output = TensorView(v.data(), DataType::kFloat32,
                                        {static_cast<int64_t>(v.size())});
    const BlockingResult result =
        rts[r]->AllreduceAndWait(req, absl::Seconds(30));
    const absl::Status& s = result.status;
    EXPECT_TRUE(result.submitted) << "rank " << r << ": " << s;
    EXPECT_FALSE(s.ok()) << "rank " << r;
    EXPECT_THAT(std::string(s.message()), HasSubstr("shape mismatch"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("shape/0"));
    BlockingCalls(*rts[r], n, r, "shape", 1, 30, 4);
  });
  testing::ShutdownJob(rts);
}

// A request refused before it is queued (its output does not match its
// input) says so: not submitted, the error Allreduce() gives; the job
// goes on.
TEST_P(CallerTurn, ARefusedRequestIsNotSubmitted) {
  const int n = size();
  auto rts = Start();
  OnEachRank(n, [&](int r) {
    std::vector<float> in(4, 1.0f), out(3, 0.0f);
    AllreduceRequest req;
    req.name = "refused/0";
    req.input = TensorView(in.data(), DataType::kFloat32, {4});
    req.output = TensorView(out.data(), DataType::kFloat32, {3});
    const BlockingResult result = rts[r]->AllreduceAndWait(req);
    EXPECT_FALSE(result.submitted) << "rank " << r;
    EXPECT_EQ(result.status.code(), absl::StatusCode::kInvalidArgument)
        << result.status;
    EXPECT_EQ(rts[r]->Allreduce(req).status(), result.status);
    BlockingCalls(*rts[r], n, r, "refused", 1, 5, 4);
  });
  testing::ShutdownJob(rts);
}

// A blocking call whose peer does not call (yet) returns at its timeout,
// the collective still pending; once the peer calls, it completes.
TEST_P(CallerTurn, TheCallsTimeoutHoldsWhileAPeerIsLate) {
  const int n = size();
  auto rts = Start();
  OnEachRank(n, [&](int r) { BlockingCalls(*rts[r], n, r, "late", 1, 20, 2); });
  std::vector<float> v0 = {1, 2};
  AllreduceRequest req;
  req.name = "late/0";
  req.input = req.output = TensorView(v0.data(), DataType::kFloat32, {2});
  const absl::Status s =
      rts[0]->AllreduceAndWait(req, absl::Milliseconds(100)).status;
  EXPECT_TRUE(IsWaitTimeout(s)) << s;
  // The others call: every rank's contribution is 1, 2 on rank 0, 10, 20
  // on the others.
  const std::vector<float> want = {1.0f + 10 * (n - 1), 2.0f + 20 * (n - 1)};
  OnEachRank(n, [&](int r) {
    if (r == 0) return;
    std::vector<float> v = {10, 20};
    AllreduceRequest late = req;
    late.input = late.output = TensorView(v.data(), DataType::kFloat32, {2});
    ASSERT_TRUE(rts[r]->AllreduceAndWait(late, absl::Seconds(30)).ok());
    EXPECT_EQ(v, want) << "rank " << r;
  });
  // Rank 0's collective completed too (its buffer holds the sum): a new
  // call of the same name is accepted once it has.
  OnEachRank(n, [&](int r) { BlockingCalls(*rts[r], n, r, "late", 1, 5, 2); });
  EXPECT_EQ(v0, want);
  testing::ShutdownJob(rts);
}

// A cached name that one rank never submits: the blocking call of the
// rank that did fails at the op time-out (its turn ends with its spin and
// hands the entry to the thread, whose passes expire it), whichever rank
// it is: rank 0's thread must also take the board's partial id to the
// coordinator.
TEST_P(CallerTurn, AWaitWithoutTimeoutEndsAtTheOpTimeoutWhenAPeerNeverCalls) {
  const int n = size();
  for (int caller : {0, n - 1}) {
    auto rts = Start([](Options& o) { o.op_timeout = absl::Seconds(1); });
    OnEachRank(n,
               [&](int r) { BlockingCalls(*rts[r], n, r, "never", 1, 20, 2); });
    std::vector<float> v = {1, 2};
    AllreduceRequest req;
    req.name = "never/0";
    req.input = req.output = TensorView(v.data(), DataType::kFloat32, {2});
    const absl::Time start = absl::Now();
    const absl::Status s = rts[caller]->AllreduceAndWait(req).status;
    EXPECT_FALSE(s.ok()) << "rank " << caller;
    EXPECT_FALSE(IsWaitTimeout(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("never/0")) << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << s;
    for (auto& rt : rts) rt->Abort();
  }
}

// Abort while a caller waits in a blocking call: it returns with the
// abort's error.
TEST_P(CallerTurn, AbortEndsABlockingCall) {
  const int n = size();
  auto rts = Start();
  OnEachRank(n,
             [&](int r) { BlockingCalls(*rts[r], n, r, "abort", 1, 20, 2); });
  std::vector<float> v = {1, 2};
  AllreduceRequest req;
  req.name = "abort/0";
  req.input = req.output = TensorView(v.data(), DataType::kFloat32, {2});
  absl::Status s;
  std::thread call(
      [&] { s = rts[0]->AllreduceAndWait(req, absl::Seconds(30)).status; });
  // Abort is safe at any moment of the call; no wait for it to start.
  rts[0]->Abort();
  call.join();
  // Abort may come before the call queues (refused) or while it waits
  // (failed): never a success, since the others never submit, and never
  // the call's own time-out.
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(IsWaitTimeout(s)) << s;
  for (int r = 1; r < n; ++r) rts[r]->Abort();
}

// Every transport once (3 ranks on one host, 4 in hosts of two), and the
// board at 2 ranks too.
std::vector<testing::Setup> TurnSetups() {
  std::vector<testing::Setup> setups = {{testing::Transport::kBoard, 2}};
  for (const testing::Setup& s : testing::Setups({3}, {4})) {
    setups.push_back(s);
  }
  return setups;
}

INSTANTIATE_TEST_SUITE_P(Transports, CallerTurn,
                         ::testing::ValuesIn(TurnSetups()), testing::SetupName);

}  // namespace
}  // namespace kolo
