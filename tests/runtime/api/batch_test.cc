// Runtime::AllreduceBatch: many allreduces in one call, each its own
// collective, all or none submitted. N Runtimes as threads of one process
// (tests/testing/local_job.h), over every transport (testing::Setup).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

using testing::Counts;
using testing::OnEachRank;

class Batch : public ::testing::TestWithParam<testing::Setup> {
 protected:
  int size() const { return GetParam().size; }
};

// Element counts of the batch's tensors: empty, one, odd, larger than the
// shared-memory small path.
const std::vector<int64_t> kCounts = {0, 1, 7, 1000, 3, 70000};

AllreduceRequest Request(const std::string& name, std::vector<float>& data) {
  AllreduceRequest req;
  req.name = name;
  req.input = req.output = TensorView(data.data(), DataType::kFloat32,
                                      {static_cast<int64_t>(data.size())});
  return req;
}

// Even ranks submit a batch, odd ranks the same names one call each in
// reverse order; several steps, so that later ones run from the response
// cache and on recycled entries. Every rank gets every sum.
TEST_P(Batch, MatchesOneCallPerTensor) {
  const int n = size();
  auto rts = testing::StartJob(GetParam());
  OnEachRank(n, [&](int r) {
    for (int step = 0; step < 4; ++step) {
      std::vector<std::vector<float>> data(kCounts.size());
      std::vector<AllreduceRequest> requests;
      for (size_t t = 0; t < kCounts.size(); ++t) {
        data[t].resize(kCounts[t]);
        for (int64_t i = 0; i < kCounts[t]; ++i) {
          data[t][i] = static_cast<float>(r + 1 + step + i % 5);
        }
        requests.push_back(Request(absl::StrCat("batch/", t), data[t]));
      }
      std::vector<Work> works;
      if (r % 2 == 0) {
        auto batch = rts[r]->AllreduceBatch(requests);
        ASSERT_TRUE(batch.ok()) << batch.status();
        works = *batch;
      } else {
        works.resize(requests.size());
        for (size_t t = requests.size(); t-- > 0;) {
          auto w = rts[r]->Allreduce(requests[t]);
          ASSERT_TRUE(w.ok()) << w.status();
          works[t] = *w;
        }
      }
      ASSERT_EQ(works.size(), kCounts.size());
      for (size_t t = 0; t < works.size(); ++t) {
        ASSERT_TRUE(works[t].Wait(absl::Seconds(30)).ok())
            << "rank " << r << " tensor " << t << ": " << works[t].status();
        for (int64_t i = 0; i < kCounts[t]; ++i) {
          float expected = 0;
          for (int q = 0; q < n; ++q) expected += q + 1 + step + i % 5;
          ASSERT_EQ(data[t][i], expected) << "rank " << r << " step " << step
                                          << " tensor " << t << "[" << i << "]";
        }
      }
    }
  });
  const RuntimeStats stats = rts[0]->stats();
  const Counts counters = rts[0]->Counters();
  EXPECT_EQ(stats.tensors_executed, static_cast<int64_t>(4 * kCounts.size()));
  if (n > 1) {
    EXPECT_GT(counters.at("negotiation.cache_hits_sent"), 0);
  }
  testing::ShutdownJob(rts);
}

// A bad member, a name in flight or a name twice fails the whole call and
// submits nothing: afterwards the same names go through one by one.
TEST_P(Batch, RefusesAllOrNone) {
  const int n = size();
  auto rts = testing::StartJob(GetParam());
  std::vector<std::vector<float>> data(n, std::vector<float>(4, 1.0f));
  std::vector<std::vector<float>> other(n, std::vector<float>(4, 1.0f));
  std::vector<float> wrong(5);

  // A member whose output does not match its input: named.
  std::vector<AllreduceRequest> bad = {Request("a", data[0]),
                                       Request("b", other[0])};
  bad[1].output = TensorView(wrong.data(), DataType::kFloat32, {5});
  auto refused = rts[0]->AllreduceBatch(bad);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("\"b\""), std::string::npos)
      << refused.status();

  // A process set that does not exist, after a member of the global one:
  // each run of one set is checked.
  std::vector<AllreduceRequest> unknown_set = {Request("a", data[0]),
                                               Request("c", other[0])};
  unknown_set[1].process_set = 99;
  refused = rts[0]->AllreduceBatch(unknown_set);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("\"c\""), std::string::npos)
      << refused.status();

  // A name twice.
  std::vector<AllreduceRequest> twice = {
      Request("a", data[0]), Request("c", other[0]), Request("a", other[0])};
  refused = rts[0]->AllreduceBatch(twice);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("given twice"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("\"a\""), std::string::npos);

  // A name already in flight on rank 0 ("b", submitted alone; it stays in
  // flight until the other ranks submit it below; a job of one rank runs
  // it at once, so there it may be gone already).
  std::vector<float> b_data(4, 1.0f);
  auto b_alone = rts[0]->Allreduce(Request("b", b_data));
  ASSERT_TRUE(b_alone.ok()) << b_alone.status();
  if (n > 1) {
    std::vector<AllreduceRequest> in_flight = {Request("a", data[0]),
                                               Request("b", other[0])};
    refused = rts[0]->AllreduceBatch(in_flight);
    ASSERT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_NE(refused.status().message().find("\"b\""), std::string::npos);
  }

  // None of "a" and "c" was queued on rank 0: each goes through now.
  OnEachRank(n, [&](int r) {
    std::vector<Work> works;
    for (const char* name : {"a", "c"}) {
      auto w = rts[r]->Allreduce(
          Request(name, std::string(name) == "a" ? data[r] : other[r]));
      ASSERT_TRUE(w.ok()) << "rank " << r << " " << name << ": " << w.status();
      works.push_back(*w);
    }
    if (r != 0) {
      std::vector<float> mine(4, 1.0f);
      auto w = rts[r]->Allreduce(Request("b", mine));
      ASSERT_TRUE(w.ok()) << w.status();
      ASSERT_TRUE(w->Wait(absl::Seconds(30)).ok()) << w->status();
    } else {
      ASSERT_TRUE(b_alone->Wait(absl::Seconds(30)).ok()) << b_alone->status();
    }
    for (Work& w : works) ASSERT_TRUE(w.Wait(absl::Seconds(30)).ok());
    EXPECT_EQ(data[r][0], static_cast<float>(n));
    EXPECT_EQ(other[r][3], static_cast<float>(n));
  });
  EXPECT_EQ(b_data[0], static_cast<float>(n));

  // An empty batch submits nothing.
  auto empty = rts[0]->AllreduceBatch({});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
  testing::ShutdownJob(rts);

  std::vector<AllreduceRequest> late = {Request("late", data[0])};
  EXPECT_EQ(rts[0]->AllreduceBatch(late).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(Transports, Batch,
                         ::testing::ValuesIn(testing::Setups({1, 2, 3, 5},
                                                             {4, 6})),
                         testing::SetupName);

}  // namespace
}  // namespace kolo
