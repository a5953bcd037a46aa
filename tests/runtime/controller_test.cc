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

// A coordinator for ranks 0..size-1 that does not fuse (one response per
// tensor), so that tests can look at each response.
Coordinator::Config Config(int size, int cache_capacity = 0) {
  Coordinator::Config c;
  for (int r = 0; r < size; ++r) c.global_ranks.push_back(r);
  c.fusion_threshold_bytes = 0;
  c.cache_capacity = cache_capacity;
  return c;
}

std::vector<wire::Response> Take(Coordinator& c) {
  wire::ResponseList list = c.TakeResponseList();
  return {list.responses().begin(), list.responses().end()};
}

TEST(Coordinator, NameBecomesReadyOnlyWhenEveryRankRequestedIt) {
  Coordinator c(Config(3));
  c.AddRequests(0, List({Allreduce("a", {4}), Allreduce("b", {2})}), kT0);
  c.AddRequests(2, List({Allreduce("b", {2})}), kT0);
  EXPECT_FALSE(c.HasReady());
  EXPECT_TRUE(c.HasPartial());
  c.AddRequests(1, List({Allreduce("b", {2})}), kT0);
  ASSERT_TRUE(c.HasReady());
  auto ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ALLREDUCE);
  EXPECT_EQ(ready[0].names(0), "b");
  EXPECT_EQ(ready[0].elements(0), 2);
  EXPECT_EQ(c.PendingNames(), std::vector<std::string>{"a"});
}

TEST(Coordinator, ReadyOrderIsCompletionOrderNotSubmissionOrder) {
  Coordinator c(Config(2));
  c.AddRequests(0, List({Allreduce("x", {1}), Allreduce("y", {1})}), kT0);
  c.AddRequests(1, List({Allreduce("y", {1}), Allreduce("x", {1})}), kT0);
  auto ready = Take(c);
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].names(0), "y");
  EXPECT_EQ(ready[1].names(0), "x");
}

TEST(Coordinator, ExpiryNamesMissingRanks) {
  Coordinator c(Config(4));
  c.AddRequests(0, List({Allreduce("slow", {1})}), kT0);
  c.AddRequests(3, List({Allreduce("slow", {1})}), kT0);
  EXPECT_EQ(c.NextPendingDeadline(absl::Seconds(10)), kT0 + absl::Seconds(10));
  c.ExpireOlderThan(absl::Seconds(10), kT0 + absl::Seconds(9));
  EXPECT_FALSE(c.HasReady());
  c.ExpireOlderThan(absl::Seconds(10), kT0 + absl::Seconds(10));
  auto ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_EQ(ready[0].error_code(),
            static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(ready[0].error(), HasSubstr("waiting for ranks 1, 2 to submit it"));
  EXPECT_THAT(ready[0].error(), HasSubstr("submitted by ranks 0, 3"));
  EXPECT_FALSE(c.HasPartial());
}

TEST(Coordinator, ShutdownFailsNamesTheRankNeverSubmitted) {
  Coordinator c(Config(2));
  c.AddRequests(0, List({Allreduce("orphan", {1})}), kT0);
  c.AddRequests(1, List({}, /*shutdown=*/true), kT0);
  auto ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_THAT(ready[0].error(), HasSubstr("rank 1 shut down without submitting it"));
  // A name submitted after the departure fails too.
  c.AddRequests(0, List({Allreduce("late", {1})}), kT0);
  ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_FALSE(c.AllShutdown());
  c.AddRequests(0, List({}, true), kT0);
  EXPECT_TRUE(c.AllShutdown());
}

TEST(Coordinator, ProcessSetErrorsNameGlobalRanks) {
  Coordinator::Config config = Config(2);
  config.global_ranks = {3, 5};  // a process set of global ranks 3 and 5
  Coordinator c(config);
  c.AddRequests(0, List({Allreduce("p", {2})}), kT0);
  c.AddRequests(1, List({Allreduce("p", {3})}), kT0);
  auto ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_THAT(ready[0].error(),
              HasSubstr("shape mismatch: rank 3 has [2]; rank 5 has [3]"));
}

// A peer's request list may carry any numbers: a shape whose element count
// overflows, or a negative dimension, is an error naming the rank, never
// undefined arithmetic (found by wire_fuzzer under UBSan).
TEST(Coordinator, ForgedShapesAreErrorsNamingTheRank) {
  for (const std::vector<int64_t>& forged :
       {std::vector<int64_t>{int64_t{1} << 40, int64_t{1} << 40},
        std::vector<int64_t>{3, -2}}) {
    Coordinator c(Config(2));
    c.AddRequests(0, List({Allreduce("f", {4})}), kT0);
    c.AddRequests(1, List({Allreduce("f", forged)}), kT0);
    auto ready = Take(c);
    ASSERT_EQ(ready.size(), 1u);
    EXPECT_THAT(ready[0].error(), HasSubstr("rank 1 sent the shape"));
    EXPECT_THAT(ready[0].error(), HasSubstr("no valid element count"));
  }
}

TEST(Coordinator, CachedRequestsTravelAsIdsAndStayValidated) {
  Coordinator c(Config(2, /*cache_capacity=*/8));
  c.AddRequests(0, List({Allreduce("w", {4})}), kT0);
  c.AddRequests(1, List({Allreduce("w", {4})}), kT0);
  auto first = Take(c);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].cache_ids_size(), 0);  // first time: a full response
  const int64_t id = c.cache().Lookup(Allreduce("w", {4}));
  ASSERT_GE(id, 0);
  EXPECT_EQ(c.cache().Lookup(Allreduce("w", {5})), -1);  // other shape: miss

  wire::RequestList hit;
  hit.add_cached_ids(id);
  c.AddRequests(0, hit, kT0);
  c.AddRequests(1, hit, kT0);
  auto second = Take(c);
  ASSERT_EQ(second.size(), 1u);
  ASSERT_EQ(second[0].cache_ids_size(), 1);  // only the id travels
  EXPECT_EQ(second[0].cache_ids(0), id);
  EXPECT_EQ(second[0].names_size(), 0);
  EXPECT_EQ(c.requests_received(), 2);
  EXPECT_EQ(c.cache_hits_received(), 2);

  // One rank by id, the other with a new shape: validated like any request.
  c.AddRequests(0, hit, kT0);
  c.AddRequests(1, List({Allreduce("w", {5})}), kT0);
  auto third = Take(c);
  ASSERT_EQ(third.size(), 1u);
  EXPECT_EQ(third[0].type(), wire::RESPONSE_ERROR);
  EXPECT_THAT(third[0].error(), HasSubstr("rank 0 has [4]; rank 1 has [5]"));
  EXPECT_EQ(c.cache().Lookup(Allreduce("w", {4})), -1);  // erased by the error
}

TEST(ResponseCache, LruEvictionKeepsEvictedIdsUntilAcked) {
  ResponseCache cache(2);
  cache.Insert(Allreduce("a", {1}), 1);
  cache.Insert(Allreduce("b", {1}), 1);
  const int64_t a = cache.Lookup(Allreduce("a", {1}));
  cache.Touch(a);                          // b is now least recently used
  cache.Insert(Allreduce("c", {1}), 2);    // evicts b
  EXPECT_EQ(cache.Lookup(Allreduce("b", {1})), -1);
  EXPECT_GE(cache.Lookup(Allreduce("a", {1})), 0);
  EXPECT_EQ(cache.size(), 2u);
  ASSERT_EQ(cache.graveyard_size(), 1u);
  cache.PruneGraveyard(1);
  EXPECT_EQ(cache.graveyard_size(), 1u);  // evicted by list 2
  cache.PruneGraveyard(2);
  EXPECT_EQ(cache.graveyard_size(), 0u);
}

// The cache's request comparison is written field by field: a field added to
// wire::Request and not compared would let a changed request hit the cache.
TEST(ResponseCache, SameRequestComparesEveryFieldButTheRank) {
  wire::Request base = Allreduce("w", {4, 2});
  base.set_rank(1);
  base.set_group("g");
  base.set_group_size(2);
  base.add_splits(3);
  const google::protobuf::Descriptor* d = wire::Request::descriptor();
  const google::protobuf::Reflection* refl = wire::Request::GetReflection();
  ASSERT_GT(d->field_count(), 10);
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    wire::Request changed = base;
    using F = google::protobuf::FieldDescriptor;
    if (f->is_repeated()) {
      ASSERT_EQ(f->cpp_type(), F::CPPTYPE_INT64) << f->name();
      refl->AddInt64(&changed, f, 7);
    } else {
      switch (f->cpp_type()) {
        case F::CPPTYPE_INT32:
          refl->SetInt32(&changed, f, refl->GetInt32(base, f) + 1);
          break;
        case F::CPPTYPE_INT64:
          refl->SetInt64(&changed, f, refl->GetInt64(base, f) + 1);
          break;
        case F::CPPTYPE_DOUBLE:
          refl->SetDouble(&changed, f, refl->GetDouble(base, f) + 0.5);
          break;
        case F::CPPTYPE_STRING:
          refl->SetString(&changed, f, refl->GetString(base, f) + "x");
          break;
        case F::CPPTYPE_ENUM:
          refl->SetEnumValue(&changed, f, refl->GetEnumValue(base, f) + 1);
          break;
        default:
          FAIL() << "field " << f->name() << ": add its type to this test";
      }
    }
    EXPECT_EQ(SameRequest(base, changed), f->name() == "rank") << f->name();
  }
  // -0.0 and 0.0 travel as different bytes: different requests.
  wire::Request zero = base, minus_zero = base;
  zero.set_prescale(0.0);
  minus_zero.set_prescale(-0.0);
  EXPECT_FALSE(SameRequest(zero, minus_zero));
}

TEST(Coordinator, GroupIsReleasedWholeAndFailsWhole) {
  Coordinator c(Config(2));
  auto member = [](const std::string& name, std::vector<int64_t> shape) {
    wire::Request r = Allreduce(name, shape);
    r.set_group("g1+1");
    r.set_group_size(2);
    return r;
  };
  c.AddRequests(0, List({member("g1", {1}), member("g2", {1})}), kT0);
  c.AddRequests(1, List({member("g1", {1})}), kT0);
  EXPECT_FALSE(c.HasReady());  // g1 is ready but waits for g2
  c.AddRequests(1, List({member("g2", {2})}), kT0);
  auto ready = Take(c);
  ASSERT_EQ(ready.size(), 2u);
  for (const auto& r : ready) {
    EXPECT_EQ(r.type(), wire::RESPONSE_ERROR) << r.names(0);
  }
  EXPECT_THAT(ready[0].error(), HasSubstr("failed because of another member"));
}

TEST(Coordinator, JoinedRanksCountForSumsOnlyAndJoinReturnsLastRank) {
  Coordinator c(Config(3));
  wire::Request join;
  join.set_type(wire::JOIN);
  join.set_name("__kolo_join__");
  c.AddRequests(2, List({join}), kT0);
  wire::Request avg = Allreduce("avg", {4});
  avg.set_op(static_cast<int>(ReduceOp::kAverage));
  wire::Request mx = Allreduce("max", {4});
  mx.set_op(static_cast<int>(ReduceOp::kMax));
  c.AddRequests(0, List({avg, mx}), kT0);
  c.AddRequests(1, List({avg, mx}), kT0);
  auto ready = Take(c);
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ALLREDUCE);
  EXPECT_EQ(ready[0].contributors(), 2);
  EXPECT_EQ(ready[1].type(), wire::RESPONSE_ERROR);
  EXPECT_EQ(ready[1].error_code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(ready[1].error(), HasSubstr("rank 2 has joined"));
  c.AddRequests(0, List({join}), kT0);
  c.AddRequests(1, List({join}), kT0);
  ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_JOIN);
  EXPECT_EQ(ready[0].value(), 1);
}

TEST(Coordinator, StallReportNamesMissingRanksOnce) {
  Coordinator c(Config(3));
  c.AddRequests(0, List({Allreduce("A", {1}), Allreduce("B", {1})}), kT0);
  c.AddRequests(1, List({Allreduce("B", {1})}), kT0);
  EXPECT_TRUE(c.StallReport(absl::Seconds(2), kT0 + absl::Seconds(1)).empty());
  EXPECT_EQ(c.NextStallCheck(absl::Seconds(2)), kT0 + absl::Seconds(2));
  auto lines = c.StallReport(absl::Seconds(2), kT0 + absl::Seconds(2));
  EXPECT_EQ(lines, (std::vector<std::string>{"rank 1: [A]", "rank 2: [A, B]"}));
  EXPECT_TRUE(c.StallReport(absl::Seconds(2), kT0 + absl::Seconds(3)).empty());
  EXPECT_EQ(c.NextStallCheck(absl::Seconds(2)), absl::InfiniteFuture());
  EXPECT_FALSE(c.StalledPast(absl::Seconds(5), kT0 + absl::Seconds(4)));
  auto stalled = c.StalledPast(absl::Seconds(5), kT0 + absl::Seconds(5));
  ASSERT_TRUE(stalled.has_value());
  EXPECT_THAT(*stalled, HasSubstr("for ranks 1, 2 to submit it"));
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
  EXPECT_THAT(r.error(), HasSubstr("device mismatch: rank 0 has cpu; rank 1 has cuda"));
}

TEST(BuildResponse, AScalarToGatherIsAnErrorNotACrash) {
  // Submit rejects it; a peer's request list may still carry it.
  wire::Request a = Allreduce("g", {});
  a.set_type(wire::ALLGATHER);
  wire::Request b = a;
  b.add_shape(3);
  wire::Response r = BuildResponse({a, b});
  ASSERT_EQ(r.type(), wire::RESPONSE_ERROR);
  EXPECT_THAT(r.error(), HasSubstr("rank 0 sent a scalar"));
}

TEST(BuildResponse, EachRankMayUseItsOwnGpu) {
  wire::Request a = Allreduce("d", {1});
  a.set_device_type(static_cast<int>(DeviceType::kCuda));
  a.set_device_index(0);
  wire::Request b = a;
  b.set_device_index(1);
  wire::Response r = BuildResponse({a, b});
  ASSERT_EQ(r.type(), wire::RESPONSE_ALLREDUCE) << r.error();
  EXPECT_EQ(r.device_type(), static_cast<int>(DeviceType::kCuda));
}

}  // namespace
}  // namespace kolo
