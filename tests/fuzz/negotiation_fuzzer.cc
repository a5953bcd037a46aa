// Fuzzes negotiation with the response cache: three ranks submit, from the
// fuzzer's bytes, a few names in two signatures (as cache ids when their own
// cache knows them, as the runtime does), execute the coordinator's lists
// late or early, shut down, join; time passes and the op time-out and stall
// inspector run. Two coordinators get the same messages: one with cache hits
// as bits (Note [Cache hits as bits]), one that sends every hit by the slow
// path. They must answer byte for byte the same, report the same stalls and
// keep the same cache, and every rank's cache must stay the coordinator's.
// A third coordinator (bits on) gets the same program with ranks 1 and 2 on
// a host whose leader relays their lists (Note [Host relay]: HostBatch
// takes out the ids both sent, Coordinator::AddHostHits counts them), sent
// on before rank 0's next list and whenever the coordinator's state is
// looked at; its ranks have caches of their own. It must make ready the same
// names with the same outcomes (the order within a list may differ), report the
// same stalls and keep every one of its ranks' caches its own. Any difference
// aborts (a finding).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/time.h"
#include "kolo/types.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/negotiation/host_batch.h"
#include "runtime/negotiation/response_cache.h"
#include "runtime/wire.pb.h"

namespace {

using kolo::Coordinator;
using kolo::ResponseCache;
namespace wire = kolo::wire;

constexpr int kRanks = 3;
constexpr int kNames = 5;
constexpr int kCapacity = 3;  // small: evictions happen

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "negotiation_fuzzer: %s\n", what);
    std::abort();
  }
}

wire::Request Request(int rank, int name, int variant) {
  wire::Request r;
  r.set_rank(rank);
  r.set_name("t" + std::to_string(name));
  r.set_type(wire::ALLREDUCE);
  r.set_dtype(static_cast<int>(kolo::DataType::kFloat32));
  r.add_shape(4 + variant);
  r.set_op(static_cast<int>(kolo::ReduceOp::kSum));
  r.set_prescale(1);
  r.set_postscale(1);
  return r;
}

// A rank's side, as RuntimeImpl does it.
struct Rank {
  Rank() : cache(kCapacity) {}
  ResponseCache cache;
  std::map<std::string, wire::Request> in_flight;
  std::deque<wire::ResponseList> lists;  // received, not yet executed
  int64_t executed_seq = 0;
  bool gone = false;    // shut down
  bool joined = false;  // until the join's response
  // Per list executed: (name, response type, error message), sorted.
  std::vector<std::vector<std::tuple<std::string, int, std::string>>> history;

  void Execute() {
    if (lists.empty()) return;
    const wire::ResponseList list = lists.front();
    lists.pop_front();
    auto& outcomes = history.emplace_back();
    for (const wire::Response& compact : list.responses()) {
      wire::Response response;
      Check(kolo::ExpandCachedResponse(cache, compact, &response),
            "a rank's cache lost an id the coordinator sent");
      for (const std::string& name : response.names()) {
        outcomes.emplace_back(name, response.type(), response.error());
      }
      if (response.type() == wire::RESPONSE_JOIN) joined = false;
      std::vector<const wire::Request*> requests;
      for (const std::string& name : response.names()) {
        auto it = in_flight.find(name);
        requests.push_back(it == in_flight.end() ? nullptr : &it->second);
      }
      if (!list.cache_frozen()) {
        kolo::ApplyResponse(
            cache, compact,
            [&](int i) -> const wire::Request* { return requests[i]; }, 0);
      }
      for (const std::string& name : response.names()) in_flight.erase(name);
    }
    std::sort(outcomes.begin(), outcomes.end());
    executed_seq = list.seq();
  }
};

Coordinator::Config Config(bool bits) {
  Coordinator::Config c;
  for (int r = 0; r < kRanks; ++r) c.global_ranks.push_back(r);
  c.cache_capacity = kCapacity;
  c.fusion_threshold_bytes = 1 << 20;
  c.hits_as_bits = bits;
  return c;
}

// The relayed program's lists of ranks 1 and 2 go through their leader.
struct Relayed {
  Relayed() : coordinator(Config(true)), host({1, 2}), messages({0, 1, 1}) {}
  Coordinator coordinator;
  kolo::HostBatch host;
  kolo::HostMessages messages;  // rank 0's production path
  Rank ranks[kRanks];

  void Send(int r, const wire::RequestList& list, absl::Time now) {
    if (r == 0) {
      // The program's order across hosts is kept (over the network it is
      // any order; here the comparison needs the same one), so that what
      // differs is what the relay does to its host's lists.
      Flush(now);
      coordinator.AddRequests(r, list, now);
    } else {
      host.Add(r, list, now);
    }
  }
  void Flush(absl::Time now) {
    if (host.empty()) return;
    wire::HostRequests message;
    int64_t n = 0;
    host.Take(&message, &n);
    const absl::Status accepted = messages.Accept(
        1, message, coordinator,
        [&](int r, wire::RequestList l) {
          coordinator.AddRequests(r, std::move(l), now);
          return true;
        },
        now);
    if (!accepted.ok()) __builtin_trap();  // the leader's own message
  }
};

// A rank's list for `request`: its id if the rank's cache knows it (op 1:
// as bits, op 0: as a list), else the request.
wire::RequestList SubmitList(Rank& rank, const wire::Request& request, int op) {
  rank.in_flight[request.name()] = request;
  wire::RequestList list;
  list.set_acked_seq(rank.executed_seq);
  std::vector<int64_t> id = {rank.cache.Lookup(request)};
  if (id[0] >= 0) {
    kolo::AddCacheHits(
        &id, &list,
        op == 1 ? kolo::HitEncoding::kBits : kolo::HitEncoding::kList);
  } else {
    *list.add_requests() = request;
  }
  return list;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Coordinator bits(Config(true)), slots(Config(false));
  Rank ranks[kRanks];
  Relayed relayed;
  absl::Time now = absl::FromUnixSeconds(1000);
  auto send = [&](int r, const wire::RequestList& list) {
    bits.AddRequests(r, list, now);
    slots.AddRequests(r, list, now);
  };
  auto take = [&] {
    Check(bits.HasReady() == slots.HasReady(), "HasReady differs");
    Check(bits.HasPartial() == slots.HasPartial(), "HasPartial differs");
    Check(bits.PendingNames() == slots.PendingNames(), "pending names differ");
    relayed.Flush(now);
    Check(bits.HasReady() == relayed.coordinator.HasReady(),
          "HasReady differs through the relay");
    Check(bits.PendingNames() == relayed.coordinator.PendingNames(),
          "pending names differ through the relay");
    if (!bits.HasReady()) return;
    const wire::ResponseList a = bits.TakeResponseList();
    const wire::ResponseList b = slots.TakeResponseList();
    std::string sa, sb;
    a.SerializeToString(&sa);
    b.SerializeToString(&sb);
    Check(sa == sb, "the response lists differ");
    Check(bits.cache().Contents() == slots.cache().Contents(),
          "the coordinators' caches differ");
    for (Rank& rank : ranks) rank.lists.push_back(a);
    // (What the lists make of each name is compared as the ranks execute
    // them: Rank::history.)
    const wire::ResponseList c = relayed.coordinator.TakeResponseList();
    Check(a.cache_frozen() == c.cache_frozen(),
          "cache_frozen differs through the relay");
    for (Rank& rank : relayed.ranks) rank.lists.push_back(c);
  };
  for (size_t i = 0; i + 1 < size; i += 2) {
    const int op = data[i] % 8;
    const int arg = data[i + 1];
    const int r = arg % kRanks;
    Rank& rank = ranks[r];
    Rank& twin = relayed.ranks[r];  // the same rank in the relayed program
    Check(rank.gone == twin.gone && rank.joined == twin.joined &&
              rank.in_flight.size() == twin.in_flight.size(),
          "a rank's state differs through the relay");
    switch (op) {
      case 0:
      case 1: {  // Submit a name in one of two signatures.
        if (rank.gone || rank.joined) break;
        const wire::Request request =
            Request(r, (arg / kRanks) % kNames, (arg / (kRanks * kNames)) % 2);
        if (rank.in_flight.count(request.name())) break;  // Rejected locally.
        send(r, SubmitList(rank, request, op));
        relayed.Send(r, SubmitList(twin, request, op), now);
        break;
      }
      case 2:  // The rank executes the oldest list it received.
        rank.Execute();
        twin.Execute();
        break;
      case 3:
        take();
        break;
      case 4: {              // Time passes; the op time-out runs.
        relayed.Flush(now);  // (Everything sent arrives before time passes.)
        now += absl::Milliseconds(100 * (arg % 16));
        bits.ExpireOlderThan(absl::Seconds(1), now);
        slots.ExpireOlderThan(absl::Seconds(1), now);
        relayed.coordinator.ExpireOlderThan(absl::Seconds(1), now);
        Check(bits.NextPendingDeadline(absl::Seconds(1)) ==
                  slots.NextPendingDeadline(absl::Seconds(1)),
              "the next deadlines differ");
        Check(bits.NextPendingDeadline(absl::Seconds(1)) ==
                  relayed.coordinator.NextPendingDeadline(absl::Seconds(1)),
              "the next deadlines differ through the relay");
        break;
      }
      case 5: {
        relayed.Flush(now);
        const auto report = bits.StallReport(absl::Milliseconds(500), now);
        Check(report == slots.StallReport(absl::Milliseconds(500), now),
              "the stall reports differ");
        Check(report ==
                  relayed.coordinator.StallReport(absl::Milliseconds(500), now),
              "the stall reports differ through the relay");
        const auto stalled = bits.StalledPast(absl::Milliseconds(700), now);
        Check(stalled == slots.StalledPast(absl::Milliseconds(700), now),
              "the stall shutdown messages differ");
        Check(stalled ==
                  relayed.coordinator.StalledPast(absl::Milliseconds(700), now),
              "the stall shutdown messages differ through the relay");
        break;
      }
      case 6: {  // Shut down (rare: only for a high argument).
        if (arg < 200 || rank.gone) break;
        rank.gone = twin.gone = true;
        wire::RequestList list;
        list.set_acked_seq(rank.executed_seq);
        list.set_shutdown(true);
        send(r, list);
        list.set_acked_seq(twin.executed_seq);
        relayed.Send(r, list, now);
        break;
      }
      case 7: {  // Join.
        if (rank.gone || rank.joined || arg < 128) break;
        rank.joined = twin.joined = true;
        wire::Request join;
        join.set_rank(r);
        join.set_type(wire::JOIN);
        join.set_name("__kolo_join__");
        wire::RequestList list;
        list.set_acked_seq(rank.executed_seq);
        *list.add_requests() = join;
        send(r, list);
        list.set_acked_seq(twin.executed_seq);
        relayed.Send(r, list, now);
        break;
      }
    }
  }
  take();
  for (int r = 0; r < kRanks; ++r) {
    Rank& rank = ranks[r];
    Rank& twin = relayed.ranks[r];
    while (!rank.lists.empty()) rank.Execute();
    while (!twin.lists.empty()) twin.Execute();
    Check(rank.cache.Contents() == bits.cache().Contents(),
          "a rank's cache differs from the coordinator's");
    Check(twin.cache.Contents() == relayed.coordinator.cache().Contents(),
          "a relayed rank's cache differs from its coordinator's");
    Check(rank.history == twin.history,
          "a list makes other outcomes through the relay");
  }
  return 0;
}
