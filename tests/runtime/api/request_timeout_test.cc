// A request's own timeout (AllreduceRequest::timeout and the others'; Note
// [Request timeouts] in runtime/negotiation/collectives.h) over every
// transport: a request that a rank never submits fails after its own
// timeout, not the job's, on the ranks that did, whether it travels in
// full or as a cache hit (an id on the hit board, a host leader's common
// hit, a bit to the coordinator), and the error names the rank and the
// timeout; requests without one keep waiting for the job's.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

using ::testing::HasSubstr;
using testing::OnEachRank;

class RequestTimeout : public ::testing::TestWithParam<testing::Setup> {};

AllreduceRequest Sum(const std::string& name, std::vector<float>& data,
                     absl::Duration timeout = absl::ZeroDuration()) {
  AllreduceRequest req;
  req.name = name;
  req.input = req.output = TensorView(data.data(), DataType::kFloat32,
                                      {static_cast<int64_t>(data.size())});
  req.timeout = timeout;
  return req;
}

TEST_P(RequestTimeout, FailsAfterItsOwnTimeoutNamingTheRankInFullAndAsAHit) {
  const int n = GetParam().size;
  const int missing = n - 1;
  // The job's timeout is far longer than the request's: an error within
  // the wait below is the request's.
  auto rts = testing::StartJob(
      GetParam(), [](Options& o) { o.op_timeout = absl::Seconds(120); });
  const absl::Duration own = absl::Milliseconds(500);
  OnEachRank(n, [&](int r) {
    Runtime& rt = *rts[r];
    // Two steps in which every rank submits both: "t" (with its own
    // timeout) and "u" (the job's) are cached, the second step's are hits.
    for (int step = 0; step < 2; ++step) {
      std::vector<float> t(4, r + 1.0f), u(4, 1.0f);
      auto wt = rt.Allreduce(Sum("t", t, own));
      auto wu = rt.Allreduce(Sum("u", u));
      ASSERT_TRUE(wt.ok() && wu.ok()) << wt.status() << wu.status();
      ASSERT_TRUE(wt->Wait(absl::Seconds(60)).ok()) << wt->status();
      ASSERT_TRUE(wu->Wait(absl::Seconds(60)).ok()) << wu->status();
      ASSERT_EQ(t[3], n * (n + 1) / 2.0f);
      ASSERT_EQ(u[3], static_cast<float>(n));
    }
  });
  EXPECT_GT(rts[0]->Counters().at("coordinator.cache_hits_received") +
                rts[0]->Counters().at("board.hits"),
            0);
  // A third step that the last rank does not submit: "t" and "u" as hits
  // only (on one host, bits on the board until rank 0 looks at them), then
  // a new name "v" in full, with the request's timeout.
  std::vector<std::vector<float>> t(n, std::vector<float>(4, 1.0f));
  std::vector<std::vector<float>> u = t, v = t;
  std::vector<Work> wu(n);
  OnEachRank(n, [&](int r) {
    if (r == missing) return;
    auto wt = rts[r]->Allreduce(Sum("t", t[r], own));
    auto u_work = rts[r]->Allreduce(Sum("u", u[r]));
    ASSERT_TRUE(wt.ok() && u_work.ok());
    wu[r] = *u_work;
    const absl::Status hit = wt->Wait(absl::Seconds(60));
    auto wv = rts[r]->Allreduce(Sum("v", v[r], own));
    ASSERT_TRUE(wv.ok());
    for (absl::Status s : {hit, wv->Wait(absl::Seconds(60))}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_FALSE(IsWaitTimeout(s)) << s;
      EXPECT_THAT(std::string(s.message()),
                  HasSubstr(absl::StrCat("timed out after 500 ms (the "
                                         "request's timeout) waiting for rank ",
                                         missing, " to submit it")));
    }
    // Their buffers are the caller's again, untouched.
    EXPECT_EQ(t[r][0], 1.0f);
    EXPECT_EQ(v[r][0], 1.0f);
  });
  // "u" waited on, under the job's timeout, and completes once the last
  // rank submits it.
  for (int r = 0; r < missing; ++r) EXPECT_FALSE(wu[r].IsCompleted());
  auto last = rts[missing]->Allreduce(Sum("u", u[missing]));
  ASSERT_TRUE(last.ok());
  wu[missing] = *last;
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(wu[r].Wait(absl::Seconds(60)).ok()) << wu[r].status();
    EXPECT_EQ(u[r][0], static_cast<float>(n));
  }
  testing::ShutdownJob(rts);
}

// Three ranks on one host (with and without the board), four on two hosts
// (with and without leaders).
INSTANTIATE_TEST_SUITE_P(Transports, RequestTimeout,
                         ::testing::ValuesIn(testing::Setups({3}, {4})),
                         testing::SetupName);

TEST(RequestTimeouts, ANegativeTimeoutIsRefusedAtOnceNamingTheTensor) {
  auto rts = testing::StartJob(1);
  std::vector<float> d(4);
  auto refused = rts[0]->Allreduce(Sum("grad/w", d, absl::Seconds(-1)));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("allreduce \"grad/w\": timeout -1 s is negative"));
  BroadcastRequest b;
  b.name = "weights";
  b.tensor = TensorView(d.data(), DataType::kFloat32, {4});
  b.timeout = absl::Milliseconds(-5);
  EXPECT_THAT(std::string(rts[0]->Broadcast(b).status().message()),
              HasSubstr("broadcast \"weights\": timeout -5 ms is negative"));
  EXPECT_EQ(
      rts[0]->Barrier(kGlobalProcessSet, absl::Seconds(-1)).status().code(),
      absl::StatusCode::kInvalidArgument);
  // Nothing was lost: the job goes on, and the next barrier is the first.
  auto barrier = rts[0]->Barrier(kGlobalProcessSet, absl::Seconds(5));
  ASSERT_TRUE(barrier.ok());
  EXPECT_TRUE(barrier->Wait(absl::Seconds(30)).ok());
  testing::ShutdownJob(rts);
}

}  // namespace
}  // namespace kolo
