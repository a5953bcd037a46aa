// Fuzzes the hit board's protocol (Note [Hits on the board] in
// runtime/control/hit_board.h): 2-6 ranks and a model of the coordinator
// drive one real HitBoard in the order the fuzzer's bytes choose. Ranks
// submit ids (some sharing a slot), send their hits the way the runtime
// does (on the board while it is usable, the rest to the coordinator in a
// "request list" that stays in transit until delivered), execute the log,
// flush ready ids; the coordinator delivers lists (closing the board
// first, its bits becoming hits), completes ids every rank sent it by
// appending a list's marker, and opens the board when quiet. Checked
// throughout and after a final drain: every id a rank executes is one it
// has in flight, every rank executes the same sequence, nothing runs
// twice, and in the end every submission has run on every rank.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/time/time.h"
#include "runtime/control/hit_board.h"

namespace {

using kolo::HitBoard;
using kolo::HitBoardLock;
using kolo::HitBoardShared;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "board_fuzzer: %s\n", what);
    std::abort();
  }
}

bool Always() { return true; }

struct Rank {
  std::set<int64_t> in_flight;                  // submitted, not executed
  std::map<int64_t, int> submitted;             // times each id was submitted
  std::vector<int64_t> unsent;                  // submitted, not yet sent
  uint64_t cursor = 0;                          // log records executed
  std::vector<int64_t> executed;                // in order
  std::deque<std::vector<int64_t>> in_transit;  // lists to the coordinator
};

struct Job {
  explicit Job(int n) : n(n), shared(new HitBoardShared()), ranks(n) {
    HitBoard::Init(shared.get(), n, true, 1 << 20);
    for (int r = 0; r < n; ++r) {
      boards.push_back(std::make_unique<HitBoard>(shared.get(), r, n));
    }
    received.assign(n, 0);
  }
  HitBoard& board(int r) { return *boards[r]; }
  // Takes rank r's board lock, for a HitBoardLock to hold.
  void Lock(int r) {
    Check(board(r).Lock(absl::InfiniteFuture(), Always), "lock");
  }

  void Submit(int r, int64_t id) {
    if (ranks[r].in_flight.count(id)) return;  // a name is in flight once
    ranks[r].in_flight.insert(id);
    ranks[r].unsent.push_back(id);
    ++ranks[r].submitted[id];
  }
  // SendRequests.
  void Send(int r) {
    Rank& k = ranks[r];
    if (k.unsent.empty()) return;
    HitBoard& b = board(r);
    std::vector<int64_t> to_coordinator = k.unsent;
    {
      Lock(r);
      HitBoardLock locked(&b);
      if (b.Usable(k.cursor)) {
        std::vector<int64_t> complete, refused;
        b.Set(k.unsent, clock++, &complete, &refused);
        to_coordinator = refused;
        b.Publish(&complete);
      }
      if (!to_coordinator.empty() && r != 0) b.CountSent();
    }
    k.unsent.clear();
    if (to_coordinator.empty()) return;
    if (r == 0) {
      Close();  // rank 0's own list reaches the coordinator at once
      for (int64_t id : to_coordinator) hits[id].insert(0);
    } else {
      k.in_transit.push_back(to_coordinator);
    }
  }
  // The coordinator takes one list of rank r.
  void Deliver(int r) {
    Rank& k = ranks[r];
    if (k.in_transit.empty()) return;
    Close();
    ++received[r];
    for (int64_t id : k.in_transit.front()) {
      Check(hits[id].insert(r).second, "a rank sent an id twice");
    }
    k.in_transit.pop_front();
  }
  void Close() {
    std::vector<HitBoard::Pulled> pulled;
    {
      Lock(0);
      HitBoardLock locked(&board(0));
      legit_until = std::max(legit_until, board(0).tail());
      board(0).Close(&pulled);
    }
    for (const auto& p : pulled) {
      Check(hits[p.id].insert(p.rank).second, "a bit pulled twice");
    }
  }
  bool Quiet() const { return hits.empty(); }
  void OpenIfQuietLocked() {
    if (board(0).open() || !Quiet()) return;
    for (int r = 1; r < n; ++r) {
      if (board(0).sent(r) != received[r]) return;
    }
    board(0).Open();
  }
  // The coordinator makes a list of every id all ranks sent it, after rank
  // 0 executed the log to its end (as CoordinatorStep does).
  // `empty`: a list with nothing of the model's in it (an error, a
  // process set), so that the log can fill up when a rank lags.
  void MakeList(bool empty = false) {
    std::vector<int64_t> ready;
    for (const auto& [id, who] : hits) {
      if (!empty && static_cast<int>(who.size()) == n) ready.push_back(id);
    }
    if (ready.empty() && !empty) return;
    Close();
    Execute(0);
    if (ranks[0].cursor != board(0).tail() || !board(0).HasRoom(1)) return;
    Lock(0);
    HitBoardLock locked(&board(0));
    const int64_t seq = ++list_seq;
    Check(board(0).AppendList(seq), "no room for a marker after HasRoom");
    for (int64_t id : ready) hits.erase(id);
    lists[seq] = ready;
    OpenIfQuietLocked();
  }
  void TryOpen() {
    Lock(0);
    HitBoardLock locked(&board(0));
    OpenIfQuietLocked();
  }
  void Run(int r, int64_t id) {
    Rank& k = ranks[r];
    Check(k.in_flight.erase(id) == 1, "executed an id the rank does not hold");
    k.executed.push_back(id);
  }
  // Executes the log from the rank's cursor.
  void Execute(int r) {
    Rank& k = ranks[r];
    HitBoard& b = board(r);
    const uint64_t tail = b.tail();
    for (; k.cursor < tail; ++k.cursor) {
      const HitBoardShared::Record& rec = b.record(k.cursor);
      if (rec.kind == HitBoardShared::kIds) {
        Check(rec.count > 0, "an empty record");
        for (uint32_t i = 0; i < rec.count; ++i) Run(r, rec.ids[i]);
      } else {
        Check(rec.kind == HitBoardShared::kList, "a record of no kind");
        auto it = lists.find(rec.list_seq);
        Check(it != lists.end(), "a marker of no list");
        for (int64_t id : it->second) Run(r, id);
      }
    }
    b.Executed(k.cursor);
  }
  void Flush(int r) {
    if (!board(r).ready_pending()) return;
    Lock(r);
    HitBoardLock locked(&board(r));
    board(r).FlushReady();
  }
  // The invariant the protocol keeps: while the board is open the
  // coordinator holds no hit and nothing is on its way to it... except
  // lists sent after it opened, which close it when they arrive.
  // And while it is closed only the coordinator appends (markers).
  void CheckOpen() {
    const uint64_t tail = board(0).tail();
    if (board(0).open()) {
      Check(Quiet(), "the board is open while the coordinator holds hits");
      checked = tail;
      return;
    }
    for (uint64_t pos = std::max(checked, legit_until); pos < tail; ++pos) {
      Check(board(0).record(pos).kind == HitBoardShared::kList,
            "ids appended while the board was closed");
    }
    checked = tail;
  }

  const int n;
  std::unique_ptr<HitBoardShared> shared;
  std::vector<std::unique_ptr<HitBoard>> boards;
  std::vector<Rank> ranks;
  std::map<int64_t, std::set<int>> hits;  // the coordinator's
  std::vector<uint64_t> received;
  std::map<int64_t, std::vector<int64_t>> lists;
  int64_t list_seq = 0;
  int64_t clock = 1;
  int64_t fresh = 0;         // ids of case 9 handed out
  uint64_t checked = 0;      // records CheckOpen has looked at
  uint64_t legit_until = 0;  // records appended before the last close
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int n = 2 + data[0] % 5;
  Job job(n);
  for (size_t i = 1; i + 1 < size; i += 2) {
    const int r = data[i] % n;
    const uint8_t arg = data[i + 1];
    // 200 ids (more than the log's records: a lagging rank can let it
    // fill), and four that share a slot with others.
    const int64_t id = arg >= 200 ? arg % 4 + HitBoardShared::kSlots : arg;
    switch ((data[i] / n) % 10) {
      case 0:
      case 1:
        job.Submit(r, id);
        break;
      case 2:
        job.Send(r);
        break;
      case 3:
        job.Execute(r);
        break;
      case 4:
        job.Deliver(r);
        break;
      case 5:
        job.MakeList();
        break;
      case 6:
        job.TryOpen();
        break;
      case 7:
        job.Flush(r);
        break;
      case 8:
        for (int k = 0; k < 1 + arg % 64; ++k) job.MakeList(/*empty=*/true);
        break;
      case 9:
        // A step: every rank submits fresh ids and sends them (rank r
        // last), nobody executes; repeated, a lagging reader lets the log
        // fill.
        for (int k = 0; k < 1 + arg % 8; ++k) {
          const int64_t fresh = 1000 + job.fresh++;
          for (int q = 0; q < n; ++q) {
            job.Submit((r + 1 + q) % n, fresh);
            job.Send((r + 1 + q) % n);
          }
        }
        break;
    }
    job.CheckOpen();
  }
  // Drain: every rank submits each id as often as the rank that submitted
  // it most (as a real job does, or it stalls), everything is sent and
  // delivered, the coordinator completes what the ranks sent it, everyone
  // executes.
  for (int round = 0; round < 64; ++round) {
    std::map<int64_t, int> most;
    for (const Rank& k : job.ranks) {
      for (const auto& [id, times] : k.submitted) {
        most[id] = std::max(most[id], times);
      }
    }
    for (int r = 0; r < n; ++r) {
      for (const auto& [id, times] : most) {
        if (job.ranks[r].submitted[id] < times) job.Submit(r, id);
      }
    }
    for (int r = 0; r < n; ++r) {
      job.Send(r);
      while (!job.ranks[r].in_transit.empty()) job.Deliver(r);
    }
    job.MakeList();
    for (int r = 0; r < n; ++r) {
      job.Execute(r);
      job.Flush(r);
    }
    job.TryOpen();
    job.CheckOpen();
    bool idle = job.hits.empty();
    for (const Rank& k : job.ranks) idle = idle && k.in_flight.empty();
    if (idle) break;
  }
  for (int r = 0; r < n; ++r) {
    Check(job.ranks[r].in_flight.empty(), "a submission never ran");
    Check(job.ranks[r].executed == job.ranks[0].executed,
          "ranks executed different sequences");
  }
  Check(job.hits.empty(), "hits left at the coordinator");
  return 0;
}
