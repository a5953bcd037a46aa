// Unit tests of the fusion planner.
#include "runtime/negotiation/fusion.h"

#include "gtest/gtest.h"
#include "kolo/types.h"

namespace kolo {
namespace {

wire::Response Allreduce(const std::string& name, int64_t elements,
                         DataType dtype = DataType::kFloat32,
                         ReduceOp op = ReduceOp::kSum) {
  wire::Response r;
  r.set_type(wire::RESPONSE_ALLREDUCE);
  r.add_names(name);
  r.add_elements(elements);
  r.set_dtype(static_cast<int>(dtype));
  r.set_op(static_cast<int>(op));
  r.set_prescale(1);
  r.set_postscale(1);
  return r;
}

// What the coordinator does with a list of ready responses: PlanBuckets,
// then FuseBucket for each bucket.
std::vector<wire::Response> PlanFusion(std::vector<wire::Response> ready,
                                       int64_t threshold_bytes,
                                       int world_size) {
  std::vector<const wire::Response*> ptrs;
  for (const wire::Response& r : ready) ptrs.push_back(&r);
  std::vector<wire::Response> buckets;
  for (const auto& members : PlanBuckets(ptrs, threshold_bytes, world_size)) {
    buckets.push_back(FuseBucket(ptrs, members));
  }
  return buckets;
}

std::vector<std::vector<std::string>> Names(
    const std::vector<wire::Response>& plan) {
  std::vector<std::vector<std::string>> out;
  for (const auto& r : plan)
    out.emplace_back(r.names().begin(), r.names().end());
  return out;
}

TEST(PlanFusion, FusesCompatibleUpToThreshold) {
  // 4 tensors of 400 bytes, threshold 1000: two buckets of two.
  auto plan = PlanFusion({Allreduce("a", 100), Allreduce("b", 100),
                          Allreduce("c", 100), Allreduce("d", 100)},
                         1000, 2);
  EXPECT_EQ(Names(plan),
            (std::vector<std::vector<std::string>>{{"a", "b"}, {"c", "d"}}));
  EXPECT_EQ(plan[0].elements_size(), 2);
}

TEST(PlanFusion, KeepsIncompatibleApartAndOrderByFirstMember) {
  auto plan =
      PlanFusion({Allreduce("f1", 10), Allreduce("i1", 10, DataType::kInt32),
                  Allreduce("f2", 10),
                  Allreduce("m1", 10, DataType::kFloat32, ReduceOp::kMax),
                  Allreduce("i2", 10, DataType::kInt32)},
                 1 << 20, 2);
  EXPECT_EQ(Names(plan), (std::vector<std::vector<std::string>>{
                             {"f1", "f2"}, {"i1", "i2"}, {"m1"}}));
}

TEST(PlanFusion, LargeTensorRunsAloneAndZeroThresholdDisables) {
  auto plan = PlanFusion(
      {Allreduce("small", 1), Allreduce("huge", 1000), Allreduce("s2", 1)}, 100,
      2);
  EXPECT_EQ(Names(plan),
            (std::vector<std::vector<std::string>>{{"small", "s2"}, {"huge"}}));
  plan = PlanFusion({Allreduce("a", 1), Allreduce("b", 1)}, 0, 2);
  EXPECT_EQ(plan.size(), 2u);
}

TEST(PlanFusion, ErrorsAndBroadcastRootsAreNotMixed) {
  wire::Response err;
  err.set_type(wire::RESPONSE_ERROR);
  err.add_names("bad");
  wire::Response b0 = Allreduce("b0", 4);
  b0.set_type(wire::RESPONSE_BROADCAST);
  wire::Response b1 = b0;
  b1.set_names(0, "b1");
  b1.set_root(1);
  wire::Response b2 = b0;
  b2.set_names(0, "b2");
  auto plan = PlanFusion({err, b0, b1, b2}, 1 << 20, 2);
  EXPECT_EQ(Names(plan), (std::vector<std::vector<std::string>>{
                             {"bad"}, {"b0", "b2"}, {"b1"}}));
}

TEST(ResponseBytes, AllgatherCountsEveryRank) {
  wire::Response g;
  g.set_type(wire::RESPONSE_ALLGATHER);
  g.set_dtype(static_cast<int>(DataType::kFloat64));
  g.add_names("g");
  g.add_elements(3);  // row of 3 doubles
  g.add_first_dims(1);
  g.add_first_dims(4);
  EXPECT_EQ(ResponseBytes(g, 2), (1 + 4) * 3 * 8);
}

}  // namespace
}  // namespace kolo
