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
// same stalls and keep every one of its ranks' caches its own. A fourth
// program runs the same ranks on one host's hit board (Note [Hits on the
// board]): each rank's real BoardExchange over one HitBoard, with rank 0's
// coordinator (bits on) and what LogExecutor does with the board's log.
// Its lists and records come in other groupings and at other times (ids
// every rank set run without the coordinator, and its time does not pass),
// so it is held to its own checks: every rank executes the same log,
// nothing runs on a rank that did not submit it (but for a joined rank's
// zeros), every rank's cache stays the coordinator's, nothing fails, and a
// name every rank has in flight when the program is drained is a hang.
// Any difference aborts (a finding).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/time.h"
#include "kolo/types.h"
#include "runtime/control/hit_board.h"
#include "runtime/loop/board_exchange.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/negotiation/fusion.h"
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

// The fourth program: the ranks on one host's hit board.
class OnBoard {
 public:
  OnBoard() : shared_(new kolo::HitBoardShared()), coordinator_(Config(true)) {
    kolo::HitBoard::Init(shared_.get(), kRanks, /*enabled=*/true, 1 << 20);
    for (int r = 0; r < kRanks; ++r) {
      Member& m = ranks_[r];
      m.rank = r;
      m.cache = r == 0 ? &coordinator_.cache() : &m.own;
      links_[r].out = &m.outbox;
      boards_[r] = std::make_unique<kolo::HitBoard>(shared_.get(), r, kRanks);
      // (No op time-out or stall check comes due: this program's time
      // does not pass.)
      exchanges_[r] = std::make_unique<kolo::BoardExchange>(
          boards_[r].get(), &links_[r], &m,
          kolo::BoardExchange::Limits{absl::Hours(1), absl::ZeroDuration(),
                                      absl::ZeroDuration()});
    }
  }

  // SendRequests: a hit if the rank's cache knows the request.
  void Submit(int r, const wire::Request& request) {
    Member& m = ranks_[r];
    if (finished_ || m.gone || m.joined || m.in_flight.count(request.name())) {
      return;
    }
    m.in_flight[request.name()] = request;
    wire::RequestList list;
    std::vector<int64_t> hits;
    const int64_t id = m.cache->Lookup(request);
    if (id >= 0) {
      hits.push_back(id);
    } else {
      *list.add_requests() = request;
    }
    Send(r, std::move(list), &hits);
  }
  void Join(int r) {
    Member& m = ranks_[r];
    if (finished_ || m.gone || m.joined) return;
    m.joined = true;
    wire::Request join;
    join.set_rank(r);
    join.set_type(wire::JOIN);
    join.set_name("__kolo_join__");
    wire::RequestList list;
    *list.add_requests() = join;
    std::vector<int64_t> hits;
    Send(r, std::move(list), &hits);
  }
  void Shutdown(int r) {
    Member& m = ranks_[r];
    if (finished_ || m.gone) return;
    m.gone = true;
    wire::RequestList list;
    list.set_shutdown(true);
    std::vector<int64_t> hits;
    Send(r, std::move(list), &hits);
  }
  // The lists in transit reach rank 0 (AcceptRequestList), which then
  // makes a list if it has one (CoordinatorStep, the global set alone).
  void Step(absl::Time now) {
    if (finished_) return;
    for (int r = 1; r < kRanks; ++r) {
      while (!ranks_[r].outbox.empty()) {
        exchanges_[0]->Received(coordinator_, r, now);
        coordinator_.AddRequests(r, std::move(ranks_[r].outbox.front()), now);
        ranks_[r].outbox.pop_front();
      }
    }
    absl::Time next = absl::InfiniteFuture();
    exchanges_[0]->Tend(coordinator_, now, &next);
    const bool all_shutdown = coordinator_.AllShutdown();
    if (!coordinator_.HasReady() && !all_shutdown) return;
    bool done = false;
    // No room for the marker: the others make room as they execute.
    if (!exchanges_[0]->ReadyForList(coordinator_, kolo::kGlobalProcessSet, now,
                                     &done)) {
      return;
    }
    Check(!done, "the board's log ended the job on rank 0");
    wire::ResponseList list = coordinator_.TakeResponseList();
    list.set_shutdown(all_shutdown);
    Check(exchanges_[0]->ListMade(list, kolo::kGlobalProcessSet, coordinator_),
          "the board had no room for a list's marker");
    for (int r = 1; r < kRanks; ++r) ranks_[r].inbox.push_back(list);
    ranks_[0].Run(list, /*made_here=*/true);
    exchanges_[0]->ListExecuted();
    if (list.shutdown()) finished_ = true;
  }
  // Rank r's pass: the lists that came, then the log from its cursor.
  void Execute(int r) {
    Member& m = ranks_[r];
    while (!m.inbox.empty()) {
      exchanges_[r]->Hold(std::move(m.inbox.front()));
      m.inbox.pop_front();
    }
    bool done = false;
    exchanges_[r]->Execute(&done);
  }
  // Until nothing moves, then the checks.
  void Drain(absl::Time now) {
    for (int round = 0; round < 16; ++round) {
      Step(now);
      for (int r = 0; r < kRanks; ++r) Execute(r);
    }
    for (int r = 0; r < kRanks; ++r) {
      Check(ranks_[r].outbox.empty() || finished_,
            "a board rank's list never reached the coordinator");
      Check(ranks_[r].log == ranks_[0].log,
            "the board's ranks executed different logs");
      Check(ranks_[r].cache->Contents() == coordinator_.cache().Contents(),
            "a board rank's cache differs from the coordinator's");
    }
    for (const auto& [name, request] : ranks_[0].in_flight) {
      bool everyone = true;
      for (const Member& m : ranks_) everyone &= m.in_flight.count(name) > 0;
      Check(!everyone, "a name every rank submitted never ran on the board");
    }
  }

 private:
  // A rank: what LogExecutor does with the log, on this rank's cache (rank
  // 0's is the coordinator's).
  struct Member final : kolo::HitExchange::Runner {
    Member() : own(kCapacity) {}
    int rank = 0;
    ResponseCache own;
    ResponseCache* cache = nullptr;
    std::map<std::string, wire::Request> in_flight;
    std::deque<wire::RequestList> outbox;  // to rank 0, in transit
    std::deque<wire::ResponseList> inbox;  // from rank 0, not held yet
    int64_t executed_seq = 0;
    bool gone = false, joined = false;
    std::vector<std::string> log;  // per entry executed: what it ran

    bool IsMember(int process_set) override {
      return process_set == kolo::kGlobalProcessSet;
    }
    void ExecuteList(int, const wire::ResponseList& list) override {
      Run(list, /*made_here=*/false);
    }
    // The fuzzer executes as the thread does: no caller turns.
    bool CallerMayRun(const wire::ResponseList&) override { return false; }
    bool ExecuteIds(const kolo::HitBoardShared::Record& record,
                    int64_t fusion_threshold_bytes, bool) override {
      std::vector<const wire::Response*> singles;
      for (uint32_t i = 0; i < record.count; ++i) {
        const wire::Response* cached = cache->CachedResponse(record.ids[i]);
        Check(cached != nullptr,
              "a board record names an id a rank's cache does not hold");
        singles.push_back(cached);
      }
      std::string entry = "ids";
      for (const std::vector<size_t>& bucket :
           kolo::PlanBuckets(singles, fusion_threshold_bytes, kRanks)) {
        wire::Response compact;
        for (size_t i : bucket) compact.add_cache_ids(record.ids[i]);
        entry += RunResponse(compact, /*apply_cache=*/true);
      }
      log.push_back(entry);
      return true;
    }
    bool failed() override { return false; }
    void Fatal(const absl::Status& status) override {
      std::fprintf(stderr, "negotiation_fuzzer: rank %d on the board: %s\n",
                   rank, std::string(status.message()).c_str());
      std::abort();
    }

    // A list made here leaves the cache to the coordinator.
    void Run(const wire::ResponseList& list, bool made_here) {
      std::string entry = "list " + std::to_string(list.seq());
      for (const wire::Response& compact : list.responses()) {
        entry += RunResponse(compact, !made_here && !list.cache_frozen());
      }
      executed_seq = list.seq();
      if (!made_here) cache->PruneGraveyard(list.seq());
      log.push_back(entry);
    }
    // What the response ran, for the log.
    std::string RunResponse(const wire::Response& compact, bool apply_cache) {
      wire::Response response;
      Check(kolo::ExpandCachedResponse(*cache, compact, &response),
            "a board rank's cache lost an id");
      std::vector<const wire::Request*> requests;
      std::string ran = " [" + std::to_string(response.type());
      for (const std::string& name : response.names()) {
        auto it = in_flight.find(name);
        const bool zeros =
            joined && response.type() == wire::RESPONSE_ALLREDUCE;
        Check(it != in_flight.end() || zeros ||
                  response.type() == wire::RESPONSE_ERROR ||
                  response.type() == wire::RESPONSE_JOIN,
              "a name ran on a board rank that never submitted it");
        requests.push_back(it == in_flight.end() ? nullptr : &it->second);
        ran += " " + name;
      }
      if (response.type() == wire::RESPONSE_JOIN) joined = false;
      if (apply_cache) {
        kolo::ApplyResponse(
            *cache, compact,
            [&](int i) -> const wire::Request* { return requests[i]; }, 0);
      }
      for (const std::string& name : response.names()) in_flight.erase(name);
      return ran + "]";
    }
  };
  struct Link final : kolo::ControlLink {
    std::deque<wire::RequestList>* out = nullptr;
    absl::Status SendToCoordinator(const wire::ControlMessage& m) override {
      out->push_back(m.request_list());
      return absl::OkStatus();
    }
    void Ring(int) override {}
  };

  void Send(int r, wire::RequestList list, std::vector<int64_t>* hits) {
    list.set_process_set(kolo::kGlobalProcessSet);
    list.set_acked_seq(ranks_[r].executed_seq);
    absl::StatusOr<bool> sent = exchanges_[r]->Send(
        std::move(list), hits, r == 0 ? &coordinator_ : nullptr, r, now_);
    Check(sent.ok(), "a board rank could not send");
  }

  std::unique_ptr<kolo::HitBoardShared> shared_;
  Coordinator coordinator_;
  Member ranks_[kRanks];
  Link links_[kRanks];
  std::unique_ptr<kolo::HitBoard> boards_[kRanks];
  std::unique_ptr<kolo::BoardExchange> exchanges_[kRanks];
  const absl::Time now_ = absl::FromUnixSeconds(1000);
  bool finished_ = false;  // the final list ran
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Coordinator bits(Config(true)), slots(Config(false));
  Rank ranks[kRanks];
  Relayed relayed;
  OnBoard board;
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
        const wire::Request request =
            Request(r, (arg / kRanks) % kNames, (arg / (kRanks * kNames)) % 2);
        board.Submit(r, request);
        if (rank.gone || rank.joined) break;
        if (rank.in_flight.count(request.name())) break;  // Rejected locally.
        send(r, SubmitList(rank, request, op));
        relayed.Send(r, SubmitList(twin, request, op), now);
        break;
      }
      case 2:  // The rank executes the oldest list it received.
        rank.Execute();
        twin.Execute();
        board.Execute(r);
        break;
      case 3:
        take();
        board.Step(now);
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
        if (arg < 200) break;
        board.Shutdown(r);
        if (rank.gone) break;
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
        if (arg < 128) break;
        board.Join(r);
        if (rank.gone || rank.joined) break;
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
  board.Drain(now);
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
