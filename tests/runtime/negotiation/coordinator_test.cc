// Unit tests of the coordinator's negotiation logic (no network).
#include "runtime/negotiation/coordinator.h"

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

wire::RequestList List(std::vector<wire::Request> requests,
                       bool shutdown = false) {
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
  EXPECT_THAT(ready[0].error(),
              HasSubstr("waiting for ranks 1, 2 to submit it"));
  EXPECT_THAT(ready[0].error(), HasSubstr("submitted by ranks 0, 3"));
  EXPECT_FALSE(c.HasPartial());
}

wire::Request WithTimeout(wire::Request r, absl::Duration timeout) {
  r.set_timeout_us(absl::ToInt64Microseconds(timeout));
  return r;
}

// Note [Request timeouts]: a request's own timeout, the shortest where the
// ranks' differ, named in the error; the others keep the job's.
TEST(Coordinator, ARequestsOwnTimeoutExpiresItAndTheErrorSaysWhich) {
  Coordinator c(Config(3));
  c.AddRequests(0,
                List({WithTimeout(Allreduce("short", {1}), absl::Seconds(5)),
                      Allreduce("long", {1})}),
                kT0);
  c.AddRequests(1,
                List({WithTimeout(Allreduce("short", {1}), absl::Seconds(2))}),
                kT0 + absl::Milliseconds(100));
  EXPECT_EQ(c.ShortestTimeout(absl::Seconds(10)), absl::Seconds(2));
  EXPECT_EQ(c.NextTimeout(absl::Seconds(10)), kT0 + absl::Seconds(2));
  c.ExpireOlderThan(absl::Seconds(10), kT0 + absl::Milliseconds(1999));
  EXPECT_FALSE(c.HasReady());
  c.ExpireOlderThan(absl::Seconds(10), kT0 + absl::Seconds(2));
  auto first = Take(c);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].type(), wire::RESPONSE_ERROR);
  EXPECT_EQ(first[0].names(0), "short");
  EXPECT_EQ(first[0].error_code(),
            static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(first[0].error(),
              HasSubstr("timed out after 2 s (the request's timeout) waiting "
                        "for rank 2 to submit it (submitted by ranks 0, 1)"));
  EXPECT_EQ(c.PendingNames(), std::vector<std::string>{"long"});
  EXPECT_EQ(c.NextTimeout(absl::Seconds(10)), kT0 + absl::Seconds(10));
  c.ExpireOlderThan(absl::Seconds(10), kT0 + absl::Seconds(10));
  auto second = Take(c);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].names(0), "long");
  EXPECT_THAT(second[0].error(),
              HasSubstr("timed out after 10 s (KOLO_OP_TIMEOUT)"));
  EXPECT_FALSE(c.HasPartial());
}

TEST(Coordinator, ShutdownFailsNamesTheRankNeverSubmitted) {
  Coordinator c(Config(2));
  c.AddRequests(0, List({Allreduce("orphan", {1})}), kT0);
  c.AddRequests(1, List({}, /*shutdown=*/true), kT0);
  auto ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_THAT(ready[0].error(),
              HasSubstr("rank 1 shut down without submitting it"));
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

// Note [Cache hits as bits]: three ranks, names "a" and "b" in the cache.
class CacheHitsTest : public ::testing::Test {
 protected:
  explicit CacheHitsTest(int capacity = 8) : c_(Config(3, capacity)) {}
  void SetUp() override {
    for (int r = 0; r < 3; ++r) {
      c_.AddRequests(r, List({Allreduce("a", {4}), Allreduce("b", {2})}), kT0);
    }
    ASSERT_EQ(Take(c_).size(), 2u);
    a_ = c_.cache().Lookup(Allreduce("a", {4}));
    b_ = c_.cache().Lookup(Allreduce("b", {2}));
    ASSERT_GE(a_, 0);
    ASSERT_GE(b_, 0);
  }
  static wire::RequestList Ids(std::vector<int64_t> ids) {
    wire::RequestList l;
    for (int64_t id : ids) l.add_cached_ids(id);
    return l;
  }
  Coordinator c_;
  int64_t a_ = -1, b_ = -1;
};

TEST_F(CacheHitsTest, SteadyStateHitsTakeNoSlotAndRunFromTheCache) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    c_.AddRequests(0, Ids({a_, b_}), kT0);
    c_.AddRequests(1, Ids({b_, a_}), kT0);
    EXPECT_FALSE(c_.HasReady());
    EXPECT_TRUE(c_.HasPartial());
    EXPECT_EQ(c_.SlowPathNames(), 0u);
    EXPECT_EQ(c_.PendingNames(), (std::vector<std::string>{"a", "b"}));
    c_.AddRequests(1, Ids({a_}), kT0);  // Twice from one rank: counted once.
    EXPECT_FALSE(c_.HasReady());
    c_.AddRequests(2, Ids({a_, b_}), kT0);
    EXPECT_FALSE(c_.HasPartial());
    auto ready = Take(c_);
    ASSERT_EQ(ready.size(), 2u);
    EXPECT_THAT(ready[0].cache_ids(), ::testing::ElementsAre(a_));
    EXPECT_THAT(ready[1].cache_ids(), ::testing::ElementsAre(b_));
    EXPECT_EQ(c_.SlowPathNames(), 0u);
    EXPECT_TRUE(c_.PendingNames().empty());
  }
}

// The ids of a step travel as bits (AddCacheHits picks bits when they are
// dense): the same negotiation as the list, and a hostile base costs
// nothing.
TEST_F(CacheHitsTest, HitsAsBitsOnTheWireNegotiateLikeTheList) {
  std::vector<int64_t> ids = {b_, a_};
  wire::RequestList bits;
  AddCacheHits(&ids, &bits, HitEncoding::kBits);
  EXPECT_EQ(bits.cached_ids_size(), 0);
  ASSERT_EQ(bits.hit_bits_size(), 1);
  std::vector<int64_t> read;
  ForEachCacheHit(bits, [&](int64_t id) { read.push_back(id); });
  EXPECT_EQ(read, (std::vector<int64_t>{a_, b_}));
  c_.AddRequests(0, bits, kT0);
  c_.AddRequests(1, Ids({a_, b_}), kT0);  // one rank as a list
  EXPECT_FALSE(c_.HasReady());
  c_.AddRequests(2, bits, kT0);
  auto ready = Take(c_);
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_THAT(ready[0].cache_ids(), ::testing::ElementsAre(a_));

  wire::RequestList hostile;
  hostile.set_hit_base(INT64_MAX - 3);
  hostile.add_hit_bits(~uint64_t{0});
  int seen = 0;
  ForEachCacheHit(hostile, [&](int64_t id) {
    EXPECT_GE(id, INT64_MAX - 3);
    ++seen;
  });
  EXPECT_EQ(seen, 4);  // up to INT64_MAX, no overflow
  c_.AddRequests(0, hostile, kT0);
  EXPECT_FALSE(c_.HasPartial());  // unknown ids: nothing pending

  // Compact (the runtime's choice): a few neighbouring ids go as bits,
  // scattered ones as a list.
  std::vector<int64_t> dense;
  for (int64_t i = 100; i < 200; ++i) dense.push_back(i);
  wire::RequestList step;
  AddCacheHits(&dense, &step);
  EXPECT_EQ(step.hit_bits_size(), 2);
  EXPECT_EQ(step.cached_ids_size(), 0);
  std::vector<int64_t> scattered = {1, 1000, 100000, 5, 7, 9, 11, 13};
  wire::RequestList sparse;
  AddCacheHits(&scattered, &sparse);
  EXPECT_EQ(sparse.hit_bits_size(), 0);
  EXPECT_EQ(sparse.cached_ids_size(), 8);
}

TEST_F(CacheHitsTest, APartlySentHitTimesOutNamingTheRankThatDidNotSendIt) {
  c_.AddRequests(0, Ids({a_}), kT0);
  c_.AddRequests(2, Ids({a_}), kT0 + absl::Seconds(1));
  EXPECT_EQ(c_.NextPendingDeadline(absl::Seconds(5)), kT0 + absl::Seconds(5));
  c_.ExpireOlderThan(absl::Seconds(5), kT0 + absl::Seconds(4));
  EXPECT_FALSE(c_.HasReady());
  c_.ExpireOlderThan(absl::Seconds(5), kT0 + absl::Seconds(5));
  auto ready = Take(c_);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_EQ(ready[0].error_code(),
            static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(ready[0].error(),
              HasSubstr("waiting for rank 1 to submit it (submitted by "
                        "ranks 0, 2)"));
  EXPECT_FALSE(c_.HasPartial());
}

// A hit carries its cached request's timeout: the coordinator looks at
// partly sent hits once the shortest timeout of the set could have passed.
TEST_F(CacheHitsTest, AHitTimesOutAfterItsCachedRequestsOwnTimeout) {
  const wire::Request c3 = WithTimeout(Allreduce("c", {3}), absl::Seconds(3));
  for (int r = 0; r < 3; ++r) c_.AddRequests(r, List({c3}), kT0);
  ASSERT_EQ(Take(c_).size(), 1u);
  const int64_t c = c_.cache().Lookup(c3);
  ASSERT_GE(c, 0);
  EXPECT_EQ(c_.cache().Lookup(Allreduce("c", {3})), -1);  // timeout differs
  const absl::Time t = kT0 + absl::Seconds(100);
  c_.AddRequests(0, Ids({c, a_}), t);
  c_.AddRequests(2, Ids({c, a_}), t);
  EXPECT_EQ(c_.SlowPathNames(), 0u);
  EXPECT_EQ(c_.NextTimeout(absl::Seconds(10)), t + absl::Seconds(3));
  c_.ExpireOlderThan(absl::Seconds(10), t + absl::Seconds(3));
  auto ready = Take(c_);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].names(0), "c");
  EXPECT_THAT(ready[0].error(),
              HasSubstr("timed out after 3 s (the request's timeout) waiting "
                        "for rank 1 to submit it"));
  // "a" (the job's timeout) waits on.
  EXPECT_EQ(c_.PendingNames(), std::vector<std::string>{"a"});
  EXPECT_EQ(c_.NextTimeout(absl::Seconds(10)), t + absl::Seconds(10));
  c_.AddRequests(1, Ids({a_}), t + absl::Seconds(4));
  ASSERT_EQ(Take(c_).size(), 1u);
  EXPECT_FALSE(c_.HasPartial());
}

TEST_F(CacheHitsTest, StallReportAndStallShutdownNameTheMissingRank) {
  c_.AddRequests(0, Ids({a_, b_}), kT0);
  c_.AddRequests(1, Ids({a_, b_}), kT0);
  EXPECT_TRUE(c_.StallReport(absl::Seconds(2), kT0 + absl::Seconds(1)).empty());
  EXPECT_EQ(c_.NextStallCheck(absl::Seconds(2)), kT0 + absl::Seconds(2));
  EXPECT_THAT(c_.StallReport(absl::Seconds(2), kT0 + absl::Seconds(2)),
              ::testing::ElementsAre("rank 2: [a, b]"));
  auto stalled = c_.StalledPast(absl::Seconds(3), kT0 + absl::Seconds(3));
  ASSERT_TRUE(stalled.has_value());
  EXPECT_THAT(*stalled, HasSubstr("for rank 2 to submit it"));
  // Still served once rank 2 sends them (now on the slow path).
  c_.AddRequests(2, Ids({a_, b_}), kT0 + absl::Seconds(3));
  auto ready = Take(c_);
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ALLREDUCE);
  EXPECT_EQ(c_.SlowPathNames(), 0u);
}

TEST_F(CacheHitsTest, AChangedRequestMeetsTheHitsOfItsNameEitherOrder) {
  // Hits first, then the changed request.
  c_.AddRequests(0, Ids({a_}), kT0);
  c_.AddRequests(2, Ids({a_}), kT0);
  c_.AddRequests(1, List({Allreduce("a", {5})}), kT0);
  auto ready = Take(c_);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_THAT(ready[0].error(),
              HasSubstr("ranks 0, 2 have [4]; rank 1 has [5]"));
  // The changed request first, then hits of the (current) id of "b".
  c_.AddRequests(1, List({Allreduce("b", {3})}), kT0);
  c_.AddRequests(0, Ids({b_}), kT0);
  c_.AddRequests(2, Ids({b_}), kT0);
  ready = Take(c_);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_THAT(ready[0].error(),
              HasSubstr("ranks 0, 2 have [2]; rank 1 has [3]"));
  EXPECT_FALSE(c_.HasPartial());
}

TEST_F(CacheHitsTest, AShutdownFailsTheHitsTheRankNeverSent) {
  c_.AddRequests(0, Ids({a_}), kT0);
  c_.AddRequests(1, Ids({a_}), kT0);
  c_.AddRequests(2, List({}, /*shutdown=*/true), kT0);
  auto ready = Take(c_);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_EQ(ready[0].error_code(),
            static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_THAT(ready[0].error(),
              HasSubstr("rank 2 shut down without submitting it (submitted "
                        "by ranks 0, 1)"));
}

TEST_F(CacheHitsTest, AJoinCompletesTheHitsOfTheOthers) {
  c_.AddRequests(0, Ids({a_}), kT0);
  c_.AddRequests(1, Ids({a_}), kT0);
  wire::Request join;
  join.set_type(wire::JOIN);
  join.set_name("__kolo_join__");
  c_.AddRequests(2, List({join}), kT0);
  auto ready = Take(c_);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ALLREDUCE);
  EXPECT_EQ(ready[0].names(0), "a");
  EXPECT_EQ(ready[0].contributors(), 2);
  // While a rank has joined, hits go by the slow path too.
  c_.AddRequests(0, Ids({b_}), kT0);
  EXPECT_EQ(c_.SlowPathNames(), 1u);
}

class SmallCacheHitsTest : public CacheHitsTest {
 protected:
  SmallCacheHitsTest() : CacheHitsTest(/*capacity=*/2) {}
};

// Ranks 0 and 1 sent "a" as an id; then "c" enters the cache and evicts
// "a". Rank 2, having executed that list, no longer knows the id and sends
// "a" in full: it must meet the others' hits, not wait for them forever.
TEST_F(SmallCacheHitsTest, AnEvictedHitMeetsTheFullRequestOfTheLastRank) {
  c_.AddRequests(0, Ids({a_}), kT0);
  c_.AddRequests(1, Ids({a_}), kT0);
  for (int r = 0; r < 3; ++r)
    c_.AddRequests(r, List({Allreduce("c", {1})}), kT0);
  ASSERT_EQ(Take(c_).size(), 1u);
  EXPECT_FALSE(c_.cache().IsCurrent(a_));
  c_.AddRequests(2, List({Allreduce("a", {4})}), kT0);
  auto ready = Take(c_);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ALLREDUCE);
  EXPECT_EQ(ready[0].names(0), "a");
  EXPECT_FALSE(c_.HasPartial());
}

// Note [Requests an error will take]: "t" timed out waiting for ranks 0
// and 2; they submit it before executing the error's list, which then fails
// their new requests on them. Those requests must not count: "t" runs again
// only once they submit it after the error.
TEST(Coordinator, RequestsSentBeforeTheirErrorArrivedDoNotCount) {
  Coordinator c(Config(3));
  c.AddRequests(1, List({Allreduce("t", {4})}), kT0);
  c.ExpireOlderThan(absl::Seconds(1), kT0 + absl::Seconds(1));
  wire::ResponseList error = c.TakeResponseList();
  ASSERT_EQ(error.responses_size(), 1);
  ASSERT_EQ(error.responses(0).type(), wire::RESPONSE_ERROR);
  auto late = List({Allreduce("t", {4})});
  late.set_acked_seq(0);  // sent before executing list 1
  c.AddRequests(0, late, kT0);
  c.AddRequests(2, late, kT0);
  auto again = List({Allreduce("t", {4})});
  again.set_acked_seq(error.seq());
  c.AddRequests(1, again, kT0);
  EXPECT_FALSE(c.HasReady());
  c.AddRequests(0, again, kT0);
  EXPECT_FALSE(c.HasReady());
  c.AddRequests(2, again, kT0);
  auto ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ALLREDUCE);
}

// The same when the late requests come before the error's list is even
// taken: they are pending when it is sent, and it drops them.
TEST(Coordinator, RequestsPendingWhenTheirErrorIsSentDoNotCount) {
  Coordinator c(Config(3));
  c.AddRequests(1, List({Allreduce("t", {4})}), kT0);
  c.ExpireOlderThan(absl::Seconds(1), kT0 + absl::Seconds(1));
  c.AddRequests(0, List({Allreduce("t", {4})}), kT0);
  c.AddRequests(2, List({Allreduce("t", {4})}), kT0);
  wire::ResponseList error = c.TakeResponseList();
  ASSERT_EQ(error.responses_size(), 1);
  ASSERT_EQ(error.responses(0).type(), wire::RESPONSE_ERROR);
  EXPECT_TRUE(c.PendingNames().empty());
  auto again = List({Allreduce("t", {4})});
  again.set_acked_seq(error.seq());
  c.AddRequests(1, again, kT0);
  EXPECT_FALSE(c.HasReady());
  c.AddRequests(0, again, kT0);
  c.AddRequests(2, again, kT0);
  auto ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ALLREDUCE);
}

TEST(ResponseCache, LruEvictionKeepsEvictedIdsUntilAcked) {
  ResponseCache cache(2);
  cache.Insert(Allreduce("a", {1}), 1);
  cache.Insert(Allreduce("b", {1}), 1);
  const int64_t a = cache.Lookup(Allreduce("a", {1}));
  cache.Touch(a);                        // b is now least recently used
  cache.Insert(Allreduce("c", {1}), 2);  // evicts b
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
      if (f->cpp_type() == F::CPPTYPE_INT32) {
        refl->AddInt32(&changed, f, 7);
      } else {
        ASSERT_EQ(f->cpp_type(), F::CPPTYPE_INT64) << f->name();
        refl->AddInt64(&changed, f, 7);
      }
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

wire::Request ProcessSetRequest(wire::CollectiveType type,
                                const std::string& name,
                                std::vector<int> members) {
  wire::Request r;
  r.set_name(name);
  r.set_type(type);
  for (int m : members) r.add_member_ranks(m);
  return r;
}

// Creating a set: the ranks travel in member_ranks, the coordinator's id
// for the set in new_process_set (ids count up from 1); removing one names
// it in target_process_set. Nothing rides in shape or first_dims.
TEST(Coordinator, ProcessSetsTravelInTheirOwnFields) {
  Coordinator c(Config(3));
  for (int r = 0; r < 3; ++r) {
    c.AddRequests(
        r, List({ProcessSetRequest(wire::ADD_PROCESS_SET, "s1", {0, 2})}), kT0);
  }
  auto ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ADD_PROCESS_SET);
  EXPECT_EQ(ready[0].new_process_set(), 1);
  EXPECT_THAT(ready[0].member_ranks(), ::testing::ElementsAre(0, 2));
  EXPECT_EQ(ready[0].first_dims_size(), 0);

  // Created by its members alone: rank 1 is not waited for.
  for (int r : {0, 1}) {
    c.AddRequests(
        r, List({ProcessSetRequest(wire::ADD_MEMBER_PROCESS_SET, "m", {0, 1})}),
        kT0);
  }
  ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ADD_PROCESS_SET);
  EXPECT_EQ(ready[0].new_process_set(), 2);
  EXPECT_THAT(ready[0].member_ranks(), ::testing::ElementsAre(0, 1));

  for (int r = 0; r < 3; ++r) {
    wire::Request remove;
    remove.set_name("rm");
    remove.set_type(wire::REMOVE_PROCESS_SET);
    remove.set_target_process_set(1);
    c.AddRequests(r, List({remove}), kT0);
  }
  ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_REMOVE_PROCESS_SET);
  EXPECT_EQ(ready[0].target_process_set(), 1);
}

TEST(Coordinator, ProcessSetDisagreementsNameTheRanksAndTheirValues) {
  Coordinator c(Config(2));
  c.AddRequests(
      0, List({ProcessSetRequest(wire::ADD_PROCESS_SET, "s", {0, 1})}), kT0);
  c.AddRequests(1, List({ProcessSetRequest(wire::ADD_PROCESS_SET, "s", {1})}),
                kT0);
  auto ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_THAT(ready[0].error(), HasSubstr("rank 0 has ranks [0, 1]"));
  EXPECT_THAT(ready[0].error(), HasSubstr("rank 1 has ranks [1]"));

  for (int r = 0; r < 2; ++r) {
    wire::Request remove;
    remove.set_name("rm");
    remove.set_type(wire::REMOVE_PROCESS_SET);
    remove.set_target_process_set(r + 4);
    c.AddRequests(r, List({remove}), kT0);
  }
  ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_THAT(ready[0].error(), HasSubstr("rank 0 has process set 4"));
  EXPECT_THAT(ready[0].error(), HasSubstr("rank 1 has process set 5"));

  // Members that are not distinct ranks of the job, sorted.
  c.AddRequests(
      0, List({ProcessSetRequest(wire::ADD_MEMBER_PROCESS_SET, "bad", {1, 0})}),
      kT0);
  ready = Take(c);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), wire::RESPONSE_ERROR);
  EXPECT_THAT(ready[0].error(), HasSubstr("distinct ranks of the job"));
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
  EXPECT_EQ(ready[0].last_joined_rank(), 1);
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
  EXPECT_THAT(r.error(),
              HasSubstr("device mismatch: rank 0 has cpu; rank 1 has cuda"));
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
