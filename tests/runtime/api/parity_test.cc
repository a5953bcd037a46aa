// Horovod-parity collectives with N Runtimes as threads: alltoall,
// reducescatter, grouped allreduce, barrier, join, process sets.
#include <numeric>
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

class Parity : public ::testing::TestWithParam<testing::Setup> {
 protected:
  int size() const { return GetParam().size; }
};

OutputAllocator VectorAllocator(std::vector<float>* out,
                                std::vector<int64_t>* shape = nullptr) {
  return [out, shape](const std::vector<int64_t>& s) -> absl::StatusOr<void*> {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    out->resize(n);
    if (shape) *shape = s;
    return static_cast<void*>(out->data());
  };
}

TEST_P(Parity, AlltoallWithUnevenSplits) {
  const int n = size();
  auto rts = testing::StartJob(GetParam());
  OnEachRank(n, [&](int r) {
    // Rank r sends (r + k) % 3 rows of 2 floats to rank k; row values encode
    // sender, receiver and row.
    std::vector<int64_t> splits;
    std::vector<float> in;
    for (int k = 0; k < n; ++k) {
      splits.push_back((r + k) % 3);
      for (int i = 0; i < (r + k) % 3; ++i) {
        in.push_back(100 * r + 10 * k + i);
        in.push_back(-(100 * r + 10 * k + i));
      }
    }
    const int64_t rows =
        std::accumulate(splits.begin(), splits.end(), int64_t{0});
    std::vector<float> out;
    std::vector<int64_t> shape;
    AlltoallRequest req;
    req.name = "a2a";
    req.input = TensorView(in.data(), DataType::kFloat32, {rows, 2});
    req.splits = splits;
    req.allocator = VectorAllocator(&out, &shape);
    auto w = rts[r]->Alltoall(req);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->Wait(absl::Seconds(30)).ok()) << w->status();
    std::vector<float> want;
    std::vector<int64_t> received;
    for (int k = 0; k < n; ++k) {
      received.push_back((k + r) % 3);
      for (int i = 0; i < (k + r) % 3; ++i) {
        want.push_back(100 * k + 10 * r + i);
        want.push_back(-(100 * k + 10 * r + i));
      }
    }
    EXPECT_EQ(out, want) << "rank " << r;
    EXPECT_EQ(shape,
              (std::vector<int64_t>{static_cast<int64_t>(want.size() / 2), 2}));
    EXPECT_EQ(w->received_splits(), received);
  });
  // Splits that do not add up are rejected at once.
  std::vector<float> x(4);
  AlltoallRequest bad;
  bad.name = "bad";
  bad.input = TensorView(x.data(), DataType::kFloat32, {4});
  bad.splits = std::vector<int64_t>(n, 5);
  bad.allocator = VectorAllocator(&x);
  EXPECT_EQ(rts[0]->Alltoall(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  testing::ShutdownJob(rts);
}

TEST_P(Parity, ReducescatterSumAndAverageUnevenRows) {
  const int n = size();
  auto rts = testing::StartJob(GetParam());
  const int64_t rows = 7, cols = 3;
  OnEachRank(n, [&](int r) {
    std::vector<float> in(rows * cols);
    for (int i = 0; i < rows * cols; ++i) in[i] = (r + 1) * (i + 1);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      std::vector<int64_t> shape = ReducescatterShape({rows, cols}, n, r);
      std::vector<float> out(shape[0] * shape[1], -1);
      ReducescatterRequest req;
      req.name = absl::StrCat("rs/", ReduceOpName(op));
      req.op = op;
      req.input = TensorView(in.data(), DataType::kFloat32, {rows, cols});
      req.output = TensorView(out.data(), DataType::kFloat32, shape);
      auto w = rts[r]->Reducescatter(req);
      ASSERT_TRUE(w.ok()) << w.status();
      ASSERT_TRUE(w->Wait(absl::Seconds(30)).ok()) << w->status();
      int64_t first_row = 0;
      for (int k = 0; k < r; ++k)
        first_row += rows / n + (k < rows % n ? 1 : 0);
      const float rank_sum = n * (n + 1) / 2.0f;
      for (size_t j = 0; j < out.size(); ++j) {
        float want = rank_sum * (first_row * cols + j + 1);
        if (op == ReduceOp::kAverage) want /= n;
        ASSERT_FLOAT_EQ(out[j], want) << "rank " << r << " element " << j;
      }
    }
    // The chunks every rank sent this one are received into a staging
    // buffer that the rank keeps for reuse, and reports.
    const int64_t mine = (rows / n + (r < rows % n ? 1 : 0)) * cols * 4;
    if (n > 1) {
      EXPECT_GE(rts[r]->stats().host_buffer_bytes, mine * n) << "rank " << r;
    }
    // A wrong output shape is rejected at once and names the right one.
    std::vector<float> wrong(100);
    ReducescatterRequest bad;
    bad.name = "rs/bad";
    bad.input = TensorView(in.data(), DataType::kFloat32, {rows, cols});
    bad.output = TensorView(wrong.data(), DataType::kFloat32, {rows, cols});
    if (n > 1) {
      auto w = rts[r]->Reducescatter(bad);
      EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(w.status().message()),
                  HasSubstr("output must be"));
    }
  });
  testing::ShutdownJob(rts);
}

TEST_P(Parity, GroupedAllreduceIsOneUnit) {
  const int n = size();
  auto rts = testing::StartJob(GetParam());
  OnEachRank(n, [&](int r) {
    std::vector<float> a(5, r + 1.0f), b(1, 2.0f * r);
    std::vector<double> c(3, 1.0);
    std::vector<AllreduceRequest> group(3);
    group[0].name = "g/a";
    group[0].input = group[0].output =
        TensorView(a.data(), DataType::kFloat32, {5});
    group[1].name = "g/b";
    group[1].input = group[1].output =
        TensorView(b.data(), DataType::kFloat32, {1});
    group[2].name = "g/c";
    group[2].input = group[2].output =
        TensorView(c.data(), DataType::kFloat64, {3});
    auto w = rts[r]->GroupedAllreduce(group);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->Wait(absl::Seconds(30)).ok()) << w->status();
    EXPECT_EQ(a, std::vector<float>(5, n * (n + 1) / 2.0f));
    EXPECT_EQ(b[0], n * (n - 1) * 1.0f);
    EXPECT_EQ(c, std::vector<double>(3, n));
  });
  if (n > 1) {
    // One member with a different shape on the last rank: the whole group
    // fails on every rank, and names the bad member.
    std::vector<absl::Status> status(n);
    OnEachRank(n, [&](int r) {
      std::vector<float> a(4), b(4);
      std::vector<AllreduceRequest> group(2);
      group[0].name = "h/a";
      group[0].input = group[0].output =
          TensorView(a.data(), DataType::kFloat32, {4});
      group[1].name = "h/b";
      group[1].input = group[1].output =
          TensorView(b.data(), DataType::kFloat32, {r == n - 1 ? 2 : 4});
      status[r] = rts[r]->GroupedAllreduce(group)->Wait(absl::Seconds(30));
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument)
          << status[r];
      EXPECT_THAT(std::string(status[r].message()), HasSubstr("h/b"));
    }
  }
  testing::ShutdownJob(rts);
}

TEST_P(Parity, BarrierWaitsForEveryRank) {
  const int n = size();
  auto rts = testing::StartJob(GetParam());
  if (n > 1) {
    auto early = rts[0]->Barrier();
    ASSERT_TRUE(early.ok());
    // Nobody else has arrived: the barrier must not complete.
    EXPECT_EQ(early->Wait(absl::Milliseconds(200)).code(),
              absl::StatusCode::kDeadlineExceeded);
    OnEachRank(n, [&](int r) {
      if (r == 0) return;
      auto w = rts[r]->Barrier();
      ASSERT_TRUE(w.ok());
      EXPECT_TRUE(w->Wait(absl::Seconds(30)).ok()) << w->status();
    });
    EXPECT_TRUE(early->Wait(absl::Seconds(30)).ok()) << early->status();
  }
  // Repeated barriers line up by count.
  OnEachRank(n, [&](int r) {
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(rts[r]->Barrier()->Wait(absl::Seconds(30)).ok());
    }
  });
  testing::ShutdownJob(rts);
}

TEST_P(Parity, JoinWithUnevenSteps) {
  const int n = size();
  for (bool over_world : {false, true}) {
    auto rts = testing::StartJob(GetParam(), [&](Options& o) {
      o.join_average_over_set_size = over_world;
    });
    std::vector<int> last(n, -1);
    OnEachRank(n, [&](int r) {
      // The last rank runs out of data after 5 steps, the others do 8.
      const int steps = (r == n - 1) ? 5 : 8;
      for (int step = 0; step < steps; ++step) {
        std::vector<float> v(3, r + 1.0f);
        AllreduceRequest req;
        req.name = absl::StrCat("join/step", step);
        req.op = ReduceOp::kAverage;
        req.input = req.output = TensorView(v.data(), DataType::kFloat32, {3});
        auto w = rts[r]->Allreduce(req);
        ASSERT_TRUE(w.ok()) << w.status();
        ASSERT_TRUE(w->Wait(absl::Seconds(30)).ok()) << w->status();
        const bool joined = step >= 5 && n > 1;
        const int contributors = joined ? n - 1 : n;
        const float sum = joined ? (n - 1) * n / 2.0f : n * (n + 1) / 2.0f;
        const float want = sum / (over_world ? n : contributors);
        EXPECT_FLOAT_EQ(v[0], want) << "rank " << r << " step " << step;
      }
      if (r != n - 1 && n > 1) {
        // Only sum/average run while a rank has joined.
        std::vector<float> m(2);
        AllreduceRequest max;
        max.name = "join/max";
        max.op = ReduceOp::kMax;
        max.input = max.output = TensorView(m.data(), DataType::kFloat32, {2});
        absl::Status s = rts[r]->Allreduce(max)->Wait(absl::Seconds(30));
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
        EXPECT_THAT(std::string(s.message()),
                    HasSubstr(absl::StrCat("rank ", n - 1, " has joined")));
      }
      auto j = rts[r]->Join();
      ASSERT_TRUE(j.ok()) << j.status();
      last[r] = *j;
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(last[r], last[0]);
    EXPECT_GE(last[0], 0);
    if (n > 1) {
      EXPECT_NE(last[0], n - 1);  // it joined first
    }
    testing::ShutdownJob(rts);
  }
}

// Every transport: one host up to 8 ranks (5: a non-power of two above 4),
// two and three hosts of two ranks (testing::kMaxJobSize: 4 under a
// sanitizer).
INSTANTIATE_TEST_SUITE_P(Transports, Parity,
                         ::testing::ValuesIn(testing::Setups({1, 2, 3, 5, 8},
                                                             {4, 6})),
                         testing::SetupName);

TEST(ProcessSets, RuntimeAndStartupSets) {
  const int n = 4;
  auto rts = testing::StartJob(n, [](Options& o) {
    o.process_sets = {{0, 1}, {2, 3}};
  });
  std::vector<int> added(n, -1);
  OnEachRank(n, [&](int r) {
    auto id = rts[r]->AddProcessSet({1, 3});
    ASSERT_TRUE(id.ok()) << id.status();
    added[r] = *id;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(added[r], 3);
  EXPECT_EQ(*rts[0]->ProcessSetRanks(3), (std::vector<int>{1, 3}));
  OnEachRank(n, [&](int r) {
    // Startup sets: {0,1} is set 1, {2,3} is set 2; broadcast from the
    // set's rank 1 (named by its rank in the job: 1 or 3).
    const int set = r < 2 ? 1 : 2;
    std::vector<float> v(4, static_cast<float>(r));
    BroadcastRequest b;
    b.name = "ps/bcast";
    b.root = r < 2 ? 1 : 3;
    b.process_set = set;
    b.tensor = TensorView(v.data(), DataType::kFloat32, {4});
    ASSERT_TRUE(rts[r]->Broadcast(b)->Wait(absl::Seconds(30)).ok());
    EXPECT_EQ(v[0], r < 2 ? 1.0f : 3.0f);
    // The runtime set {1, 3}.
    std::vector<float> x(2, r + 1.0f);
    AllreduceRequest a;
    a.name = "ps/sum";  // the same name in another set is another tensor
    a.process_set = 3;
    a.input = a.output = TensorView(x.data(), DataType::kFloat32, {2});
    auto w = rts[r]->Allreduce(a);
    if (r == 1 || r == 3) {
      ASSERT_TRUE(w.ok()) << w.status();
      ASSERT_TRUE(w->Wait(absl::Seconds(30)).ok()) << w->status();
      EXPECT_EQ(x[0], 2.0f + 4.0f);
    } else {
      EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(w.status().message()),
                  HasSubstr("is not a member of process set 3"));
    }
    std::vector<float> g(2, 1.0f);
    a.process_set = 0;
    a.input = a.output = TensorView(g.data(), DataType::kFloat32, {2});
    ASSERT_TRUE(rts[r]->Allreduce(a)->Wait(absl::Seconds(30)).ok());
    EXPECT_EQ(g[0], 4.0f);
  });
  // Mismatched ranks in a collective set creation fail on every rank.
  std::vector<absl::Status> status(n);
  OnEachRank(n, [&](int r) {
    status[r] = rts[r]
                    ->AddProcessSet(r == 0 ? std::vector<int>{0, 2}
                                           : std::vector<int>{0, 3})
                    .status();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_THAT(std::string(status[r].message()),
                HasSubstr("process set ranks mismatch"));
  }
  EXPECT_EQ(rts[0]->AddProcessSet({2, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  testing::ShutdownJob(rts);
}

// Note [Sets created by their members]: only the members call it; the
// coordinator (rank 0, outside both sets here) registers the sets too.
TEST(ProcessSets, CreatedByTheirMembersAlone) {
  const int n = 4;
  auto rts = testing::StartJob(n);
  std::vector<int> id(n, -1);
  OnEachRank(n, [&](int r) {
    if (r == 0) return;  // takes no part
    // Two sets at once, by disjoint members: {1, 2} and {3}.
    const std::vector<int> ranks =
        r < 3 ? std::vector<int>{1, 2} : std::vector<int>{3};
    auto made = rts[r]->AddMemberProcessSet(ranks, r < 3 ? "pair" : "single");
    ASSERT_TRUE(made.ok()) << made.status();
    id[r] = *made;
    std::vector<float> x(3, r + 1.0f);
    AllreduceRequest a;
    a.name = "member/sum";
    a.op = ReduceOp::kSum;
    a.process_set = *made;
    a.input = a.output = TensorView(x.data(), DataType::kFloat32, {3});
    auto w = rts[r]->Allreduce(a);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->Wait(absl::Seconds(30)).ok()) << w->status();
    EXPECT_EQ(x[0], r < 3 ? 2.0f + 3.0f : 4.0f);
  });
  EXPECT_EQ(id[1], id[2]);
  EXPECT_NE(id[1], id[3]);
  // Every rank knows both sets once it has run the global set's responses;
  // a global collective after them orders that.
  OnEachRank(n, [&](int r) {
    ASSERT_TRUE(rts[r]->Barrier()->Wait(absl::Seconds(30)).ok());
    EXPECT_EQ(*rts[r]->ProcessSetRanks(id[1]), (std::vector<int>{1, 2}));
    EXPECT_EQ(*rts[r]->ProcessSetRanks(id[3]), (std::vector<int>{3}));
  });
  // A non-member cannot create it; members disagreeing on the ranks fail
  // on every member, naming them.
  auto outsider = rts[0]->AddMemberProcessSet({1, 2}, "outsider");
  EXPECT_EQ(outsider.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(outsider.status().message()),
              HasSubstr("rank 0 is not one of its ranks [1, 2]"));
  std::vector<absl::Status> status(n);
  OnEachRank(n, [&](int r) {
    if (r == 1) {
      status[r] = rts[r]->AddMemberProcessSet({1, 2}, "disputed").status();
    } else if (r == 2) {
      status[r] = rts[r]->AddMemberProcessSet({1, 2, 3}, "disputed").status();
    }
  });
  for (int r : {1, 2}) {
    EXPECT_THAT(std::string(status[r].message()),
                HasSubstr("process set ranks mismatch"))
        << status[r];
  }
  testing::ShutdownJob(rts);
}

// A member that never arrives is named by the op timeout; the ranks outside
// the set are not.
TEST(ProcessSets, MissingMemberIsNamedByTheOpTimeout) {
  const int n = 3;
  auto rts =
      testing::StartJob(n, [](Options& o) { o.op_timeout = absl::Seconds(1); });
  auto lonely = rts[1]->AddMemberProcessSet({1, 2}, "half");
  EXPECT_EQ(lonely.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(
      std::string(lonely.status().message()),
      HasSubstr("waiting for rank 2 to submit it (submitted by rank 1)"));
  testing::ShutdownJob(rts);
}

}  // namespace
}  // namespace kolo
