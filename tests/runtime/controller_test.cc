// Unit tests of the coordinator's negotiation logic (no network).
#include "runtime/controller.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/status/status.h"
#include "kolo/types.h"

namespace kolo {
namespace {

using ::testing::HasSubstr;

wire::Request Allreduce(const std::string& name, std::vector<int64_t> shape,
                        DataType dtype = DataType::kFloat32) {
  wire::Request r;
  r.set_name(name);
  r.set_type(wire::ALLREDUCE);
  r.set_dtype(static_cast<int>(dtype));
  for (int64_t d : shape) r.add_shape(d);
  r.set_prescale(1);
  r.set_postscale(1);
  return r;
}

wire::RequestList List(std::vector<wire::Request> requests, bool shutdown = false) {
  wire::RequestList l;
  for (auto& r : requests) *l.add_requests() = r;
  l.set_shutdown(shutdown);
  return l;
}

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(Coordinator, NameBecomesReadyOnlyWhenEveryRankRequestedIt) {
  Coordinator c(3);
  c.AddRequests(0, List({Allreduce("a", {4}), Allreduce("b", {2})}), kT0);
  c.AddRequests(2, List({Allreduce("b", {2})}), kT0);
  EXPECT_FALSE(c.HasReady());
  EXPECT_TRUE(c.HasPartial());
  c.AddRequests(1, List({Allreduce("b", {2})}), kT0);
  ASSERT_TRUE(c.HasReady());
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ALLREDUCE);
  EXPECT_EQ(ready[0].names(0), "b");
  EXPECT_EQ(ready[0].elements(0), 2);
  EXPECT_EQ(c.PendingNames(), std::vector<std::string>{"a"});
}

TEST(Coordinator, ReadyOrderIsCompletionOrderNotSubmissionOrder) {
  Coordinator c(2);
  c.AddRequests(0, List({Allreduce("x", {1}), Allreduce("y", {1})}), kT0);
  c.AddRequests(1, List({Allreduce("y", {1}), Allreduce("x", {1})}), kT0);
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].names(0), "y");
  EXPECT_EQ(ready[1].names(0), "x");
}

TEST(Coordinator, ExpiryNamesMissingRanks) {
  Coordinator c(4);
  c.AddRequests(0, List({Allreduce("slow", {1})}), kT0);
  c.AddRequests(3, List({Allreduce("slow", {1})}), kT0);
  EXPECT_EQ(c.NextExpiry(absl::Seconds(10)), kT0 + absl::Seconds(10));
  c.ExpireOlderThan(absl::Seconds(10), kT0 + absl::Seconds(9));
  EXPECT_FALSE(c.HasReady());
  c.ExpireOlderThan(absl::Seconds(10), kT0 + absl::Seconds(10));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_EQ(ready[0].error_code(),
            static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(ready[0].error(), HasSubstr("waiting for ranks 1, 2 to submit it"));
  EXPECT_THAT(ready[0].error(), HasSubstr("submitted by ranks 0, 3"));
  EXPECT_FALSE(c.HasPartial());
}

TEST(Coordinator, ShutdownFailsNamesTheRankNeverSubmitted) {
  Coordinator c(2);
  c.AddRequests(0, List({Allreduce("orphan", {1})}), kT0);
  c.AddRequests(1, List({}, /*shutdown=*/true), kT0);
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_THAT(ready[0].error(), HasSubstr("rank 1 shut down without submitting it"));
  // A name submitted after the departure fails too.
  c.AddRequests(0, List({Allreduce("late", {1})}), kT0);
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_FALSE(c.AllShutdown());
  c.AddRequests(0, List({}, true), kT0);
  EXPECT_TRUE(c.AllShutdown());
}

TEST(BuildResponse, AllgatherCollectsFirstDimsAndChecksTrailingShape) {
  wire::Request a = Allreduce("g", {2, 3});
  a.set_type(wire::ALLGATHER);
  wire::Request b = a;
  b.set_shape(0, 5);
  wire::Response r = BuildResponse({a, b});
  ASSERT_EQ(r.type(), wire::RESPONSE_ALLGATHER);
  EXPECT_EQ(r.elements(0), 3);
  EXPECT_EQ(std::vector<int64_t>(r.first_dims().begin(), r.first_dims().end()),
            (std::vector<int64_t>{2, 5}));
  b.set_shape(1, 4);
  r = BuildResponse({a, b});
  ASSERT_EQ(r.type(), wire::RESPONSE_ERROR);
  EXPECT_THAT(r.error(), HasSubstr("rank 0 has rank-2 shape [*,3]; rank 1 has "
                                   "rank-2 shape [*,4]"));
}

TEST(BuildResponse, DeviceMismatchIsAnError) {
  wire::Request a = Allreduce("d", {1});
  wire::Request b = a;
  b.set_device_type(static_cast<int>(DeviceType::kCuda));
  wire::Response r = BuildResponse({a, b});
  ASSERT_EQ(r.type(), wire::RESPONSE_ERROR);
  EXPECT_THAT(r.error(), HasSubstr("device mismatch: rank 0 has cpu; rank 1 has cuda:0"));
}

}  // namespace
}  // namespace kolo
