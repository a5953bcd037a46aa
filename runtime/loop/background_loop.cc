// The background loop of a Runtime: one thread per Runtime that takes
// the callers' submissions, negotiates them (as the coordinator on rank 0,
// through it elsewhere) and executes the log (the response lists in order;
// what each entry does is LogExecutor's, log_executor.h) (Note [Background
// loop]). Methods of BackgroundLoop (background_loop.h); a caller's turn is
// in caller_turn.cc, the coordinator's taking of request lists in
// accept_requests.cc. How hits are ANDed and lists sent is the job's
// HitExchange (Note [The exchange] in hit_exchange.h); the sets and their
// backends are ProcessSets' (process_sets.h).
#include "runtime/loop/background_loop.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/loop/phase_clock.h"
#include "runtime/negotiation/fusion.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/format.h"

namespace kolo {

// Note [Background loop]
// The loop sleeps until something happens: a caller submitted work, a
// control message arrived, or a deadline is due (the coordinator's batching
// window, an op timeout, the stall inspector). There is no fixed tick: an
// idle job costs nothing and a lone request is sent at once (a burst as one
// list: Note [Coalescing submissions]). It waits on one
// Wakeup (runtime/sync/wakeup.h), which callers, control-plane reader
// threads and, over shared memory, peers ring; while some caller is blocked
// in Work::Wait, and for KOLO_SPIN_TIME after one was or after a pass that
// followed new submissions, it first spins for KOLO_SPIN_TIME, since the
// answer (or the burst's next submission) usually comes within
// microseconds and a kernel wake-up costs tens of them. Each pass:
//  1. takes this rank's new requests and hands them, per process set, to
//     the exchange (Note [The exchange] in hit_exchange.h): cache ids where
//     the response cache knows them, which it ANDs with the other ranks'
//     (on one host the global set's go on the hit board while it is open,
//     and a rank that set the last bits of some ids appends them to the
//     board's log), the rest to the coordinator;
//  2. rank 0: feeds received request lists to the sets' Coordinators
//     (closing the board first); a host leader relays its host's lists;
//     other ranks: execute received response lists in order (on the
//     board, at their marker in its log); every rank: executes the
//     exchange's log (the board's) as far as it can;
//  3. rank 0: for each set with ready names, waits at most KOLO_CYCLE_TIME
//     from the oldest ready name for more names to complete (only while
//     some are partially submitted), then fuses, sends and executes a list;
//     tends the board (reopens it when quiet, takes old partial ids).
BackgroundLoop::BackgroundLoop(Context context)
    : options_(*context.options),
      logger_(*context.logger),
      timeline_(*context.timeline),
      queue_(*context.queue),
      sets_(*context.sets),
      job_(*context.job),
      log_(*context.log),
      fatal_(std::move(context.fatal)) {}

void BackgroundLoop::Wire(ControlPlane* control,
                          std::unique_ptr<HitExchange> exchange,
                          std::unique_ptr<HostMessages> host_messages,
                          Wakeup* doorbell) {
  control_ = control;
  exchange_ = std::move(exchange);
  host_messages_ = std::move(host_messages);
  // Before the background thread starts; events that rang the old word
  // are seen by its first pass.
  if (doorbell) wakeup_.store(doorbell);
}

void BackgroundLoop::Open() {
  MutexLock turn(&turn_->mu);
  turn_->loop_running = true;
}

void BackgroundLoop::RequestShutdown() {
  shutdown_requested_ = true;
  Notify();
}

int64_t BackgroundLoop::messages_sent() const {
  // A host leader sends its own lists inside its host's messages.
  std::map<std::string, int64_t> exchange;
  if (exchange_) exchange_->AddCounters(&exchange);
  return counters_.request_lists_sent + exchange["relay.host_messages_sent"];
}

void BackgroundLoop::AddCounters(
    std::map<std::string, int64_t>* counters) const {
  std::map<std::string, int64_t>& c = *counters;
  c["negotiation.requests_sent"] = counters_.requests_sent;
  c["negotiation.cache_hits_sent"] = counters_.cache_hits_sent;
  c["negotiation.request_lists_sent"] = counters_.request_lists_sent;
  c["board.hits"] = 0;
  c["relay.host_messages_sent"] = 0;
  c["relay.host_hits_sent"] = 0;
  c["relay.host_messages_received"] = counters_.host_messages_received;
  c["loop.caller_turns"] = counters_.caller_turns;
  c["loop.caller_turns_completed"] = counters_.caller_turns_completed;
  c["phase.send_ns"] = counters_.send_ns;
  if (exchange_) exchange_->AddCounters(&c);
  // The loop waits on one of the two (Wait: one thread at a time).
  const Wakeup* loop_wakeup = wakeup_.load();
  int64_t sleeps = own_wakeup_.sleeps();
  if (loop_wakeup != &own_wakeup_) sleeps += loop_wakeup->sleeps();
  c["loop.sleeps"] = sleeps;
  c["loop.sleeping"] = loop_wakeup->sleeping() ? 1 : 0;
}

void BackgroundLoop::Run() {
  const bool coordinator = options_.rank == 0;
  Wakeup& wakeup = *wakeup_.load();
  absl::Time next_wakeup = absl::InfiniteFuture();
  bool done = false;
  bool first_pass = true;
  uint32_t epoch = wakeup.Epoch();
  // Spinning is allowed until then: while a caller waits, and for one spin
  // time after the last pass that saw one (a caller that waited usually
  // submits again at once) or that followed new submissions (a burst, such
  // as a backward pass's gradients, usually goes on: Note [Spin then
  // block]).
  absl::Time spin_until = absl::InfinitePast();
  uint64_t adds_seen = queue_.adds();
  while (!done) {
    if (!first_pass) {
      // Note [Spin then block]: spin only around a caller's wait or a
      // burst of submissions.
      const absl::Time now = absl::Now();
      const uint64_t adds = queue_.adds();
      if (waiters_->load(std::memory_order_seq_cst) > 0 || adds != adds_seen) {
        spin_until = now + options_.spin_time;
      }
      adds_seen = adds;
      wakeup.Wait(epoch, next_wakeup,
                  std::max(absl::ZeroDuration(), spin_until - now));
      epoch = wakeup.Epoch();
    }
    first_pass = false;
    // Note [Caller turns]: the pass is this thread's turn (a caller that
    // has it ends its own at once).
    turn_->thread_waits.store(true, std::memory_order_relaxed);
    MutexLock turn(&turn_->mu);
    turn_->thread_waits.store(false, std::memory_order_relaxed);
    if (failed()) break;
    RunListsMadeForThread(&done);
    if (failed() || done) break;
    const absl::Time now = absl::Now();
    next_wakeup = absl::InfiniteFuture();
    timeline_.CycleStart();

    CoalesceSubmissions();
    if (control_ && control_->host_relay()) {
      // Note [Host relay]: lists that did not fit into the ring yet.
      if (control_->host_out_pending()) control_->PushHostOut();
      if (absl::Status leader = control_->HostLeaderStatus(); !leader.ok()) {
        Fatal(leader);
        break;
      }
    }
    SendRequests(absl::Now());
    exchange_->Execute(&done);  // what this rank's hits completed
    if (failed() || done) break;
    ReceiveEvents(now, &next_wakeup);
    if (failed()) break;
    exchange_->Execute(&done);
    if (failed()) break;
    if (coordinator && !done) {
      CoordinatorStep(Turn::kThread, now, &next_wakeup, &done);
    }
    if (failed()) break;
    next_wakeup =
        std::min(next_wakeup, queue_.ExpireLocal(now, options_.op_timeout));
    thread_wakes_at_ = next_wakeup;
  }
  {
    // No caller takes a turn after the loop's last.
    MutexLock turn(&turn_->mu);
    turn_->loop_running = false;
  }
  // A leader whose loop ends before the job's end (an error): its host's
  // ranks must not wait for it.
  exchange_->LoopEnded(done);
  job_.LoopEnded();
}

void BackgroundLoop::ReceiveEvents(absl::Time now, absl::Time* next_wakeup) {
  if (!control_) return;
  const bool coordinator = options_.rank == 0;
  std::vector<ControlEvent> events = control_->TakeEvents();
  // A host leader: its host's lists go on with its own.
  if (absl::Status relayed = exchange_->Relay(&events, now, next_wakeup);
      !relayed.ok()) {
    Fatal(relayed);
    return;
  }
  for (ControlEvent& event : events) {
    if (coordinator && event.message.has_request_list()) {
      if (!AcceptRequestList(event.from_rank,
                             std::move(*event.message.mutable_request_list()),
                             now)) {
        return;
      }
    } else if (coordinator && event.message.has_host_requests()) {
      if (!AcceptHostRequests(event.from_rank,
                              *event.message.mutable_host_requests(), now)) {
        return;
      }
    } else if (!coordinator && event.message.has_response_list()) {
      // Runs where the exchange's log says (Execute).
      exchange_->Hold(std::move(*event.message.mutable_response_list()));
    } else if (!coordinator && event.message.has_shutdown_waiting()) {
      const auto& ranks = event.message.shutdown_waiting().ranks();
      job_.SetShutdownWaiting({ranks.begin(), ranks.end()});
    }
    if (failed()) return;
  }
}

// Note [Coalescing submissions]
// A burst of submissions (a framework's gradient hooks, a loop over many
// tensors) is best sent as one request list: each list costs a pass here
// and one at the coordinator, and a loop that takes every tensor as it
// comes competes with the submitting thread for a core (on a machine with
// fewer cores than threads, it delays the burst it tries to serve). So
// while nobody waits yet, the loop lets a burst finish: it polls (yielding
// its core) until no submission came for 5 us, a caller waits (then it
// sends at once) or KOLO_SPIN_TIME passed. A lone request is held until its
// caller calls Wait, or 5 us. With KOLO_SPIN_TIME=0 nothing is held back.
void BackgroundLoop::CoalesceSubmissions() {
  constexpr int64_t kQuietNanos = 5000;
  if (options_.spin_time <= absl::ZeroDuration() ||
      !queue_.has_new_requests() ||
      waiters_->load(std::memory_order_seq_cst) > 0) {
    return;
  }
  // The clock is read here, not by the submitters.
  uint64_t seen = queue_.adds();
  int64_t quiet_since = internal::MonotonicNanos();
  SpinUntil(
      [&] {
        if (waiters_->load(std::memory_order_relaxed) > 0) return true;
        const uint64_t adds = queue_.adds();
        const int64_t now = internal::MonotonicNanos();
        if (adds != seen) {
          seen = adds;
          quiet_since = now;
          return false;
        }
        return now - quiet_since >= kQuietNanos;
      },
      options_.spin_time);
}

void BackgroundLoop::SendRequests(absl::Time now) {
  const bool send_shutdown = shutdown_requested_ && !shutdown_sent_;
  if (!queue_.has_new_requests() && !send_shutdown) return;
  ScopedPhase phase(options_.phase_times, &counters_.send_ns);
  std::map<int, wire::RequestList> lists;
  const std::map<int, std::shared_ptr<ProcessSetState>> sets = sets_.All();
  // Per set: the cache ids to send (as bits where dense: AddCacheHits).
  std::map<int, std::vector<int64_t>>& hits = hits_to_send_;
  for (auto& [id, ids] : hits) ids.clear();
  // Under the queue's lock, without copies: a cached request travels as
  // its id, only a new one as a copy. A step's requests come in runs of one
  // process set: the set's state, list and ids are looked up once per run
  // (std::map's references stay valid as others are added), and the
  // counters are added to once per take.
  int run_set = -1;
  ResponseCache* run_cache = nullptr;
  wire::RequestList* run_list = nullptr;
  std::vector<int64_t>* run_hits = nullptr;
  int64_t hits_taken = 0, requests_taken = 0;
  queue_.TakeNewRequests(
      now + kLocalTimeoutSlack, options_.op_timeout,
      [&](const wire::Request& r) {
        if (r.process_set() != run_set || run_cache == nullptr) {
          run_set = r.process_set();
          run_cache = sets.at(run_set)->cache;
          run_list = &lists[run_set];
          run_hits = &hits[run_set];
        }
        if (r.type() == wire::JOIN) log_.Joined();
        const int64_t id = run_cache->Lookup(r);
        if (id >= 0) {
          run_hits->push_back(id);
          ++hits_taken;
        } else {
          *run_list->add_requests() = r;
          ++requests_taken;
        }
      });
  counters_.cache_hits_sent += hits_taken;
  counters_.requests_sent += requests_taken;
  if (send_shutdown) {
    // Leaving the job leaves every set: their coordinators fail whatever
    // this rank never submitted.
    for (auto& [id, set] : sets) {
      if (set->member()) lists[id].set_shutdown(true);
    }
    shutdown_sent_ = true;
  }
  // The global set's list goes last: once the coordinator has every rank's
  // global shutdown request it has all their other messages too (one
  // ordered connection), and it closes the job.
  std::vector<int> order;
  for (auto& [id, list] : lists) {
    if (id != kGlobalProcessSet) order.push_back(id);
  }
  if (lists.count(kGlobalProcessSet)) order.push_back(kGlobalProcessSet);
  for (int id : order) {
    wire::RequestList& list = lists[id];
    ProcessSetState& set = *sets.at(id);
    list.set_process_set(id);
    list.set_acked_seq(set.executed_seq);
    // Note [The exchange]: the hits ANDed there, the rest to the
    // coordinator.
    absl::StatusOr<bool> sent = exchange_->Send(
        std::move(list), &hits[id],
        options_.rank == 0 ? set.coordinator.get() : nullptr, set.rank, now);
    if (!sent.ok()) {
      Fatal(sent.status());
      return;
    }
    if (failed()) return;
    if (*sent) ++counters_.request_lists_sent;
  }
}

void BackgroundLoop::CoordinatorStep(Turn turn, absl::Time now,
                                     absl::Time* next_wakeup, bool* done) {
  std::vector<std::shared_ptr<ProcessSetState>> sets;
  for (auto& [id, set] : sets_.All()) sets.push_back(set);
  // The global set goes last: at shutdown its list is the final one.
  std::rotate(sets.begin(), sets.begin() + 1, sets.end());
  exchange_->Tend(*sets.back()->coordinator, now, next_wakeup);
  const bool all_shutdown = sets.back()->coordinator->AllShutdown();
  bool list_deferred = false;  // a set's list waits for room in the log
  ReportShutdownWaiting(*sets.back()->coordinator);
  for (auto& set : sets) {
    Coordinator& c = *set->coordinator;
    c.ExpireOlderThan(options_.op_timeout, now);
    if (options_.stall_check_time > absl::ZeroDuration()) {
      for (const std::string& line :
           c.StallReport(options_.stall_check_time, now)) {
        logger_.Warning(absl::StrCat(
            "stalled collectives",
            set->id ? absl::StrCat(" in process set ", set->id) : "", ": ",
            line, " not submitted after ",
            FormatSeconds(options_.stall_check_time)));
      }
      *next_wakeup =
          std::min(*next_wakeup, c.NextStallCheck(options_.stall_check_time));
    }
    if (options_.stall_shutdown_time > absl::ZeroDuration()) {
      if (auto stalled = c.StalledPast(options_.stall_shutdown_time, now)) {
        const absl::Status status = absl::DeadlineExceededError(*stalled);
        if (control_) control_->FailJob(status).IgnoreError();
        Fatal(status);
        return;
      }
      *next_wakeup = std::min(
          *next_wakeup, c.NextPendingDeadline(options_.stall_shutdown_time));
    }
    bool emit = false;
    if (c.HasReady()) {
      const absl::Time batch_until = c.OldestReadyTime() + options_.cycle_time;
      if (!c.HasPartial() || now >= batch_until || all_shutdown) {
        emit = true;
      } else {
        *next_wakeup = std::min(*next_wakeup, batch_until);
      }
    }
    if (emit || (all_shutdown && set->id == kGlobalProcessSet)) {
      // The board's lists wait for the log's end and room in it.
      const bool ready = exchange_->ReadyForList(c, set->id, now, done);
      if (failed() || *done) return;
      // The final list never overtakes a list of another set that waits
      // for room (this step's global set comes last).
      if (!ready || (list_deferred && all_shutdown)) {
        // The others free room as they execute: wake them all (ranks
        // outside the set have nothing else to wake them), look again.
        list_deferred = true;
        exchange_->RingOthers();
        *next_wakeup = std::min(*next_wakeup, now + absl::Microseconds(100));
        continue;
      }
    }
    if (emit || (all_shutdown && set->id == kGlobalProcessSet)) {
      wire::ResponseList list = c.TakeResponseList();
      // Every rank asked to shut down: the global set's list is the last
      // one (after every other set's), since no rank can add requests.
      list.set_shutdown(all_shutdown && set->id == kGlobalProcessSet);
      SendList(turn, set, list);
      if (failed()) return;
      if (list.shutdown()) *done = true;
    }
    *next_wakeup = std::min(*next_wakeup, c.NextTimeout(options_.op_timeout));
  }
  // (The board may have opened at a list's marker.)
  *next_wakeup = std::min(*next_wakeup,
                          exchange_->NextCheck(*sets.back()->coordinator, now));
}

void BackgroundLoop::ReportShutdownWaiting(const Coordinator& global) {
  const std::set<int>& asked = global.ShutdownRanks();
  if (asked.empty()) return;
  std::vector<int> waiting;
  for (int r = 0; r < global.size(); ++r) {
    if (!asked.count(r)) waiting.push_back(r);
  }
  if (!job_.SetShutdownWaiting(waiting)) return;
  if (!control_ || waiting.empty()) return;  // Empty: the final list says it.
  wire::ControlMessage message;
  for (int r : waiting) message.mutable_shutdown_waiting()->add_ranks(r);
  control_->Broadcast(message)
      .IgnoreError();  // A lost rank is reported anyway.
}

void BackgroundLoop::SendList(Turn turn,
                              const std::shared_ptr<ProcessSetState>& set,
                              const wire::ResponseList& list) {
  // On the board: its marker, where every rank runs it.
  if (!exchange_->ListMade(list, set->id, *sets_.global().coordinator)) {
    return;
  }
  if (control_) {
    if (list.shutdown()) control_->MarkShuttingDown();
    wire::ControlMessage message;
    *message.mutable_response_list() = list;
    absl::Status s = control_->SendTo(set->ranks, message);
    if (!s.ok()) {
      Fatal(s);
      return;
    }
  }
  // Note [Caller turns]: what a caller may not run here waits for the
  // thread, and so does every list made after it.
  if (turn == Turn::kCaller && (!made_for_thread_.empty() ||
                                (set->member() && !log_.CallerMayRun(list)))) {
    made_for_thread_.push_back({set, list});
    return;
  }
  RunMadeList(*set, list);
}

void BackgroundLoop::RunMadeList(ProcessSetState& set,
                                 const wire::ResponseList& list) {
  if (set.member()) log_.ExecuteList(set, list, /*made_here=*/true);
  exchange_->ListExecuted();
}

void BackgroundLoop::RunListsMadeForThread(bool* done) {
  for (const MadeList& made : made_for_thread_) {
    RunMadeList(*made.set, made.list);
    if (failed()) break;
    if (made.list.shutdown()) *done = true;
  }
  made_for_thread_.clear();
}

}  // namespace kolo
