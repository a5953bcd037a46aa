#include "runtime/runtime_impl.h"

#include <signal.h>

#include <unistd.h>

#include <algorithm>

#include "runtime/format.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/fusion.h"
#include "runtime/net/sha256.h"
#include "runtime/rendezvous/tcp_store.h"

namespace kolo {
namespace {

// A rank that cannot reach the coordinator gives up this long after the
// coordinator itself would have reported the op timeout.
constexpr absl::Duration kLocalTimeoutSlack = absl::Seconds(2);
// After a collective fails, how long to wait for the control plane to name
// the lost rank.
constexpr absl::Duration kExplainWait = absl::Seconds(1);

// Whether every rank in `ranks` (global) published the same host identity
// as `me` in Start().
absl::StatusOr<bool> AllOnHost(Store& store, const std::vector<int>& ranks,
                               int me, absl::Duration timeout) {
  auto mine = store.Get(absl::StrCat("host/", me), timeout);
  if (!mine.ok()) return mine.status();
  for (int r : ranks) {
    auto theirs = store.Get(absl::StrCat("host/", r), timeout);
    if (!theirs.ok()) return theirs.status();
    if (*theirs != *mine) return false;
  }
  return true;
}

// Note [Failures at start] in tools/kolorun/launcher.cc: kolorun watches
// the claims. A store that was listening before the worker started answers
// a connection at once; this long is only for a loaded machine.
constexpr absl::Duration kListeningStoreConnectTimeout = absl::Seconds(2);

// Who this process is, for messages about two workers claiming one rank.
std::string ProcessIdentity() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat("pid ", getpid(), " on ", host);
}

// The settings every rank of a job must share: a difference would make the
// ranks disagree on the protocol (the response cache), the data path or the
// results.
std::string SharedSettings(const Options& o) {
  return absl::StrCat("KOLO_SIZE=", o.size, "\n", "KOLO_SHM=", o.shm ? 1 : 0,
                      "\n", "KOLO_CACHE_CAPACITY=", o.cache_capacity, "\n",
                      "KOLO_HIERARCHICAL_ALLREDUCE=",
                      o.hierarchical_allreduce ? 1 : 0, "\n",
                      "join average over the set size=",
                      o.join_average_over_set_size ? 1 : 0, "\n",
                      "process sets at start=", o.process_sets.size());
}

// Claims this rank's place in the store (a second worker with the same rank
// fails here, naming both) and checks that this rank's shared settings
// equal rank 0's. Every error names the ranks and the values.
absl::Status ClaimRank(Store& store, const Options& o) {
  const std::string me = ProcessIdentity();
  absl::StatusOr<int64_t> claims = store.Add(absl::StrCat("claim/", o.rank), 1);
  if (!claims.ok()) return claims.status();
  if (*claims == 1) {
    absl::Status s = store.Set(absl::StrCat("claimant/", o.rank), me);
    if (!s.ok()) return s;
  } else {
    absl::StatusOr<std::string> first =
        store.Get(absl::StrCat("claimant/", o.rank), absl::Seconds(2));
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", o.rank, " is claimed by two workers: ",
        first.ok() ? *first : "another worker", " and this one (", me,
        "); every worker needs a rank of its own (KOLO_RANK, or the "
        "launcher's rank variable)"));
  }
  const std::string mine = SharedSettings(o);
  absl::Status s = store.Set(absl::StrCat("settings/", o.rank), mine);
  if (!s.ok() || o.rank == 0) return s;
  absl::StatusOr<std::string> theirs =
      store.Get("settings/0", o.start_timeout);
  if (!theirs.ok()) {
    return absl::Status(
        theirs.status().code(),
        absl::StrCat("rank ", o.rank, ": rank 0 did not join the rendezvous: ",
                     theirs.status().message()));
  }
  if (*theirs == mine) return absl::OkStatus();
  std::vector<std::string> ours = absl::StrSplit(mine, '\n');
  std::vector<std::string> zeros = absl::StrSplit(*theirs, '\n');
  std::vector<std::string> differences;
  for (size_t i = 0; i < ours.size(); ++i) {
    const std::string& zero = i < zeros.size() ? zeros[i] : "(unset)";
    if (ours[i] == zero) continue;
    const size_t eq = ours[i].find('=');
    differences.push_back(absl::StrCat(
        ours[i].substr(0, eq), " is ", ours[i].substr(eq + 1), " on rank ",
        o.rank, " but ", zero.substr(zero.find('=') + 1), " on rank 0"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "rank ", o.rank, " and rank 0 disagree on settings every rank must "
      "share: ", absl::StrJoin(differences, "; ")));
}

}  // namespace

RuntimeImpl::RuntimeImpl(const Options& options)
    : options_(options),
      logger_(options.log_level, options.rank),
      queue_([this] { Notify(); }) {}

RuntimeImpl::~RuntimeImpl() {
  // Only reached once the background thread no longer runs our code, or
  // from that thread itself as the last owner.
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  // No control-plane reader calls Fatal() after this.
  if (control_) control_->Close();
  // Then the device paths, while everything their failure reports reach
  // (Fatal) still exists; each executor goes before its backend, whose
  // destructor fails what is still queued on the device.
  std::vector<std::pair<std::unique_ptr<Executor>, std::unique_ptr<Backend>>>
      device_paths;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto& [id, set] : sets_) {
      if (set->cuda_executor) {
        device_paths.emplace_back(std::move(set->cuda_executor),
                                  std::move(set->cuda_backend));
      }
    }
  }
  for (auto& [executor, backend] : device_paths) {
    executor.reset();
    backend.reset();
  }
  timeline_.Stop();
  if (store_server_) store_server_->Stop();
}

absl::Status RuntimeImpl::Start() {
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  // A write to a peer that died must fail with EPIPE, not kill this process
  // (gloo writes without MSG_NOSIGNAL). Only the default disposition is
  // changed; a handler the program installed is left alone.
  struct sigaction pipe_action;
  if (sigaction(SIGPIPE, nullptr, &pipe_action) == 0 &&
      pipe_action.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
  if (options_.insecure_no_secret) {
    logger_.Warning(
        "KOLO_INSECURE_NO_SECRET=1: this job uses a fixed, publicly known "
        "secret; anyone who can reach kolo's ports can join or disrupt it");
  }
  std::shared_ptr<Store> base = options_.store;
  if (!base && options_.size > 1) {
    if (options_.secret.empty()) {
      return absl::FailedPreconditionError(
          "no job secret: set KOLO_SECRET_FILE or KOLO_SECRET (kolorun sets "
          "them for you)");
    }
    if (options_.host_store && options_.rank == 0) {
      auto server = rendezvous::TcpStoreServer::Start(
          options_.bind_addr, options_.rendezvous_port, options_.secret);
      if (!server.ok()) return server.status();
      store_server_ = std::move(*server);
    }
    // A store that listened before this process started answers at once:
    // waiting for it only hides a wrong address.
    const absl::Duration connect_timeout =
        options_.store_listening
            ? std::min(options_.start_timeout, kListeningStoreConnectTimeout)
            : options_.start_timeout;
    auto client = rendezvous::ConnectTcpStore(
        options_.rendezvous_addr, options_.rendezvous_port, options_.secret,
        connect_timeout);
    if (!client.ok()) {
      return absl::Status(
          client.status().code(),
          absl::StrCat(
              "rank ", options_.rank, ": cannot reach the rendezvous store at ",
              options_.rendezvous_addr, ":", options_.rendezvous_port, ": ",
              client.status().message(),
              options_.store_listening && !absl::IsPermissionDenied(
                                              client.status())
                  ? "; kolorun's store was listening before this worker "
                    "started, so KOLO_RENDEZVOUS_ADDR/KOLO_RENDEZVOUS_PORT "
                    "do not name it (were they changed for this worker?)"
                  : ""));
    }
    base = *client;
  }
  if (!base) base = NewInMemoryStore();  // A job of one.
  // Note [Generations]
  // An elastic job re-forms as generation 1, 2, ... after it loses or gains
  // workers (kolo/elastic.h), in the same store. Generation g > 0 keeps its
  // keys under "kolo/g<g>" (generation 0 under "kolo", where kolorun's start
  // checks look), so that claims, addresses and readiness of different
  // generations never meet; and its control channel authenticates with
  // HMAC(secret, "kolo generation <g>") rather than the secret itself, so
  // that a worker still in an older generation that reaches a newer one's
  // ports fails the handshake like a stranger. The store itself is
  // authenticated with the job secret: it serves every generation.
  store_ = NewPrefixStore(
      options_.generation > 0 ? absl::StrCat("kolo/g", options_.generation)
                              : std::string("kolo"),
      base);
  const std::string channel_secret =
      options_.generation > 0
          ? net::HmacSha256(options_.secret)
                .MacString({"kolo generation ",
                            absl::StrCat(options_.generation)})
          : options_.secret;
  if (options_.size > 1) {
    absl::Status joined = ClaimRank(*store_, options_);
    if (!joined.ok()) return joined;
  }

  // Which host this rank runs on, for the choice of shared memory (see
  // AllOnHost, HostsShareRanks) and hierarchical backends.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  absl::Status published =
      store_->Set(absl::StrCat("host/", options_.rank),
                  absl::StrCat(options_.cross_rank, "@", host));
  if (!published.ok()) return published;

  if (options_.size > 1) {
    if (options_.secret.empty()) {
      return absl::FailedPreconditionError(
          "no job secret: the control channel needs Options::secret");
    }
    ControlCallbacks callbacks;
    callbacks.notify = [this] { Notify(); };
    callbacks.on_fatal = [this](const absl::Status& s) { Fatal(s); };
    // Note [Liveness]: a peer silent for half the op timeout plus one
    // heartbeat interval is lost, so a stopped rank is reported after at
    // least timeout/2 (its last heartbeat may have come one interval before
    // it stopped) and well before the op timeout; a slow but running rank
    // keeps sending heartbeats and is never reported.
    Liveness liveness;
    liveness.heartbeat_interval =
        std::min(absl::Seconds(1), options_.op_timeout / 8);
    liveness.heartbeat_timeout =
        options_.op_timeout / 2 + liveness.heartbeat_interval;
    auto control = ControlPlane::Create(options_.rank, options_.size, store_,
                                        channel_secret, options_.bind_addr,
                                        deadline, std::move(callbacks), liveness);
    if (!control.ok()) return control.status();
    control_ = std::move(*control);
  }

  std::vector<int> all(options_.size);
  for (int r = 0; r < options_.size; ++r) all[r] = r;
  if (control_ && options_.shm) {
    auto local = AllOnHost(*store_, all, options_.rank, options_.start_timeout);
    if (!local.ok()) return local.status();
    if (*local) {
      absl::Status shm = control_->EnableSharedMemory(*store_, deadline);
      if (!shm.ok()) return shm;
      if (Wakeup* doorbell = control_->doorbell()) {
        // Before the background thread starts; events that rang the old
        // word are seen by its first pass.
        wakeup_.store(doorbell);
      }
    }
    logger_.Info(absl::StrCat("control plane over ", control_->shared_memory()
                                                         ? "shared memory"
                                                         : "TCP"));
  }
  RegisterProcessSet(kGlobalProcessSet, all);
  absl::Status s = ConnectProcessSet(*sets_.at(kGlobalProcessSet));
  if (!s.ok()) return s;
  if (!options_.timeline_path.empty() && options_.rank == 0) {
    s = timeline_.Start(options_.timeline_path, options_.timeline_mark_cycles);
    if (!s.ok()) return s;
  }

  // Tells kolorun that this rank finished rendezvous.
  s = store_->Set(absl::StrCat("ready/", options_.rank), "1");
  if (!s.ok()) return s;

  accepting_ = true;
  thread_ = std::thread([self = shared_from_this()] { self->BackgroundLoop(); });
  logger_.Info(absl::StrCat("joined a job of ", options_.size, " ranks"));
  return absl::OkStatus();
}

absl::StatusOr<Work> RuntimeImpl::Submit(TensorEntry entry) {
  return Submit(std::make_unique<TensorEntry>(std::move(entry)));
}

absl::StatusOr<Work> RuntimeImpl::Submit(std::unique_ptr<TensorEntry> owned) {
  const TensorEntry& entry = *owned;
  if (!accepting_) {
    absl::Status f = fatal_status();
    if (!f.ok()) return f;
    return absl::FailedPreconditionError(absl::StrCat(
        CollectiveName(entry.request.type()), " \"", entry.request.name(),
        "\": the runtime was shut down"));
  }
  if (entry.input.device.type == DeviceType::kCuda) {
    // One NCCL communicator per process set and rank: on one GPU.
    auto set = MemberSet(entry.request.process_set(),
                         CollectiveName(entry.request.type()));
    if (!set.ok()) return set.status();
    int expected = -1;
    const int index = entry.input.device.index;
    if (!(*set)->cuda_device.compare_exchange_strong(expected, index) &&
        expected != index) {
      return absl::InvalidArgumentError(absl::StrCat(
          CollectiveName(entry.request.type()), " \"", entry.request.name(),
          "\": the tensor is on cuda:", index, " but rank ", options_.rank,
          " already runs process set ", entry.request.process_set(),
          " on cuda:", expected,
          "; a rank uses one GPU per process set"));
    }
  }
  owned->request.set_rank(options_.rank);
  if (!owned->work) owned->work = std::make_shared<internal::WorkState>();
  owned->work->SetWaitPolicy(options_.spin_time, waiters_);
  if (owned->group && owned->group->work) {
    owned->group->work->SetWaitPolicy(options_.spin_time, waiters_);
  }
  owned->deadline = absl::Now() + options_.op_timeout + kLocalTimeoutSlack;
  Work work(owned->work);
  absl::Status s = queue_.Add(std::move(owned));
  if (!s.ok()) return s;
  return work;
}

absl::StatusOr<int> RuntimeImpl::Join() {
  TensorEntry entry;
  entry.request.set_type(wire::JOIN);
  entry.request.set_name("__kolo_join__");
  auto work = Submit(std::move(entry));
  if (!work.ok()) return work.status();
  absl::Status s = work->Wait();
  if (!s.ok()) return s;
  return static_cast<int>(work->received_splits().at(0));
}

absl::Status RuntimeImpl::StartTimeline(const std::string& path,
                                        bool mark_cycles) {
  if (options_.rank != 0) return absl::OkStatus();
  return timeline_.Start(path, mark_cycles);
}

absl::Status RuntimeImpl::StopTimeline() {
  timeline_.Stop();
  return absl::OkStatus();
}

RuntimeStats RuntimeImpl::stats() const {
  RuntimeStats s;
  s.requests_sent = counters_.requests_sent;
  s.cache_hits_sent = counters_.cache_hits_sent;
  s.request_lists_sent = counters_.request_lists_sent;
  s.response_lists_received = counters_.response_lists_received;
  s.collectives_executed = counters_.collectives_executed;
  s.tensors_executed = counters_.tensors_executed;
  std::lock_guard<std::mutex> lock(sets_mu_);
  for (const auto& [id, set] : sets_) {
    if (set->executor) s.host_buffer_bytes += set->executor->buffer_bytes();
    if (set->coordinator) {
      s.coordinator_requests_received += set->coordinator->requests_received();
      s.coordinator_cache_hits_received +=
          set->coordinator->cache_hits_received();
    }
  }
  return s;
}

void RuntimeImpl::Notify() { wakeup_.load()->Notify(); }

void RuntimeImpl::Fatal(const absl::Status& status, bool quiet) {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!fatal_.ok()) return;
    fatal_ = status;
  }
  state_cv_.notify_all();
  accepting_ = false;
  if (quiet) {
    logger_.Info(std::string(status.message()));
  } else {
    logger_.Error(std::string(status.message()));
  }
  queue_.Close(status);
  // Note [Buffers of a failed collective]
  // The collective the background thread is executing is not completed
  // here: until the backend returns it reads and writes the callers'
  // buffers (and gloo's I/O thread may still receive into them), and a
  // caller whose Wait() returned may free them. Closing the data-plane
  // connections below makes the backend return at once (shm's barrier
  // wakes, gloo's pairs fail), and makes peers blocked in a collective with
  // us fail instead of waiting for their timeout; the executor then
  // completes the collective's Works with this status as the cause
  // (ExplainCollectiveFailure).
  // Closing our data-plane connections makes peers blocked in a collective
  // with us fail at once instead of at their timeout; ours ends the same way.
  std::vector<std::shared_ptr<ProcessSetState>> sets;
  std::vector<std::pair<Executor*, Backend*>> device_paths;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto& [id, set] : sets_) {
      sets.push_back(set);
      if (set->cuda_executor) {
        device_paths.emplace_back(set->cuda_executor.get(),
                                  set->cuda_backend.get());
      }
    }
  }
  for (auto& set : sets) {
    if (set->backend) set->backend->Close();
  }
  // Collectives already queued on a device fail now; the backend aborts
  // its communicators so that nothing waits on them any more.
  for (auto& [executor, backend] : device_paths) {
    executor->FailPending(status);
    backend->Close();
  }
  Notify();
}

absl::Status RuntimeImpl::fatal_status() {
  std::lock_guard<std::mutex> lock(state_mu_);
  return fatal_;
}

absl::Status RuntimeImpl::ExplainCollectiveFailure(const absl::Status& error) {
  std::unique_lock<std::mutex> lock(state_mu_);
  state_cv_.wait_for(lock, absl::ToChronoNanoseconds(kExplainWait),
                     [&] { return !fatal_.ok(); });
  if (!fatal_.ok()) return fatal_;
  return error;
}

// Note [Background loop]
// The loop sleeps until something happens: a caller submitted work, a
// control message arrived, or a deadline is due (the coordinator's batching
// window, an op timeout, the stall inspector). There is no fixed tick: an
// idle job costs nothing and a lone request is sent at once (a burst as one
// list: Note [Coalescing submissions]). It waits on one
// Wakeup (runtime/sync/wakeup.h), which callers, control-plane reader
// threads and, over shared memory, peers ring; while some caller is blocked
// in Work::Wait it first spins for KOLO_SPIN_TIME, since the answer it
// waits for usually comes within microseconds and a kernel wake-up costs
// tens of them. Each pass:
//  1. sends this rank's new requests, per process set, to the coordinator
//     (cache ids where the response cache knows them);
//  2. rank 0: feeds received request lists to the sets' Coordinators; other
//     ranks: execute received response lists in order;
//  3. rank 0: for each set with ready names, waits at most KOLO_CYCLE_TIME
//     from the oldest ready name for more names to complete (only while
//     some are partially submitted), then fuses, sends and executes a list.
void RuntimeImpl::BackgroundLoop() {
  const bool coordinator = options_.rank == 0;
  Wakeup& wakeup = *wakeup_.load();
  absl::Time next_wakeup = absl::InfiniteFuture();
  bool done = false;
  bool first_pass = true;
  uint32_t epoch = wakeup.Epoch();
  // Spinning is allowed until then: while a caller waits, and for one spin
  // time after the last pass that saw one (a caller that waited usually
  // submits again at once).
  absl::Time spin_until = absl::InfinitePast();
  while (!done) {
    if (!first_pass) {
      // Note [Spin then block]: spin only around a caller's wait.
      const absl::Time now = absl::Now();
      if (waiters_->load(std::memory_order_seq_cst) > 0) {
        spin_until = now + options_.spin_time;
      }
      wakeup.Wait(epoch, next_wakeup,
                  std::max(absl::ZeroDuration(), spin_until - now));
      epoch = wakeup.Epoch();
    }
    first_pass = false;
    if (!fatal_status().ok()) break;
    const absl::Time now = absl::Now();
    next_wakeup = absl::InfiniteFuture();
    timeline_.CycleStart();

    CoalesceSubmissions();
    SendRequests(absl::Now());
    if (!fatal_status().ok()) break;
    if (control_) {
      for (ControlEvent& event : control_->TakeEvents()) {
        if (coordinator && event.message.has_request_list()) {
          wire::RequestList& list = *event.message.mutable_request_list();
          std::shared_ptr<ProcessSetState> set;
          {
            std::lock_guard<std::mutex> lock(sets_mu_);
            auto it = sets_.find(list.process_set());
            if (it != sets_.end()) set = it->second;
          }
          auto me = set ? std::find(set->ranks.begin(), set->ranks.end(),
                                    event.from_rank)
                        : std::vector<int>::iterator();
          if (!set || me == set->ranks.end()) {
            Fatal(absl::InternalError(absl::StrCat(
                "rank ", event.from_rank, " sent requests for process set ",
                list.process_set(), " it is not a member of")));
            break;
          }
          set->coordinator->AddRequests(
              static_cast<int>(me - set->ranks.begin()), std::move(list), now);
        } else if (!coordinator && event.message.has_response_list()) {
          const wire::ResponseList& list = event.message.response_list();
          std::shared_ptr<ProcessSetState> set;
          {
            std::lock_guard<std::mutex> lock(sets_mu_);
            set = sets_.at(list.process_set());
          }
          ExecuteList(*set, list, /*sent_here=*/false);
          if (list.shutdown()) done = true;
        } else if (!coordinator && event.message.has_shutdown_waiting()) {
          const auto& ranks = event.message.shutdown_waiting().ranks();
          std::lock_guard<std::mutex> lock(state_mu_);
          shutdown_waiting_.assign(ranks.begin(), ranks.end());
          shutdown_waiting_known_ = true;
        }
        if (!fatal_status().ok()) break;
      }
    }
    if (coordinator && !done) CoordinatorStep(now, &next_wakeup, &done);
    if (!fatal_status().ok()) break;
    next_wakeup = std::min(next_wakeup,
                           queue_.ExpireLocal(now, options_.op_timeout));
  }
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    loop_done_ = true;
  }
  state_cv_.notify_all();
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
void RuntimeImpl::CoalesceSubmissions() {
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

void RuntimeImpl::SendRequests(absl::Time now) {
  const bool send_shutdown = shutdown_requested_ && !shutdown_sent_;
  if (!queue_.has_new_requests() && !send_shutdown) return;
  std::map<int, wire::RequestList> lists;
  std::map<int, std::shared_ptr<ProcessSetState>> sets;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    sets.insert(sets_.begin(), sets_.end());
  }
  // Under the queue's lock, without copies: a cached request travels as
  // its id, only a new one as a copy.
  queue_.TakeNewRequests([&](const wire::Request& r) {
    ProcessSetState& set = *sets.at(r.process_set());
    wire::RequestList& list = lists[r.process_set()];
    if (r.type() == wire::JOIN) joined_ = true;
    const int64_t id = set.cache->Lookup(r);
    if (id >= 0) {
      list.add_cached_ids(id);
      ++counters_.cache_hits_sent;
    } else {
      *list.add_requests() = r;
      ++counters_.requests_sent;
    }
  });
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
    ++counters_.request_lists_sent;
    if (options_.rank == 0) {
      set.coordinator->AddRequests(set.rank, std::move(list), now);
    } else {
      wire::ControlMessage message;
      *message.mutable_request_list() = std::move(list);
      absl::Status s = control_->SendToCoordinator(message);
      if (!s.ok()) {
        Fatal(s);
        return;
      }
    }
  }
}

void RuntimeImpl::CoordinatorStep(absl::Time now, absl::Time* next_wakeup,
                                  bool* done) {
  std::vector<std::shared_ptr<ProcessSetState>> sets;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto& [id, set] : sets_) sets.push_back(set);
  }
  // The global set goes last: at shutdown its list is the final one.
  std::rotate(sets.begin(), sets.begin() + 1, sets.end());
  const bool all_shutdown = sets.back()->coordinator->AllShutdown();
  ReportShutdownWaiting(*sets.back()->coordinator);
  for (auto& set : sets) {
    Coordinator& c = *set->coordinator;
    c.ExpireOlderThan(options_.op_timeout, now);
    if (options_.stall_check_time > absl::ZeroDuration()) {
      for (const std::string& line : c.StallReport(options_.stall_check_time, now)) {
        logger_.Warning(absl::StrCat(
            "stalled collectives", set->id ? absl::StrCat(" in process set ", set->id) : "",
            ": ", line, " not submitted after ",
            FormatSeconds(options_.stall_check_time)));
      }
      *next_wakeup = std::min(*next_wakeup, c.NextStallCheck(options_.stall_check_time));
    }
    if (options_.stall_shutdown_time > absl::ZeroDuration()) {
      if (auto stalled = c.StalledPast(options_.stall_shutdown_time, now)) {
        wire::ControlMessage message;
        message.mutable_job_failed()->set_code(
            static_cast<int>(absl::StatusCode::kDeadlineExceeded));
        message.mutable_job_failed()->set_message(*stalled);
        if (control_) control_->Broadcast(message).IgnoreError();
        Fatal(absl::DeadlineExceededError(*stalled));
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
      wire::ResponseList list = c.TakeResponseList();
      // Every rank asked to shut down: the global set's list is the last
      // one (after every other set's), since no rank can add requests.
      list.set_shutdown(all_shutdown && set->id == kGlobalProcessSet);
      SendList(*set, list);
      if (!fatal_status().ok()) return;
      if (list.shutdown()) *done = true;
    }
    *next_wakeup =
        std::min(*next_wakeup, c.NextPendingDeadline(options_.op_timeout));
  }
}

void RuntimeImpl::ReportShutdownWaiting(const Coordinator& global) {
  const std::set<int>& asked = global.ShutdownRanks();
  if (asked.empty()) return;
  std::vector<int> waiting;
  for (int r = 0; r < global.size(); ++r) {
    if (!asked.count(r)) waiting.push_back(r);
  }
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (shutdown_waiting_known_ && shutdown_waiting_ == waiting) return;
    shutdown_waiting_ = waiting;
    shutdown_waiting_known_ = true;
  }
  if (!control_ || waiting.empty()) return;  // Empty: the final list says it.
  wire::ControlMessage message;
  for (int r : waiting) message.mutable_shutdown_waiting()->add_ranks(r);
  control_->Broadcast(message).IgnoreError();  // A lost rank is reported anyway.
}

void RuntimeImpl::SendList(ProcessSetState& set, const wire::ResponseList& list) {
  if (control_) {
    if (list.shutdown()) control_->MarkShuttingDown();
    wire::ControlMessage message;
    *message.mutable_response_list() = list;
    absl::Status s = control_->SendTo(set.ranks, message);
    if (!s.ok()) {
      Fatal(s);
      return;
    }
  }
  if (set.member()) ExecuteList(set, list, /*sent_here=*/true);
}

void RuntimeImpl::ExecuteList(ProcessSetState& set,
                              const wire::ResponseList& list, bool sent_here) {
  if (list.shutdown() && control_) control_->MarkShuttingDown();
  ++counters_.response_lists_received;
  // The coordinator applied the cache changes when it built the list.
  const bool apply_cache = !sent_here && !list.cache_frozen();
  for (const wire::Response& response : list.responses()) {
    ExecuteResponse(set, response, apply_cache);
    if (!fatal_status().ok()) return;
  }
  set.executed_seq = list.seq();
  // Only the coordinator reads evicted entries.
  if (!sent_here) set.cache->PruneGraveyard(list.seq());
}

void RuntimeImpl::ExecuteResponse(ProcessSetState& set,
                                  const wire::Response& compact,
                                  bool apply_cache) {
  // A response that came as cache ids is rebuilt from this rank's cache,
  // into storage kept from one response to the next.
  const bool from_cache = compact.cache_ids_size() > 0;
  const wire::Response& response = from_cache ? expanded_ : compact;
  if (from_cache && !ExpandCachedResponse(*set.cache, compact, &expanded_)) {
    Fatal(absl::InternalError(absl::StrCat(
        "rank ", options_.rank, ": response cache of process set ", set.id,
        " out of step with the coordinator")));
    return;
  }
  if (response.type() == wire::RESPONSE_ADD_PROCESS_SET) {
    std::vector<int> ranks(response.first_dims().begin(),
                           response.first_dims().end());
    RegisterProcessSet(response.value(), ranks);
    std::shared_ptr<ProcessSetState> created;
    {
      std::lock_guard<std::mutex> lock(sets_mu_);
      created = sets_.at(response.value());
    }
    absl::Status s = ConnectProcessSet(*created);
    auto entry = queue_.Take(set.id, response.names(0));
    if (entry) entry->Complete(s, {response.value()});
    if (!s.ok()) Fatal(s);
    return;
  }
  if (response.type() == wire::RESPONSE_REMOVE_PROCESS_SET) {
    absl::Status s = ForgetProcessSet(static_cast<int>(response.value()));
    auto entry = queue_.Take(set.id, response.names(0));
    if (entry) entry->Complete(s);
    return;
  }
  if (response.type() == wire::RESPONSE_JOIN) joined_ = false;

  std::vector<std::unique_ptr<TensorEntry>> taken;
  queue_.TakeAll(set.id, response.names(), &taken);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.reserve(response.names_size());
  for (int i = 0; i < response.names_size(); ++i) {
    const std::string& name = response.names(i);
    std::unique_ptr<TensorEntry> entry = std::move(taken[i]);
    if (!entry && response.type() == wire::RESPONSE_ALLREDUCE && joined_) {
      // Joined: contribute zeros so that the others' sums go on.
      entry = std::make_unique<TensorEntry>();
      const DataType dtype = static_cast<DataType>(response.dtype());
      entry->scratch = std::make_shared<std::vector<uint8_t>>(
          response.elements(i) * DataTypeSize(dtype));
      Device device;
      if (response.device_type() == static_cast<int>(DeviceType::kCuda)) {
        const int index = set.cuda_device.load();
        device = Device::Cuda(index >= 0 ? index : options_.local_rank);
      }
      entry->input = entry->output = TensorView(
          entry->scratch->data(), dtype, {response.elements(i)}, device);
      entry->work = std::make_shared<internal::WorkState>();
    }
    if (!entry) {
      if (response.type() == wire::RESPONSE_ERROR) continue;  // Not ours.
      // Every rank submitted every name of a data response: this one did
      // not, so the ranks are out of step.
      Fatal(absl::InternalError(absl::StrCat(
          "rank ", options_.rank, " received a response for \"", name,
          "\" that it never submitted")));
      return;
    }
    entries.push_back(std::move(entry));
  }
  if (apply_cache) {
    // Note [One cache protocol], as the coordinator applied it. Every name
    // of a data response has its entry, in order (or Fatal above).
    ApplyResponse(
        *set.cache, compact,
        [&](int i) -> const wire::Request* { return &entries[i]->request; },
        0);
  }
  if (entries.empty()) return;
  if (response.type() != wire::RESPONSE_ERROR) {
    ++counters_.collectives_executed;
    counters_.tensors_executed += static_cast<int64_t>(entries.size());
  }
  Executor* executor = set.executor.get();
  if (response.device_type() == static_cast<int>(DeviceType::kCuda)) {
    absl::Status connected =
        ConnectDevicePath(set, entries.front()->input.device);
    if (!connected.ok()) {
      for (auto& e : entries) e->Complete(connected);
      Fatal(connected);
      return;
    }
    executor = set.cuda_executor.get();
  }
  absl::Status s = executor->Execute(response, entries);
  if (!s.ok()) Fatal(ExplainCollectiveFailure(s));
}

bool RuntimeImpl::StopLoop(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(state_mu_);
  const bool finished = state_cv_.wait_for(
      lock, absl::ToChronoNanoseconds(deadline - absl::Now()),
      [&] { return loop_done_; });
  lock.unlock();
  if (thread_.joinable()) {
    if (finished) {
      thread_.join();
    } else {
      thread_.detach();  // Stuck in a collective; it holds a reference to us.
    }
  }
  return finished;
}

absl::Status RuntimeImpl::Shutdown(absl::Duration timeout) {
  if (stopped_.exchange(true)) {
    return absl::FailedPreconditionError(
        "Shutdown() or Abort() was already called");
  }
  const absl::Time deadline = absl::Now() + timeout;
  accepting_ = false;
  absl::Status result;
  if (!queue_.WaitDrained(deadline)) {
    result = absl::AbortedError(
        absl::StrCat("Shutdown timed out after ", FormatSeconds(timeout),
                     " with work pending"));
    queue_.Close(result);
  }
  shutdown_requested_ = true;
  Notify();
  // The loop ends once every rank has asked to shut down.
  if (!StopLoop(deadline)) {
    std::string waiting_for = "the other ranks";
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      if (shutdown_waiting_known_ && !shutdown_waiting_.empty()) {
        waiting_for = absl::StrCat(
            shutdown_waiting_.size() == 1 ? "rank " : "ranks ",
            absl::StrJoin(shutdown_waiting_, ", "),
            " (which never called Shutdown)");
      }
    }
    Fatal(absl::DeadlineExceededError(
        absl::StrCat("Shutdown timed out after ", FormatSeconds(timeout),
                     " waiting for ", waiting_for, " to shut down")));
    StopLoop(absl::Now() + absl::Milliseconds(100));
  }
  timeline_.Stop();
  if (control_) control_->Close();
  absl::Status fatal = fatal_status();
  if (absl::IsUnavailable(fatal) && options_.rank != 0) {
    // The coordinator's own Shutdown timed out a moment before ours and it
    // left: what it waited for is the reason, not its departure.
    std::lock_guard<std::mutex> lock(state_mu_);
    if (shutdown_waiting_known_ && !shutdown_waiting_.empty()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "Shutdown failed: the coordinator (rank 0) stopped waiting for ",
          shutdown_waiting_.size() == 1 ? "rank " : "ranks ",
          absl::StrJoin(shutdown_waiting_, ", "),
          " (which never called Shutdown) to shut down, and left (",
          fatal.message(), ")"));
    }
  }
  if (!fatal.ok()) return fatal;
  return result;
}

void RuntimeImpl::Abort() {
  if (stopped_.exchange(true)) return;
  Fatal(absl::AbortedError("Abort() was called"), /*quiet=*/true);
  timeline_.Stop();
  if (control_) control_->Close();
  StopLoop(absl::Now() + absl::Milliseconds(100));
}

void RuntimeImpl::StopForExit() {
  if (stopped_.exchange(true)) return;
  Fatal(absl::AbortedError("the process is exiting"), /*quiet=*/true);
  timeline_.Stop();
  if (control_) control_->Close();
  StopLoop(absl::Now() + absl::Milliseconds(500));
}

}  // namespace kolo
