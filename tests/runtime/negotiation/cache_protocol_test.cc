// Note [One cache protocol]: the coordinator's response cache and every
// rank's stay the same through a sequence of steps, each side applying the
// changes with the same code (ApplyResponse) as the runtime does: new names,
// hits, eviction, a changed signature, an error, a fused response mixing
// hits and misses, and a join (lists frozen while a rank has joined); and
// the same with ranks 1 and 2 on a host whose leader relays their lists
// (Note [Host relay]: their common hits reach the coordinator once, for
// the host, through HostBatch and Coordinator::AddHostHits).
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kolo/types.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/negotiation/host_batch.h"
#include "runtime/negotiation/response_cache.h"

namespace kolo {
namespace {

wire::Request Allreduce(const std::string& name, int64_t elements) {
  wire::Request r;
  r.set_name(name);
  r.set_type(wire::ALLREDUCE);
  r.set_dtype(static_cast<int>(DataType::kFloat32));
  r.add_shape(elements);
  r.set_prescale(1);
  r.set_postscale(1);
  return r;
}

wire::Request Join() {
  wire::Request r;
  r.set_type(wire::JOIN);
  r.set_name("__kolo_join__");
  return r;
}

// A rank's side, as RuntimeImpl does it: requests go as cache ids when the
// rank's cache has them; each response list is expanded from this cache
// and its changes applied.
class Rank {
 public:
  Rank(int rank, int capacity) : rank_(rank), cache_(capacity) {}

  wire::RequestList Submit(const std::vector<wire::Request>& requests) {
    wire::RequestList list;
    for (wire::Request r : requests) {
      r.set_rank(rank_);
      submitted_[r.name()] = r;
      const int64_t id = cache_.Lookup(r);
      if (id >= 0) {
        list.add_cached_ids(id);
      } else {
        *list.add_requests() = r;
      }
    }
    list.set_acked_seq(executed_seq_);
    return list;
  }

  void Execute(const wire::ResponseList& list) {
    for (const wire::Response& compact : list.responses()) {
      wire::Response response;
      ASSERT_TRUE(ExpandCachedResponse(cache_, compact, &response))
          << "rank " << rank_ << ": cache out of step at list " << list.seq();
      if (compact.cache_ids_size() > 0) {
        // The board's way (LogExecutor::ExecuteIds): the same
        // response from responses looked up beforehand, into storage that
        // held another one.
        std::vector<const wire::Response*> cached;
        for (int64_t id : compact.cache_ids()) {
          cached.push_back(cache_.CachedResponse(id));
        }
        ExpandCachedResponse(cached.data(), compact, &reused_);
        EXPECT_EQ(reused_.SerializeAsString(), response.SerializeAsString())
            << "rank " << rank_ << " at list " << list.seq();
      }
      if (list.cache_frozen()) continue;
      ApplyResponse(
          cache_, compact,
          [&](int i) -> const wire::Request* {
            auto it = submitted_.find(response.names(i));
            return it == submitted_.end() ? nullptr : &it->second;
          },
          0);
    }
    executed_seq_ = list.seq();
    cache_.PruneGraveyard(list.seq());
  }

  const ResponseCache& cache() const { return cache_; }

 private:
  const int rank_;
  ResponseCache cache_;
  std::map<std::string, wire::Request> submitted_;
  int64_t executed_seq_ = 0;
  wire::Response reused_;  // kept from one response to the next
};

class CacheProtocolTest : public ::testing::TestWithParam<bool> {
 protected:
  static constexpr int kRanks = 3;
  static constexpr int kCapacity = 3;

  CacheProtocolTest() : coordinator_(MakeConfig()), host_({1, 2}) {
    for (int r = 0; r < kRanks; ++r) ranks_.emplace_back(r, kCapacity);
  }

  // Rank r's list to the coordinator: through the host's leader (ranks 1
  // and 2) when relayed, sent on at Flush().
  void Send(int r, wire::RequestList list) {
    if (GetParam() && r > 0) {
      host_.Add(r, std::move(list), now_);
    } else {
      coordinator_.AddRequests(r, std::move(list), now_);
    }
  }
  void Flush() {
    if (host_.empty()) return;
    wire::HostRequests message;
    int64_t n = 0;
    host_.Take(&message, &n);
    host_hits_ += n;
    // Rank 0's production path; ranks 1 and 2 are the host of leader 1.
    ASSERT_TRUE(messages_
                    .Accept(
                        1, message, coordinator_,
                        [&](int r, wire::RequestList l) {
                          coordinator_.AddRequests(r, std::move(l), now_);
                          return true;
                        },
                        now_)
                    .ok());
  }

  static Coordinator::Config MakeConfig() {
    Coordinator::Config c;
    for (int r = 0; r < kRanks; ++r) c.global_ranks.push_back(r);
    c.fusion_threshold_bytes = 1 << 20;  // fuses: mixed buckets happen
    c.cache_capacity = kCapacity;
    return c;
  }

  // Every rank submits its requests; the coordinator's response list is
  // executed by every rank; then the caches are compared.
  wire::ResponseList Step(
      const std::vector<std::vector<wire::Request>>& per_rank) {
    for (int r = 0; r < kRanks; ++r) Send(r, ranks_[r].Submit(per_rank[r]));
    Flush();
    wire::ResponseList list = coordinator_.TakeResponseList();
    for (Rank& rank : ranks_) rank.Execute(list);
    ++step_;
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(ranks_[r].cache().Contents(), coordinator_.cache().Contents())
          << "rank " << r << " after step " << step_;
    }
    return list;
  }

  std::vector<std::vector<wire::Request>> Everyone(
      const std::vector<wire::Request>& requests) {
    return std::vector<std::vector<wire::Request>>(kRanks, requests);
  }

  Coordinator coordinator_;
  HostBatch host_;
  HostMessages messages_{{0, 1, 1}};  // rank 0 alone; ranks 1, 2: leader 1
  int64_t host_hits_ = 0;
  std::vector<Rank> ranks_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  int step_ = 0;
};

TEST_P(CacheProtocolTest, CoordinatorAndRanksChangeTheirCachesAlike) {
  Step(Everyone({Allreduce("a", 4), Allreduce("b", 4)}));  // inserted
  EXPECT_EQ(coordinator_.cache().size(), 2u);
  wire::ResponseList hits =
      Step(Everyone({Allreduce("a", 4), Allreduce("b", 4)}));
  ASSERT_EQ(hits.responses_size(), 1);  // fused, travelling as ids
  EXPECT_EQ(hits.responses(0).cache_ids_size(), 2);
  // Two new names in a cache of 3: the least recently used goes.
  Step(Everyone({Allreduce("c", 4), Allreduce("d", 4)}));
  EXPECT_EQ(coordinator_.cache().size(), 3u);
  // A hit fused with a miss: re-inserted from the cache's own copy.
  Step(Everyone({Allreduce("d", 4), Allreduce("e", 4)}));
  // A changed signature: a new id for the name.
  const auto before = coordinator_.cache().Contents();
  Step(Everyone({Allreduce("e", 8)}));
  EXPECT_NE(coordinator_.cache().Contents(), before);
  // An error (ranks disagree on the shape): the name leaves every cache.
  wire::ResponseList error =
      Step({{Allreduce("e", 8)}, {Allreduce("e", 8)}, {Allreduce("e", 16)}});
  ASSERT_EQ(error.responses_size(), 1);
  EXPECT_EQ(error.responses(0).type(), wire::RESPONSE_ERROR);
  for (const auto& [name, id] : coordinator_.cache().Contents()) {
    EXPECT_NE(name, "e");
  }
  // A join: while rank 2 has joined, lists change no cache.
  Send(2, ranks_[2].Submit({Join()}));
  Flush();
  const auto frozen = coordinator_.cache().Contents();
  wire::ResponseList joined =
      Step({{Allreduce("d", 4)}, {Allreduce("d", 4)}, {}});
  EXPECT_TRUE(joined.cache_frozen());
  EXPECT_EQ(coordinator_.cache().Contents(), frozen);
  Step({{Join()}, {Join()}, {}});
  // And after it, hits and inserts again.
  Step(Everyone({Allreduce("d", 4), Allreduce("f", 4), Allreduce("g", 4)}));
  EXPECT_EQ(coordinator_.cache().size(), 3u);
  // Relayed, the host's hits went once for it (a, b in step 2; d in step 4
  // and after the join).
  if (GetParam()) {
    EXPECT_GE(host_hits_, 4);
  }
}

// The last rank to join ends the join before the coordinator takes the
// list, but the sums made ready while ranks had joined are in it: the list
// must still change no cache (the joined ranks have no request to insert).
// negotiation_fuzzer found this.
TEST_P(CacheProtocolTest, SumsReadyDuringAJoinChangeNoCacheAfterItEnds) {
  Send(1, ranks_[1].Submit({Allreduce("x", 4)}));
  Send(0, ranks_[0].Submit({Join()}));
  Send(2, ranks_[2].Submit({Join()}));
  Flush();
  wire::ResponseList list = Step({{}, {Join()}, {}});
  ASSERT_EQ(list.responses_size(), 2);
  EXPECT_EQ(list.responses(0).names(0), "x");
  EXPECT_EQ(list.responses(0).contributors(), 1);
  EXPECT_EQ(list.responses(1).type(), wire::RESPONSE_JOIN);
  EXPECT_TRUE(list.cache_frozen());
  EXPECT_TRUE(coordinator_.cache().Contents().empty());
  // The next list is not frozen: "x" enters every cache.
  Step(Everyone({Allreduce("x", 4)}));
  EXPECT_EQ(coordinator_.cache().size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Relay, CacheProtocolTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "ThroughAHostLeader" : "Direct";
                         });

}  // namespace
}  // namespace kolo
