// The runtime's choice of CPU backend (ProcessSets::Connect, Note [The CPU path
// of a set]): shm for a set whose ranks are all on this host when KOLO_SHM is
// on, gloo otherwise; N Runtimes as threads, results checked through every
// collective.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

using testing::OnEachRank;
using testing::ShutdownJob;
using testing::StartJob;

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

// Starts a job with info logging and returns the runtimes; `log` gets what
// they wrote to stderr while starting.
std::vector<std::unique_ptr<Runtime>> StartLogged(
    int size, std::string* log, std::function<void(Options&)> tweak = nullptr) {
  ::testing::internal::CaptureStderr();
  auto job = StartJob(size, [&](Options& o) {
    o.log_level = LogLevel::kInfo;
    if (tweak) tweak(o);
  });
  *log = ::testing::internal::GetCapturedStderr();
  return job;
}

// Allreduce (fused and lone, several MB), broadcast, allgather, alltoall
// and reducescatter on set `set` of `members` (global ranks); checks every
// result.
void RunEveryCollective(std::vector<std::unique_ptr<Runtime>>& job, int set,
                        const std::vector<int>& members) {
  const int n = static_cast<int>(members.size());
  OnEachRank(static_cast<int>(members.size()), [&](int i) {
    Runtime& rt = *job[members[i]];
    const int me = i;  // rank within the set
    std::string tag = absl::StrCat("set", set, "/");
    // Three fused small tensors and one lone 3 MB one.
    std::vector<std::vector<float>> small(3, std::vector<float>(1001));
    std::vector<float> big(750001);
    std::vector<Work> works;
    for (int t = 0; t < 3; ++t) {
      for (size_t k = 0; k < small[t].size(); ++k)
        small[t][k] = static_cast<float>(me + t + k % 5);
      AllreduceRequest req;
      req.name = absl::StrCat(tag, "small", t);
      req.input = req.output =
          TensorView(small[t].data(), DataType::kFloat32,
                     {static_cast<int64_t>(small[t].size())});
      req.process_set = set;
      works.push_back(*rt.Allreduce(req));
    }
    for (size_t k = 0; k < big.size(); ++k)
      big[k] = static_cast<float>(me * (k % 7));
    AllreduceRequest big_req;
    big_req.name = tag + "big";
    big_req.op = ReduceOp::kAverage;
    big_req.input = big_req.output = TensorView(
        big.data(), DataType::kFloat32, {static_cast<int64_t>(big.size())});
    big_req.process_set = set;
    works.push_back(*rt.Allreduce(big_req));
    for (auto& w : works) ASSERT_TRUE(w.Wait().ok());
    const float rank_sum = n * (n - 1) / 2.0f;
    for (int t = 0; t < 3; ++t) {
      for (size_t k = 0; k < small[t].size(); ++k) {
        ASSERT_EQ(small[t][k], rank_sum + n * (t + k % 5)) << t << " " << k;
      }
    }
    for (size_t k = 0; k < big.size(); ++k) {
      ASSERT_FLOAT_EQ(big[k], rank_sum * (k % 7) / n) << k;
    }

    // Broadcast from the last rank of the set (the root: a rank of the job).
    std::vector<int64_t> b(4099, me == n - 1 ? 42 : -1);
    BroadcastRequest breq;
    breq.name = tag + "bcast";
    breq.tensor = TensorView(b.data(), DataType::kInt64, {4099});
    breq.root = members[n - 1];
    breq.process_set = set;
    ASSERT_TRUE(rt.Broadcast(breq)->Wait().ok());
    ASSERT_EQ(std::count(b.begin(), b.end(), 42), 4099);

    // Allgather: rank r contributes r + 1 rows of 3.
    std::vector<int32_t> rows((me + 1) * 3, me);
    std::vector<int32_t> gathered;
    AllgatherRequest greq;
    greq.name = tag + "gather";
    greq.input = TensorView(rows.data(), DataType::kInt32, {me + 1, 3});
    greq.allocator =
        [&](const std::vector<int64_t>& shape) -> absl::StatusOr<void*> {
      gathered.resize(shape[0] * shape[1]);
      return gathered.data();
    };
    greq.process_set = set;
    ASSERT_TRUE(rt.Allgather(greq)->Wait().ok());
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < (r + 1) * 3; ++k) ASSERT_EQ(gathered[at++], r);
    }

    // Alltoall: rank me sends k + 1 rows (value 100 * me + k) to rank k.
    std::vector<int64_t> splits(n);
    std::vector<int32_t> send;
    for (int k = 0; k < n; ++k) {
      splits[k] = k + 1;
      for (int j = 0; j < k + 1; ++j) send.push_back(100 * me + k);
    }
    std::vector<int32_t> received;
    AlltoallRequest areq;
    areq.name = tag + "a2a";
    areq.input = TensorView(send.data(), DataType::kInt32,
                            {static_cast<int64_t>(send.size())});
    areq.splits = splits;
    areq.allocator =
        [&](const std::vector<int64_t>& shape) -> absl::StatusOr<void*> {
      received.resize(shape[0]);
      return received.data();
    };
    areq.process_set = set;
    ASSERT_TRUE(rt.Alltoall(areq)->Wait().ok());
    ASSERT_EQ(received.size(), static_cast<size_t>(n * (me + 1)));
    for (int r = 0; r < n; ++r) {
      for (int j = 0; j < me + 1; ++j)
        ASSERT_EQ(received[r * (me + 1) + j], 100 * r + me);
    }

    // Reducescatter of 2n + 1 rows of 2.
    const int64_t total_rows = 2 * n + 1;
    std::vector<double> in(total_rows * 2);
    std::iota(in.begin(), in.end(), 0.0);
    auto out_shape = ReducescatterShape({total_rows, 2}, n, me);
    std::vector<double> out(out_shape[0] * 2);
    ReducescatterRequest rreq;
    rreq.name = tag + "rs";
    rreq.input = TensorView(in.data(), DataType::kFloat64, {total_rows, 2});
    rreq.output = TensorView(out.data(), DataType::kFloat64, out_shape);
    rreq.process_set = set;
    ASSERT_TRUE(rt.Reducescatter(rreq)->Wait().ok());
    int64_t first_row = 0;
    for (int r = 0; r < me; ++r)
      first_row += ReducescatterShape({total_rows, 2}, n, r)[0];
    for (size_t k = 0; k < out.size(); ++k)
      ASSERT_EQ(out[k], n * (first_row * 2.0 + k));
  });
}

TEST(ShmRuntime, ChosenByDefaultWhenEveryRankIsOnThisHost) {
  std::string log;
  auto job = StartLogged(3, &log);
  EXPECT_EQ(Count(log, "process set 0: 3 ranks over shm"), 3) << log;
  RunEveryCollective(job, 0, {0, 1, 2});
  ShutdownJob(job);
}

TEST(ShmRuntime, KoloShmOffMeansGloo) {
  std::string log;
  auto job = StartLogged(2, &log, [](Options& o) { o.shm = false; });
  EXPECT_EQ(Count(log, "process set 0: 2 ranks over gloo"), 2) << log;
  RunEveryCollective(job, 0, {0, 1});
  ShutdownJob(job);
}

// Two "hosts" by placement (cross rank): the whole job goes over gloo, a
// set within one host over shm, a set spanning both over gloo.
TEST(ShmRuntime, EachProcessSetChoosesByItsOwnRanks) {
  std::string log;
  auto job = StartLogged(4, &log, [](Options& o) {
    o.cross_rank = o.rank / 2;
    o.cross_size = 2;
    o.local_rank = o.rank % 2;
    o.local_size = 2;
    o.process_sets = {{0, 1}, {2, 3}, {1, 2}};
  });
  EXPECT_EQ(Count(log, "process set 0: 4 ranks over gloo"), 4) << log;
  EXPECT_EQ(Count(log, "process set 1: 2 ranks over shm"), 2) << log;
  EXPECT_EQ(Count(log, "process set 2: 2 ranks over shm"), 2) << log;
  EXPECT_EQ(Count(log, "process set 3: 2 ranks over gloo"), 2) << log;
  RunEveryCollective(job, 0, {0, 1, 2, 3});
  RunEveryCollective(job, 1, {0, 1});
  RunEveryCollective(job, 3, {1, 2});
  ShutdownJob(job);
}

// A fused allreduce large enough for the shm backend's in-place path
// (Note [Fusion without a buffer] in runtime/loop/executor.cc): 40 tensors of
// ~4 KB, half of them into separate outputs, with a postscale factor;
// exact results, the same on every rank, inputs of out-of-place tensors
// untouched; and the control plane went through shared memory.
TEST(ShmRuntime, FusedAllreduceInPlaceAndOutOfPlace) {
  std::string log;
  auto job = StartLogged(3, &log, [](Options& o) {
    o.cycle_time = absl::Milliseconds(50);  // all 40 in one list
  });
  EXPECT_EQ(Count(log, "control plane over shared memory"), 3) << log;
  constexpr int kTensors = 40;
  constexpr int kCount = 1001;
  std::vector<std::vector<std::vector<float>>> out(3);
  const RuntimeStats before = job[0]->stats();
  OnEachRank(3, [&](int r) {
    std::vector<std::vector<float>> in(kTensors), separate(kTensors);
    std::vector<Work> works;
    for (int t = 0; t < kTensors; ++t) {
      in[t].resize(kCount);
      for (int k = 0; k < kCount; ++k)
        in[t][k] = static_cast<float>(r + t + k % 9);
      AllreduceRequest req;
      req.name = absl::StrCat("fused/", t);
      req.postscale = 0.5;
      req.input = TensorView(in[t].data(), DataType::kFloat32, {kCount});
      if (t % 2) {
        separate[t].assign(kCount, -1.0f);
        req.output =
            TensorView(separate[t].data(), DataType::kFloat32, {kCount});
      } else {
        req.output = req.input;
      }
      works.push_back(*job[r]->Allreduce(req));
    }
    for (auto& w : works) ASSERT_TRUE(w.Wait().ok());
    for (int t = 0; t < kTensors; ++t) {
      const std::vector<float>& result = t % 2 ? separate[t] : in[t];
      for (int k = 0; k < kCount; ++k) {
        // (0 + 1 + 2) + 3 * (t + k % 9), times 0.5: exact in float.
        ASSERT_EQ(result[k], 0.5f * (3 + 3 * (t + k % 9)))
            << "rank " << r << " tensor " << t << " element " << k;
        if (t % 2) ASSERT_EQ(in[t][k], static_cast<float>(r + t + k % 9));
      }
      out[r].push_back(result);
    }
  });
  EXPECT_EQ(out[1], out[0]);
  EXPECT_EQ(out[2], out[0]);
  // Fused into few collectives, each well above the backend's one-stage
  // size (32 KB = 8 tensors), so the in-place path ran.
  const RuntimeStats after = job[0]->stats();
  EXPECT_LE(after.collectives_executed - before.collectives_executed, 3);
  ShutdownJob(job);
}

}  // namespace
}  // namespace kolo
