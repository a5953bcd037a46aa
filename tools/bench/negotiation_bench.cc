// negotiation_bench: "scale on paper". Runs the coordinator's negotiation
// and fusion logic (runtime/negotiation/coordinator.h) for 16 to 4096 simulated
// ranks in one process, the transport replaced by in-memory protobuf bytes, and
// prints the per-cycle cost at the coordinator against the rank count:
//   steady: every rank sends cache ids (a training loop after step 1),
//   cold:   every rank sends full requests (cache off, or a new model),
//   first:  the one cycle that fills the cache.
// A cycle = parse every rank's RequestList + Coordinator::AddRequests for
// each + TakeResponseList (validation, fusion, cache updates) + serialising
// the ResponseList that goes back to every rank.
//
//   bazel-bin/tools/bench/negotiation_bench [--ranks 16,64,256,1024,4096]
//       [--tensors 100] [--cycles 20] [--cold 0|1] [--ranks-per-host 8]
//       [--hits auto|list]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kolo/types.h"
#include "runtime/control/hit_board.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/negotiation/host_batch.h"
#include "runtime/negotiation/response_cache.h"
#include "runtime/wire.pb.h"

namespace kolo {
namespace {

struct Flags {
  std::vector<int> ranks = {16, 64, 256, 1024, 4096};
  int tensors = 100;
  int cycles = 20;
  bool cold = true;  // --cold 0: steady state only (for a profiler)
  int ranks_per_host = 8;
  bool hits_as_list = false;  // --hits list: ids as a list, never bits
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--ranks") {
      f->ranks.clear();
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        int r;
        if (!absl::SimpleAtoi(s, &r) || r < 1) return false;
        f->ranks.push_back(r);
      }
    } else if (arg == "--tensors") {
      if (!absl::SimpleAtoi(value, &f->tensors) || f->tensors < 1) return false;
    } else if (arg == "--hits") {
      if (value != "list" && value != "auto") return false;
      f->hits_as_list = value == "list";
    } else if (arg == "--cold") {
      if (value != "0" && value != "1") return false;
      f->cold = value == "1";
    } else if (arg == "--ranks-per-host") {
      if (!absl::SimpleAtoi(value, &f->ranks_per_host) ||
          f->ranks_per_host < 1) {
        return false;
      }
    } else if (arg == "--cycles") {
      if (!absl::SimpleAtoi(value, &f->cycles) || f->cycles < 1) return false;
    } else {
      return false;
    }
  }
  return argc % 2 == 1;
}

// What a training step submits: `tensors` gradients of assorted sizes.
wire::Request GradientRequest(int rank, int i) {
  wire::Request r;
  r.set_rank(rank);
  r.set_name("grad/layer" + std::to_string(i) + ".weight");
  r.set_type(wire::ALLREDUCE);
  r.set_dtype(static_cast<int>(DataType::kFloat32));
  r.add_shape(256 * (1 + i % 7));
  r.add_shape(64);
  r.set_op(static_cast<int>(ReduceOp::kAverage));
  r.set_prescale(1.0);
  r.set_postscale(1.0);
  return r;
}

struct CycleCost {
  double median_us = 0;
  size_t request_bytes_per_rank = 0;
  size_t response_bytes = 0;
  size_t responses = 0;
};

// One cycle: every rank's bytes in, one response list out. Returns µs.
double Cycle(Coordinator& coordinator,
             const std::vector<std::string>& wire_lists,
             std::string* response_out, size_t* responses) {
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Time now = absl::Now();
  wire::RequestList list;
  for (size_t r = 0; r < wire_lists.size(); ++r) {
    list.ParseFromString(wire_lists[r]);
    coordinator.AddRequests(static_cast<int>(r), std::move(list), now);
  }
  wire::ResponseList responses_list = coordinator.TakeResponseList();
  responses_list.SerializeToString(response_out);
  const auto t1 = std::chrono::steady_clock::now();
  *responses = responses_list.responses_size();
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

Coordinator MakeCoordinator(int ranks, int cache_capacity) {
  Coordinator::Config config;
  config.global_ranks.resize(ranks);
  for (int r = 0; r < ranks; ++r) config.global_ranks[r] = r;
  config.cache_capacity = cache_capacity;
  return Coordinator(std::move(config));
}

std::vector<std::string> FullLists(int ranks, int tensors, int64_t acked) {
  std::vector<std::string> lists(ranks);
  for (int r = 0; r < ranks; ++r) {
    wire::RequestList list;
    list.set_acked_seq(acked);
    // Ranks submit in different orders, as they do in training.
    for (int k = 0; k < tensors; ++k) {
      *list.add_requests() = GradientRequest(r, (k + r) % tensors);
    }
    list.SerializeToString(&lists[r]);
  }
  return lists;
}

CycleCost Measure(int ranks, const Flags& flags, bool steady,
                  double* first_us) {
  Coordinator coordinator = MakeCoordinator(ranks, steady ? 1024 : 0);
  std::string response;
  size_t responses = 0;
  // Cycle 1 fills the cache (steady) or is just the first cold cycle.
  auto lists = FullLists(ranks, flags.tensors, 0);
  const double first = Cycle(coordinator, lists, &response, &responses);
  if (first_us) *first_us = first;
  int64_t seq = 1;
  if (steady) {
    // What each rank sends from now on: the ids its (identical) cache has.
    lists.assign(ranks, std::string());
    for (int r = 0; r < ranks; ++r) {
      wire::RequestList list;
      list.set_acked_seq(seq);
      std::vector<int64_t> ids;
      for (int k = 0; k < flags.tensors; ++k) {
        const int64_t id = coordinator.cache().Lookup(
            GradientRequest(r, (k + r) % flags.tensors));
        if (id < 0) {
          std::fprintf(stderr, "negotiation_bench: tensor not cached\n");
          std::exit(1);
        }
        ids.push_back(id);
      }
      // As the runtime sends them (bits where dense), or as a list.
      if (flags.hits_as_list) {
        for (int64_t id : ids) list.add_cached_ids(id);
      } else {
        AddCacheHits(&ids, &list);
      }
      list.SerializeToString(&lists[r]);
    }
  } else {
    lists = FullLists(ranks, flags.tensors, seq);
  }
  std::vector<double> us;
  for (int c = 0; c < flags.cycles; ++c) {
    us.push_back(Cycle(coordinator, lists, &response, &responses));
  }
  std::sort(us.begin(), us.end());
  CycleCost cost;
  cost.median_us = us[us.size() / 2];
  cost.request_bytes_per_rank = lists[0].size();
  cost.response_bytes = response.size();
  cost.responses = responses;
  return cost;
}

// The host relay as built (Note [Host relay] in
// runtime/control/control_plane.h): each host's leader batches its ranks'
// steady-state lists (HostBatch: the ids every rank of the host sent go
// once for the host) and the coordinator takes one HostRequests per host
// (parse + Coordinator::AddHostHits + each rank's ack, the lists having
// nothing else left) + TakeResponseList + serialising the ResponseList. The
// coordinator's cycle, in us (median); *leader_us: one leader's share
// (HostBatch Add + Due + Take for its ranks' parsed lists, serialising
// the message), median.
double MeasureRelayed(int ranks, const Flags& flags, double* leader_us) {
  Coordinator coordinator = MakeCoordinator(ranks, 1024);
  std::string response;
  size_t responses = 0;
  Cycle(coordinator, FullLists(ranks, flags.tensors, 0), &response, &responses);
  const int per_host = flags.ranks_per_host;
  std::vector<std::vector<int>> hosts;
  for (int first = 0; first < ranks; first += per_host) {
    std::vector<int>& host = hosts.emplace_back();
    for (int r = first; r < std::min(ranks, first + per_host); ++r) {
      host.push_back(r);
    }
  }
  auto steady_list = [&](int r) {
    wire::RequestList list;
    list.set_acked_seq(1);
    std::vector<int64_t> ids;
    for (int k = 0; k < flags.tensors; ++k) {
      ids.push_back(coordinator.cache().Lookup(
          GradientRequest(r, (k + r) % flags.tensors)));
    }
    if (flags.hits_as_list) {
      for (int64_t id : ids) list.add_cached_ids(id);
    } else {
      AddCacheHits(&ids, &list);
    }
    return list;
  };
  // Every host's message, as its leader makes it.
  std::vector<std::string> messages(hosts.size());
  const absl::Time t = absl::Now();
  for (size_t h = 0; h < hosts.size(); ++h) {
    HostBatch batch(hosts[h]);
    for (int r : hosts[h]) batch.Add(r, steady_list(r), t);
    wire::HostRequests out;
    int64_t n = 0;
    batch.Take(&out, &n);
    out.SerializeToString(&messages[h]);
  }
  {
    std::vector<wire::RequestList> lists;
    for (int r : hosts[0]) lists.push_back(steady_list(r));
    HostBatch batch(hosts[0]);
    std::vector<double> us;
    std::string bytes;
    for (int c = 0; c < flags.cycles; ++c) {
      std::vector<wire::RequestList> copies = lists;  // (not timed)
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t i = 0; i < copies.size(); ++i) {
        batch.Add(hosts[0][i], std::move(copies[i]), t);
      }
      if (batch.Due(absl::Milliseconds(1)) != absl::InfinitePast()) {
        std::fprintf(stderr, "negotiation_bench: a host's lists are held\n");
        std::exit(1);
      }
      wire::HostRequests out;
      int64_t n = 0;
      batch.Take(&out, &n);
      out.SerializeToString(&bytes);
      const auto t1 = std::chrono::steady_clock::now();
      us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    std::sort(us.begin(), us.end());
    *leader_us = us[us.size() / 2];
  }
  // Rank 0's side as the runtime runs it (HostMessages: the leaders'
  // checks, the hits, the lists, the acks).
  std::vector<int> leader_of(ranks);
  for (const std::vector<int>& host : hosts) {
    for (int r : host) leader_of[r] = host[0];
  }
  HostMessages accept(std::move(leader_of));
  std::vector<double> us;
  for (int c = 0; c < flags.cycles; ++c) {
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Time now = absl::Now();
    wire::HostRequests message;
    for (size_t h = 0; h < messages.size(); ++h) {
      message.ParseFromString(messages[h]);
      const absl::Status accepted = accept.Accept(
          hosts[h][0], message, coordinator,
          [&](int r, wire::RequestList l) {
            coordinator.AddRequests(r, std::move(l), now);
            return true;
          },
          now);
      if (!accepted.ok()) {
        std::fprintf(stderr, "negotiation_bench: %s\n",
                     std::string(accepted.message()).c_str());
        std::exit(1);
      }
    }
    wire::ResponseList list = coordinator.TakeResponseList();
    list.SerializeToString(&response);
    const auto t1 = std::chrono::steady_clock::now();
    if (list.responses_size() == 0) {
      std::fprintf(stderr, "negotiation_bench: nothing ready over hosts\n");
      std::exit(1);
    }
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// The within-host AND as the runtime does it (Note [Hits on the board] in
// runtime/control/hit_board.h): each of the host's ranks takes the board's
// lock and sets its bits for the step's ids, the last one appends the
// record, every rank reads it. One host's cycle, all its ranks' work
// summed (one thread plays them in turn), in µs (median). -1 if the host
// has more ranks than the board serves.
double BoardCycle(const Flags& flags, Coordinator& reference) {
  const int local = flags.ranks_per_host;
  if (local < 2 || local > HitBoardShared::kMaxRanks) return -1;
  auto shared = std::make_unique<HitBoardShared>();
  HitBoard::Init(shared.get(), local, true, 64 << 20);
  std::vector<std::unique_ptr<HitBoard>> boards;
  std::vector<std::vector<int64_t>> ids(local);
  for (int r = 0; r < local; ++r) {
    boards.push_back(std::make_unique<HitBoard>(shared.get(), r, local));
    for (int k = 0; k < flags.tensors; ++k) {
      ids[r].push_back(reference.cache().Lookup(
          GradientRequest(r, (k + r) % flags.tensors)));
    }
  }
  {
    HitBoard& b = *boards[0];
    if (!b.Lock(absl::InfiniteFuture(), [] { return true; })) std::abort();
    HitBoardLock locked(&b);
    b.Open();
  }
  std::vector<double> us;
  std::vector<int64_t> complete, refused;
  uint64_t cursor = 0;
  int64_t sum = 0;
  for (int c = 0; c < flags.cycles; ++c) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < local; ++r) {
      HitBoard& b = *boards[r];
      complete.clear();
      refused.clear();
      if (!b.Lock(absl::InfiniteFuture(), [] { return true; })) std::abort();
      HitBoardLock locked(&b);
      b.Set(ids[r], c, &complete, &refused);
      if (!complete.empty()) b.Publish(&complete);
    }
    const uint64_t tail = boards[0]->tail();
    for (int r = 0; r < local; ++r) {
      for (uint64_t pos = cursor; pos < tail; ++pos) {
        const HitBoardShared::Record& rec = boards[r]->record(pos);
        for (uint32_t i = 0; i < rec.count; ++i) sum += rec.ids[i];
      }
      boards[r]->Executed(tail);
    }
    cursor = tail;
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  if (sum == 42) std::printf("#\n");  // keeps the reads
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace
}  // namespace kolo

int main(int argc, char** argv) {
  kolo::Flags flags;
  if (!kolo::ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: %s [--ranks 16,64,...] [--tensors N] [--cycles N] "
                 "[--cold 0|1] [--ranks-per-host N] [--hits auto|list]\n",
                 argv[0]);
    return 2;
  }
  std::printf(
      "# coordinator cost per negotiation cycle, %d tensors per rank per "
      "cycle,\n"
      "# median of %d cycles (one process, no network)\n",
      flags.tensors, flags.cycles);
  std::printf(
      "# hier: steady state through the host relay as built (%d ranks per\n"
      "# host): the coordinator's cycle over one message per host (one\n"
      "# process, the hosts' messages made beforehand by HostBatch); host:\n"
      "# one leader's batching of its ranks' lists; board: one host's steady\n"
      "# cycle on the hit board (jobs on one host), every local rank's share\n"
      "# summed\n",
      flags.ranks_per_host);
  std::printf(
      "# %6s | %11s %9s %9s | %11s %9s %9s | %11s | %9s | %9s %9s | %9s\n",
      "ranks", "steady(us)", "us/rank", "req(B)", "cold(us)", "us/rank",
      "req(B)", "first(us)", "resp(B)", "hier(us)", "host(us)", "board(us)");
  // A cache with the tensors' ids, for the board's lists.
  kolo::Coordinator reference = kolo::MakeCoordinator(1, 1024);
  {
    std::string response;
    size_t responses = 0;
    kolo::Cycle(reference, kolo::FullLists(1, flags.tensors, 0), &response,
                &responses);
  }
  const double board_us = kolo::BoardCycle(flags, reference);
  for (int ranks : flags.ranks) {
    double first = 0;
    const auto steady = kolo::Measure(ranks, flags, /*steady=*/true, &first);
    double host_us = 0;
    const double hier_us = kolo::MeasureRelayed(ranks, flags, &host_us);
    const auto cold =
        flags.cold ? kolo::Measure(ranks, flags, /*steady=*/false, nullptr)
                   : kolo::CycleCost();
    std::printf(
        "  %6d | %11.1f %9.3f %9zu | %11.1f %9.3f %9zu | %11.1f | %9zu | "
        "%9.1f %9.1f | %9.1f\n",
        ranks, steady.median_us, steady.median_us / ranks,
        steady.request_bytes_per_rank, cold.median_us, cold.median_us / ranks,
        cold.request_bytes_per_rank, first, steady.response_bytes, hier_us,
        host_us, board_us);
    std::fflush(stdout);
  }
  return 0;
}
