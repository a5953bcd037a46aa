// Error paths with N Runtimes as threads: mismatches between ranks, a
// duplicate in-flight name, op timeout, shutdown with work pending, use after
// shutdown. Every error must name the tensor and the ranks involved.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

using ::testing::HasSubstr;
using testing::OnEachRank;

// Submits an allreduce whose request `make(rank)` may differ per rank and
// returns each rank's final status.
std::vector<absl::Status> RunPerRank(
    std::vector<std::unique_ptr<Runtime>>& rts,
    const std::function<AllreduceRequest(int, std::vector<float>&)>& make) {
  const int n = static_cast<int>(rts.size());
  std::vector<absl::Status> status(n);
  OnEachRank(n, [&](int r) {
    std::vector<float> data(64, 1.0f);
    auto w = rts[r]->Allreduce(make(r, data));
    if (!w.ok()) {
      status[r] = w.status();
      return;
    }
    status[r] = w->Wait(absl::Seconds(30));
  });
  return status;
}

AllreduceRequest Request(const std::string& name, std::vector<float>& data,
                         std::vector<int64_t> shape) {
  AllreduceRequest req;
  req.name = name;
  req.input = req.output = TensorView(data.data(), DataType::kFloat32, shape);
  return req;
}

// Three ranks on one host (with and without the board), four on two hosts
// (with and without leaders).
class ErrorsOver : public ::testing::TestWithParam<testing::Setup> {};

// "ranks 0, 2, 3" for every rank of `n` but `except`.
std::string AllBut(int n, int except) {
  std::vector<int> ranks;
  for (int r = 0; r < n; ++r) {
    if (r != except) ranks.push_back(r);
  }
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(ranks, ", "));
}

// A name negotiated before (a cache hit on every transport) whose shape
// changes on one rank: every rank gets the same error, then goes on.
TEST_P(ErrorsOver, ShapeMismatchNamesEveryRankThenJobContinues) {
  const int n = GetParam().size;
  auto rts = testing::StartJob(GetParam());
  for (int step = 0; step < 2; ++step) {
    auto cached = RunPerRank(rts, [](int r, std::vector<float>& d) {
      return Request("grad/w", d, {64});
    });
    for (int r = 0; r < n; ++r) ASSERT_TRUE(cached[r].ok()) << cached[r];
  }
  auto status = RunPerRank(rts, [](int r, std::vector<float>& d) {
    d.resize(20 * 20 * 20);
    const int64_t dim = r == 1 ? 18 : 17;
    return Request("grad/w", d, {dim, dim, dim});
  });
  const std::string have = n - 1 == 1 ? " has " : " have ";
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument)
        << status[r];
    EXPECT_THAT(std::string(status[r].message()),
                HasSubstr(absl::StrCat(
                    "allreduce \"grad/w\": shape mismatch: ", AllBut(n, 1),
                    have, "[17,17,17]; rank 1 has [18,18,18]")));
  }
  // The job is still healthy: a matching allreduce succeeds.
  auto ok = RunPerRank(rts, [](int r, std::vector<float>& d) {
    return Request("grad/w", d, {64});
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(ok[r].ok()) << ok[r];
  testing::ShutdownJob(rts);
}

TEST(Errors, DtypeOpAndScaleMismatches) {
  auto rts = testing::StartJob(2);
  auto dtype = RunPerRank(rts, [](int r, std::vector<float>& d) {
    AllreduceRequest req = Request("t/dtype", d, {8});
    if (r == 1) req.input.dtype = req.output.dtype = DataType::kInt32;
    return req;
  });
  for (auto& s : dtype) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        std::string(s.message()),
        HasSubstr("dtype mismatch: rank 0 has float32; rank 1 has int32"));
  }
  auto op = RunPerRank(rts, [](int r, std::vector<float>& d) {
    AllreduceRequest req = Request("t/op", d, {8});
    req.op = r == 0 ? ReduceOp::kSum : ReduceOp::kMax;
    return req;
  });
  for (auto& s : op) {
    EXPECT_THAT(
        std::string(s.message()),
        HasSubstr("reduce op mismatch: rank 0 has sum; rank 1 has max"));
  }
  auto scale = RunPerRank(rts, [](int r, std::vector<float>& d) {
    AllreduceRequest req = Request("t/scale", d, {8});
    req.postscale = r == 0 ? 1.0 : 0.5;
    return req;
  });
  for (auto& s : scale) {
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("postscale factor mismatch"));
  }
  testing::ShutdownJob(rts);
}

TEST(Errors, BroadcastRootAndCollectiveTypeMismatch) {
  auto rts = testing::StartJob(2);
  std::vector<absl::Status> status(2), kind(2);
  OnEachRank(2, [&](int r) {
    std::vector<float> d(4);
    BroadcastRequest b;
    b.name = "b";
    b.root = r;  // each rank names itself
    b.tensor = TensorView(d.data(), DataType::kFloat32, {4});
    status[r] = rts[r]->Broadcast(b)->Wait(absl::Seconds(30));
    // "k" is a broadcast on rank 0 and an allreduce on rank 1.
    if (r == 0) {
      b.name = "k";
      b.root = 0;
      kind[r] = rts[r]->Broadcast(b)->Wait(absl::Seconds(30));
    } else {
      kind[r] =
          rts[r]->Allreduce(Request("k", d, {4}))->Wait(absl::Seconds(30));
    }
  });
  for (auto& s : status) {
    EXPECT_THAT(
        std::string(s.message()),
        HasSubstr("root mismatch: rank 0 has root 0; rank 1 has root 1"));
  }
  for (auto& s : kind) {
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("collective mismatch: rank 0 has broadcast; rank 1 "
                          "has allreduce"));
  }
  testing::ShutdownJob(rts);
}

TEST(Errors, DuplicateInFlightNameFailsAtOnceFirstCompletes) {
  auto rts = testing::StartJob(2);
  std::vector<float> a0(4, 1), a1(4, 2), dup(4, 5);
  // Rank 0 submits "x" twice before rank 1 submits it once.
  auto first = rts[0]->Allreduce(Request("x", a0, {4}));
  ASSERT_TRUE(first.ok());
  auto second = rts[0]->Allreduce(Request("x", dup, {4}));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("\"x\": a collective with this name is already in "
                        "flight on rank 0"));
  auto other = rts[1]->Allreduce(Request("x", a1, {4}));
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(first->Wait(absl::Seconds(30)).ok());
  ASSERT_TRUE(other->Wait(absl::Seconds(30)).ok());
  EXPECT_EQ(a0, std::vector<float>(4, 3.0f));
  EXPECT_EQ(a1, std::vector<float>(4, 3.0f));
  testing::ShutdownJob(rts);
}

TEST_P(ErrorsOver, OpTimeoutNamesTheRanksThatDidNotSubmit) {
  const int n = GetParam().size;
  auto rts = testing::StartJob(
      GetParam(), [](Options& o) { o.op_timeout = absl::Seconds(1); });
  std::vector<std::vector<float>> d(n, std::vector<float>(4));
  std::vector<Work> works;
  for (int r = 0; r < n; ++r) {
    if (r == 1) continue;
    auto w = rts[r]->Allreduce(Request("lonely", d[r], {4}));
    ASSERT_TRUE(w.ok()) << w.status();
    works.push_back(*w);
  }
  Work* w0 = &works[0];
  // The caller's own wait running out is told apart from the job's
  // timeout.
  const absl::Status mine = w0->Wait(absl::Milliseconds(1));
  EXPECT_EQ(mine.code(), absl::StatusCode::kDeadlineExceeded) << mine;
  EXPECT_TRUE(IsWaitTimeout(mine)) << mine;
  EXPECT_THAT(std::string(mine.message()),
              HasSubstr("Work::Wait timed out after 1 ms; the collective is "
                        "still pending"));
  for (Work& w : works) {
    absl::Status s = w.Wait(absl::Seconds(20));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_FALSE(IsWaitTimeout(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("timed out after 1 s (KOLO_OP_TIMEOUT) waiting for "
                          "rank 1 to submit it"));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("submitted by ", AllBut(n, 1), ")")));
  }
  testing::ShutdownJob(rts);
}

INSTANTIATE_TEST_SUITE_P(Transports, ErrorsOver,
                         ::testing::ValuesIn(testing::Setups({3}, {4})),
                         testing::SetupName);

TEST(Errors, ShutdownWithWorkPendingAbortsItAndLaterUseFails) {
  auto rts = testing::StartJob(2);
  std::vector<float> d(4);
  auto pending = rts[1]->Allreduce(Request("never-matched", d, {4}));
  ASSERT_TRUE(pending.ok());
  std::vector<absl::Status> status(2);
  OnEachRank(2, [&](int r) { status[r] = rts[r]->Shutdown(absl::Seconds(1)); });
  absl::Status s = pending->Wait(absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("never-matched"));
  auto late = rts[0]->Allreduce(Request("late", d, {4}));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rts[0]->Shutdown().code(), absl::StatusCode::kFailedPrecondition);
}

// bool moves (broadcast, allgather) but is never reduced: negotiation
// refuses it on every rank; int16 reduces on the CPU, and is refused on
// CUDA (NCCL has no 16-bit integer).
TEST(Errors, BoolIsMovedNotReducedAndInt16ReducesOnTheCpu) {
  auto rts = testing::StartJob(2);
  OnEachRank(2, [&](int r) {
    std::vector<uint8_t> flags = {static_cast<uint8_t>(r), 1, 0};
    AllreduceRequest sum;
    sum.name = "flags";
    sum.op = ReduceOp::kSum;
    sum.input = sum.output = TensorView(flags.data(), DataType::kBool, {3});
    auto refused = rts[r]->Allreduce(sum);
    ASSERT_TRUE(refused.ok()) << refused.status();
    const absl::Status s = refused->Wait(absl::Seconds(30));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("allreduce \"flags\": bool tensors are not reduced"));
    EXPECT_EQ(flags, (std::vector<uint8_t>{static_cast<uint8_t>(r), 1, 0}));

    BroadcastRequest bcast;
    bcast.name = "flags";
    bcast.root = 1;
    bcast.tensor = TensorView(flags.data(), DataType::kBool, {3});
    auto moved = rts[r]->Broadcast(bcast);
    ASSERT_TRUE(moved.ok()) << moved.status();
    ASSERT_TRUE(moved->Wait(absl::Seconds(30)).ok());
    EXPECT_EQ(flags, (std::vector<uint8_t>{1, 1, 0}));

    std::vector<int16_t> values = {static_cast<int16_t>(-300 * (r + 1)), 7};
    AllreduceRequest small;
    small.name = "int16";
    small.op = ReduceOp::kSum;
    small.input = small.output =
        TensorView(values.data(), DataType::kInt16, {2});
    auto reduced = rts[r]->Allreduce(small);
    ASSERT_TRUE(reduced.ok()) << reduced.status();
    ASSERT_TRUE(reduced->Wait(absl::Seconds(30)).ok());
    EXPECT_EQ(values, (std::vector<int16_t>{-900, 14}));

    AllreduceRequest on_gpu = small;
    on_gpu.name = "int16/cuda";
    on_gpu.input = on_gpu.output =
        TensorView(values.data(), DataType::kInt16, {2}, Device::Cuda(0));
    auto gpu = rts[r]->Allreduce(on_gpu);
    ASSERT_FALSE(gpu.ok());
    const std::string message(gpu.status().message());
    // Builds without a CUDA backend refuse the device before the dtype.
    EXPECT_TRUE(
        absl::StrContains(message, "NCCL has no 16-bit integer type") ||
        absl::StrContains(message, "for which this build has no backend"))
        << message;
  });
  testing::ShutdownJob(rts);
}

}  // namespace
}  // namespace kolo
