#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

TEST(Smoke, AllreduceTwoRanks) {
  auto rts = testing::StartJob(2);
  testing::OnEachRank(2, [&](int r) {
    std::vector<float> data(10, r + 1.0f);
    AllreduceRequest req;
    req.name = "x";
    req.input = TensorView(data.data(), DataType::kFloat32, {10});
    req.output = req.input;
    auto work = rts[r]->Allreduce(req);
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_TRUE(work->Wait(absl::Seconds(20)).ok()) << work->status();
    for (float v : data) EXPECT_EQ(v, 3.0f);
  });
  testing::ShutdownJob(rts);
}

}  // namespace
}  // namespace kolo
