// HostBatch (runtime/negotiation/host_batch.h) on its own: the host's common
// hits go once for the host, the rest stay in their ranks' lists in order; when
// the held lists must go.
#include "runtime/negotiation/host_batch.h"

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/negotiation/response_cache.h"

namespace kolo {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1000);
const absl::Duration kHold = absl::Milliseconds(1);

wire::RequestList Hits(std::vector<int64_t> ids, int64_t acked = 7) {
  wire::RequestList list;
  list.set_acked_seq(acked);
  AddCacheHits(&ids, &list);
  return list;
}

std::vector<int64_t> Ids(const wire::RequestList& list) {
  std::vector<int64_t> ids;
  ForEachCacheHit(list, [&](int64_t id) { ids.push_back(id); });
  std::sort(ids.begin(), ids.end());
  return ids;
}

wire::HostRequests Take(HostBatch& b, int64_t* n = nullptr) {
  wire::HostRequests out;
  int64_t count = 0;
  b.Take(&out, &count);
  if (n) *n = count;
  return out;
}

TEST(HostBatch, CommonHitsGoOnceForTheHost) {
  HostBatch b({4, 5, 6});
  b.Add(4, Hits({10, 11, 12}), kT0);
  b.Add(6, Hits({10, 11}), kT0);
  EXPECT_EQ(b.Due(kHold), kT0 + kHold);  // 5 has sent nothing yet
  b.Add(5, Hits({11, 10, 13}), kT0);
  EXPECT_EQ(b.Due(kHold), kT0 + kHold);  // 12, 13: not everyone's
  int64_t n = 0;
  const wire::HostRequests out = Take(b, &n);
  EXPECT_EQ(n, 2);
  EXPECT_THAT(out.ranks(), ElementsAre(4, 5, 6));
  ASSERT_EQ(out.host_hits_size(), 1);
  EXPECT_THAT(Ids(out.host_hits(0)), ElementsAre(10, 11));
  EXPECT_EQ(out.host_hits(0).acked_seq(), 7);
  ASSERT_EQ(out.lists_size(), 2);  // in order, the rest of their hits
  EXPECT_EQ(out.lists(0).rank(), 4);
  EXPECT_THAT(Ids(out.lists(0).list()), ElementsAre(12));
  EXPECT_EQ(out.lists(1).rank(), 5);
  EXPECT_THAT(Ids(out.lists(1).list()), ElementsAre(13));
  // 6's list had nothing else: only its ack travels.
  ASSERT_EQ(out.acks_size(), 1);
  EXPECT_EQ(out.acks(0).rank(), 6);
  EXPECT_EQ(out.acks(0).acked_seq(), 7);
  EXPECT_TRUE(b.empty());
}

TEST(HostBatch, DueAtOnceWhenEveryIdIsDecided) {
  HostBatch b({0, 1});
  b.Add(0, Hits({1, 2}), kT0);
  b.Add(1, Hits({2, 1}), kT0);
  EXPECT_EQ(b.Due(kHold), absl::InfinitePast());
  EXPECT_THAT(Ids(Take(b).host_hits(0)), ElementsAre(1, 2));
}

TEST(HostBatch, AnythingButHitsGoesAtOnce) {
  HostBatch b({0, 1});
  wire::RequestList request = Hits({1});
  request.add_requests()->set_name("new");
  b.Add(0, request, kT0);
  EXPECT_EQ(b.Due(kHold), absl::InfinitePast());
  Take(b);
  wire::RequestList other = Hits({1});
  other.set_process_set(3);
  b.Add(0, other, kT0);
  EXPECT_EQ(b.Due(kHold), absl::InfinitePast());
  Take(b);
  wire::RequestList bye;
  bye.set_shutdown(true);
  b.Add(1, bye, kT0);
  EXPECT_EQ(b.Due(kHold), absl::InfinitePast());
  Take(b);
  b.Add(0, Hits({5}), kT0);
  EXPECT_EQ(b.Due(absl::ZeroDuration()), absl::InfinitePast());
  EXPECT_EQ(b.Due(kHold), kT0 + kHold);  // waits for 1's 5
  Take(b);
  // While a rank of the host is in a join, its partners' hits will not all
  // come: nothing waits, until its next list.
  wire::RequestList join;
  join.add_requests()->set_type(wire::JOIN);
  b.Add(1, join, kT0);
  Take(b);
  b.Add(0, Hits({6}), kT0);
  EXPECT_EQ(b.Due(kHold), absl::InfinitePast());
  Take(b);
  b.Add(1, Hits({7}), kT0);
  EXPECT_EQ(b.Due(kHold), kT0 + kHold);
}

TEST(HostBatch, OthersFollowABitThatWentAlone) {
  HostBatch b({0, 1, 2});
  b.Add(0, Hits({9}), kT0);
  int64_t n = 0;
  wire::HostRequests first = Take(b, &n);  // the hold passed: 0's goes alone
  EXPECT_EQ(n, 0);
  EXPECT_THAT(Ids(first.lists(0).list()), ElementsAre(9));
  // 1's bit for the same round is decided: it goes at once, in its list.
  b.Add(1, Hits({9}), kT0);
  EXPECT_EQ(b.Due(kHold), absl::InfinitePast());
  wire::HostRequests second = Take(b, &n);
  EXPECT_EQ(n, 0);
  EXPECT_THAT(Ids(second.lists(0).list()), ElementsAre(9));
  EXPECT_EQ(b.rounds(), 1u);
  b.Add(2, Hits({9}), kT0);
  EXPECT_EQ(b.Due(kHold), absl::InfinitePast());
  Take(b, &n);
  EXPECT_EQ(n, 0);
  EXPECT_EQ(b.rounds(), 0u);  // the round is complete on the host
  // The next round is a fresh one: held until every rank's bit is here,
  // then once for the host.
  b.Add(2, Hits({9}), kT0);
  EXPECT_EQ(b.Due(kHold), kT0 + kHold);
  b.Add(0, Hits({9}), kT0);
  b.Add(1, Hits({9}), kT0);
  EXPECT_THAT(Ids(Take(b, &n).host_hits(0)), ElementsAre(9));
  EXPECT_EQ(n, 1);
}

// An id goes once for the host only if its lists agree on their ack (an
// error may take one rank's hit and not another's); the host's hits are
// grouped by ack.
TEST(HostBatch, OnlyIdsWhoseListsAgreeOnTheirAckGoOnce) {
  HostBatch b({0, 1});
  b.Add(0, Hits({1, 2, 3}, /*acked=*/5), kT0);
  b.Add(1, Hits({1}, /*acked=*/4), kT0);
  b.Add(1, Hits({2, 3}, /*acked=*/5), kT0);
  int64_t n = 0;
  const wire::HostRequests out = Take(b, &n);
  EXPECT_EQ(n, 2);
  ASSERT_EQ(out.host_hits_size(), 1);
  EXPECT_THAT(Ids(out.host_hits(0)), ElementsAre(2, 3));
  EXPECT_EQ(out.host_hits(0).acked_seq(), 5);
  ASSERT_EQ(out.lists_size(), 2);  // 1 goes in each rank's own list
  EXPECT_THAT(Ids(out.lists(0).list()), ElementsAre(1));
  EXPECT_THAT(Ids(out.lists(1).list()), ElementsAre(1));
  ASSERT_EQ(out.acks_size(), 1);
  EXPECT_EQ(out.acks(0).acked_seq(), 5);
  // Two acks, each agreed on by its ids' lists: two groups.
  b.Add(0, Hits({8}, 6), kT0);
  b.Add(1, Hits({8}, 6), kT0);
  b.Add(0, Hits({9}, 7), kT0);
  b.Add(1, Hits({9}, 7), kT0);
  const wire::HostRequests two = Take(b, &n);
  ASSERT_EQ(two.host_hits_size(), 2);
  EXPECT_EQ(two.host_hits(0).acked_seq(), 6);
  EXPECT_THAT(Ids(two.host_hits(0)), ElementsAre(8));
  EXPECT_EQ(two.host_hits(1).acked_seq(), 7);
  EXPECT_THAT(Ids(two.host_hits(1)), ElementsAre(9));
}

TEST(HostBatch, ARankSendingAnIdAgainStartsANewRound) {
  // Rank 1 never sent 9 in the round that 0 sent alone (it sent a changed
  // request instead); when 0 sends 9 again the round is over.
  HostBatch b({0, 1});
  b.Add(0, Hits({9}), kT0);
  Take(b);
  EXPECT_EQ(b.rounds(), 1u);
  b.Add(0, Hits({9}), kT0 + absl::Seconds(1));
  EXPECT_EQ(b.Due(kHold), kT0 + absl::Seconds(1) + kHold);
  b.Add(1, Hits({9}), kT0 + absl::Seconds(1));
  int64_t n = 0;
  EXPECT_THAT(Ids(Take(b, &n).host_hits(0)), ElementsAre(9));
  EXPECT_EQ(b.rounds(), 0u);
  // Rounds of ids no rank will send again are forgotten.
  b.Add(0, Hits({20, 21}), kT0);
  Take(b);
  EXPECT_EQ(b.rounds(), 2u);
  b.ForgetRounds([](int64_t id) { return id == 20; });
  EXPECT_EQ(b.rounds(), 1u);
}

// Rank 0's side (HostMessages): a leader speaks for exactly the ranks of
// its host; its lists reach the coordinator in order, through the
// runtime's routing; a message naming another host's rank adds nothing.
TEST(HostMessages, ALeaderSpeaksForItsHostOnly) {
  Coordinator::Config config;
  config.global_ranks = {0, 1, 2};
  Coordinator coordinator(config);
  HostMessages messages({0, 1, 1});  // rank 0 alone; ranks 1, 2: leader 1
  std::vector<int> routed;
  auto add_list = [&](int rank, wire::RequestList list) {
    routed.push_back(rank);
    coordinator.AddRequests(rank, std::move(list), kT0);
    return true;
  };
  HostBatch b({1, 2});
  wire::RequestList a;
  wire::Request* r = a.add_requests();
  r->set_name("a");
  r->set_type(wire::ALLREDUCE);
  r->add_shape(4);
  r->set_prescale(1);
  r->set_postscale(1);
  b.Add(1, a, kT0);
  b.Add(2, a, kT0);
  wire::HostRequests message = Take(b);

  wire::HostRequests stranger = message;  // rank 0 is not on 1's host
  stranger.mutable_lists(0)->set_rank(0);
  absl::Status s = messages.Accept(1, stranger, coordinator, add_list, kT0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("rank 1 relayed requests for ranks that "
                                   "are not on its host"));
  wire::HostRequests not_a_leader = message;
  EXPECT_EQ(messages.Accept(2, not_a_leader, coordinator, add_list, kT0).code(),
            absl::StatusCode::kInternal);
  EXPECT_THAT(routed, IsEmpty());
  EXPECT_FALSE(coordinator.HasPartial());

  ASSERT_TRUE(messages.Accept(1, message, coordinator, add_list, kT0).ok());
  EXPECT_THAT(routed, ElementsAre(1, 2));
  EXPECT_FALSE(coordinator.HasReady());  // rank 0's request is missing
  coordinator.AddRequests(0, a, kT0);
  EXPECT_TRUE(coordinator.HasReady());

  // A list the runtime refuses (it failed the job) stops the message.
  b.Add(1, a, kT0);
  wire::HostRequests refused = Take(b);
  EXPECT_EQ(messages
                .Accept(
                    1, refused, coordinator,
                    [](int, wire::RequestList) { return false; }, kT0)
                .code(),
            absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace kolo
