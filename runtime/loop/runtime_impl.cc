#include "runtime/loop/runtime_impl.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/api/work_state.h"
#include "runtime/loop/board_exchange.h"
#include "runtime/loop/coordinator_exchange.h"
#include "runtime/loop/leader_exchange.h"
#include "runtime/negotiation/fusion.h"
#include "runtime/net/sha256.h"
#include "runtime/rendezvous/tcp_store.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/format.h"
#include "runtime/util/status_macros.h"

namespace kolo {
namespace {

// After a collective fails, how long to wait for the control plane to name
// the lost rank.
constexpr absl::Duration kExplainWait = absl::Seconds(1);

// Whether every rank in `ranks` (global) published the same host identity
// as `me` in Start().
// Each rank's host identity, as published in Start().
absl::StatusOr<std::vector<std::string>> JobHosts(Store& store, int size,
                                                  absl::Duration timeout) {
  std::vector<std::string> hosts(size);
  for (int r = 0; r < size; ++r) {
    auto host = store.Get(absl::StrCat("host/", r), timeout);
    if (!host.ok()) return host.status();
    hosts[r] = std::move(*host);
  }
  return hosts;
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
  return absl::StrCat(
      "KOLO_SIZE=", o.size, "\n", "KOLO_SHM=", o.shm ? 1 : 0, "\n",
      "KOLO_CACHE_CAPACITY=", o.cache_capacity, "\n",
      "KOLO_HIERARCHICAL_ALLREDUCE=", o.hierarchical_allreduce ? 1 : 0, "\n",
      "join average over the set size=", o.join_average_over_set_size ? 1 : 0,
      "\n", "process sets at start=", o.process_sets.size());
}

// Claims this rank's place in the store (a second worker with the same rank
// fails here, naming both) and checks that this rank's shared settings
// equal rank 0's. Every error names the ranks and the values.
absl::Status ClaimRank(Store& store, const Options& o) {
  const std::string me = ProcessIdentity();
  absl::StatusOr<int64_t> claims = store.Add(absl::StrCat("claim/", o.rank), 1);
  if (!claims.ok()) return claims.status();
  if (*claims == 1) {
    KOLO_RETURN_IF_ERROR(store.Set(absl::StrCat("claimant/", o.rank), me));
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
  absl::StatusOr<std::string> theirs = store.Get("settings/0", o.start_timeout);
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
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", o.rank,
                   " and rank 0 disagree on settings every rank must "
                   "share: ",
                   absl::StrJoin(differences, "; ")));
}

}  // namespace

RuntimeImpl::RuntimeImpl(const Options& options)
    : options_(options),
      logger_(options.log_level, options.rank),
      queue_([this] { Notify(); }),
      sets_(ProcessSets::Context{
          &options_, &logger_, &timeline_,
          [this](const absl::Status& s) { return ExplainCollectiveFailure(s); },
          [this](const absl::Status& s) { Fatal(s); }}),
      log_(
          options_, &sets_, &queue_, &job_,
          [this](const absl::Status& s) { Fatal(s); },
          [this](const absl::Status& s) {
            return ExplainCollectiveFailure(s);
          }),
      loop_(BackgroundLoop::Context{
          &options_, &logger_, &timeline_, &queue_, &sets_, &job_, &log_,
          [this](const absl::Status& s) { Fatal(s); }}) {}

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
  // (Fatal) still exists.
  sets_.DestroyDevicePaths();
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
    auto client = rendezvous::ConnectTcpStore(options_.rendezvous_addr,
                                              options_.rendezvous_port,
                                              options_.secret, connect_timeout);
    if (!client.ok()) {
      return absl::Status(
          client.status().code(),
          absl::StrCat(
              "rank ", options_.rank, ": cannot reach the rendezvous store at ",
              options_.rendezvous_addr, ":", options_.rendezvous_port, ": ",
              client.status().message(),
              options_.store_listening &&
                      !absl::IsPermissionDenied(client.status())
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
  // A process that joins again after its Shutdown (Options::incarnation
  // k > 0) is kept apart the same way, under "kolo/i<k>" and with a key of
  // its own, so that its rank claim does not meet its earlier one.
  std::string prefix = "kolo";
  if (options_.incarnation > 0) {
    absl::StrAppend(&prefix, "/i", options_.incarnation);
  }
  if (options_.generation > 0) {
    absl::StrAppend(&prefix, "/g", options_.generation);
  }
  store_ = NewPrefixStore(prefix, base);
  std::string channel_secret = options_.secret;
  if (options_.incarnation > 0) {
    channel_secret =
        net::HmacSha256(options_.secret)
            .MacString({"kolo incarnation ", absl::StrCat(options_.incarnation),
                        " generation ", absl::StrCat(options_.generation)});
  } else if (options_.generation > 0) {
    channel_secret =
        net::HmacSha256(options_.secret)
            .MacString({"kolo generation ", absl::StrCat(options_.generation)});
  }
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
    auto control = ControlPlane::Create(
        options_.rank, options_.size, store_, channel_secret,
        options_.bind_addr, deadline, std::move(callbacks), liveness);
    if (!control.ok()) return control.status();
    control_ = std::move(*control);
    log_.set_control(control_.get());
  }

  std::unique_ptr<HitExchange> exchange;
  std::unique_ptr<HostMessages> host_messages;
  Wakeup* doorbell = nullptr;
  if (control_ && options_.shm) {
    auto hosts = JobHosts(*store_, options_.size, options_.start_timeout);
    if (!hosts.ok()) return hosts.status();
    const std::string& mine = (*hosts)[options_.rank];
    std::vector<int> host_ranks;  // this host's, ascending
    for (int r = 0; r < options_.size; ++r) {
      if ((*hosts)[r] == mine) host_ranks.push_back(r);
    }
    if (static_cast<int>(host_ranks.size()) < options_.size) {
      // Note [Host relay]: the host's lists go through its leader.
      absl::Status relay = control_->EnableHostRelay(
          *store_, deadline, host_ranks, options_.negotiate_within_hosts);
      if (!relay.ok()) return relay;
      if (control_->host_relay()) {
        if (host_ranks[0] == options_.rank && options_.rank != 0) {
          exchange = std::make_unique<LeaderExchange>(
              host_ranks, control_.get(), &log_,
              LeaderExchange::Batching{
                  options_.cycle_time, options_.cache_capacity,
                  [this](int64_t id) {
                    return !sets_.global().cache->IsCurrent(id);
                  }});
        }
        doorbell = control_->doorbell();
        logger_.Info(absl::StrCat("control plane over TCP; this host's ",
                                  host_ranks.size(),
                                  " ranks send through rank ", host_ranks[0]));
      }
      if (options_.rank == 0) {
        // Which ranks a leader may speak for (every host's leader may relay).
        std::map<std::string, int> leader;
        std::vector<int> leader_of(options_.size);
        for (int r = 0; r < options_.size; ++r) {
          leader_of[r] = leader.emplace((*hosts)[r], r).first->second;
        }
        host_messages = std::make_unique<HostMessages>(std::move(leader_of));
      }
    } else {
      absl::Status shm = control_->EnableSharedMemory(
          *store_, deadline, options_.negotiate_within_hosts,
          options_.fusion_threshold_bytes);
      if (!shm.ok()) return shm;
      if (HitBoard* board = control_->hit_board()) {
        exchange = std::make_unique<BoardExchange>(
            board, control_.get(), &log_,
            BoardExchange::Limits{options_.op_timeout,
                                  options_.stall_check_time,
                                  options_.stall_shutdown_time});
      }
      doorbell = control_->doorbell();
    }
    logger_.Info(absl::StrCat("control plane over ", control_->shared_memory()
                                                         ? "shared memory"
                                                         : "TCP"));
  }
  // Note [The exchange]: the board or a host leader's relay where the
  // control plane set one up, else through the coordinator.
  if (!exchange) {
    exchange = std::make_unique<CoordinatorExchange>(control_.get(), &log_);
  }
  loop_.Wire(control_.get(), std::move(exchange), std::move(host_messages),
             doorbell);
  KOLO_RETURN_IF_ERROR(sets_.Start(store_));
  if (!options_.timeline_path.empty() && options_.rank == 0) {
    KOLO_RETURN_IF_ERROR(
        timeline_.Start(options_.timeline_path, options_.timeline_mark_cycles));
  }

  // Tells kolorun that this rank finished rendezvous.
  KOLO_RETURN_IF_ERROR(store_->Set(absl::StrCat("ready/", options_.rank), "1"));

  accepting_ = true;
  loop_.Open();
  thread_ = std::thread([self = shared_from_this()] { self->loop_.Run(); });
  logger_.Info(absl::StrCat("joined a job of ", options_.size, " ranks"));
  return absl::OkStatus();
}

BlockingResult RuntimeImpl::SubmitAndWait(std::unique_ptr<TensorEntry> owned,
                                          absl::Duration timeout) {
  BlockingResult result;
  result.status = Prepare(owned.get());
  if (!result.status.ok()) return result;
  const std::shared_ptr<internal::WorkState> work = owned->work;
  // Note [Caller turns]: queued without waking the thread, which this
  // caller wakes unless it takes the turn itself.
  result.status = queue_.AddQuietly(std::move(owned));
  if (!result.status.ok()) return result;
  result.submitted = true;
  loop_.TryTurn(*work);
  result.status = work->Wait(timeout);
  return result;
}

absl::StatusOr<Work> RuntimeImpl::Submit(TensorEntry entry) {
  return Submit(std::make_unique<TensorEntry>(std::move(entry)));
}

absl::Status RuntimeImpl::Prepare(TensorEntry* entry) {
  if (!accepting_) {
    absl::Status f = fatal_status();
    if (!f.ok()) return f;
    return absl::FailedPreconditionError(
        absl::StrCat(CollectiveName(entry->request.type()), " \"",
                     entry->request.name(), "\": the runtime was shut down"));
  }
  if (entry->input.device.type == DeviceType::kCuda) {
    // One NCCL communicator per process set and rank: on one GPU.
    auto set = sets_.Member(entry->request.process_set(),
                            CollectiveName(entry->request.type()));
    if (!set.ok()) return set.status();
    int expected = -1;
    const int index = entry->input.device.index;
    if (!(*set)->cuda_device.compare_exchange_strong(expected, index) &&
        expected != index) {
      return absl::InvalidArgumentError(absl::StrCat(
          CollectiveName(entry->request.type()), " \"", entry->request.name(),
          "\": the tensor is on cuda:", index, " but rank ", options_.rank,
          " already runs process set ", entry->request.process_set(),
          " on cuda:", expected, "; a rank uses one GPU per process set"));
    }
  }
  entry->request.set_rank(options_.rank);
  // A recycled entry brings its renewed state (Note [Works recycled]).
  if (!entry->work) entry->work = std::make_shared<internal::WorkState>();
  entry->work->SetWaitPolicy(options_.spin_time, loop_.waiters());
  if (entry->group && entry->group->work) {
    entry->group->work->SetWaitPolicy(options_.spin_time, loop_.waiters());
  }
  // The deadline comes when the request is taken for sending
  // (TensorQueue::TakeNewRequests).
  return absl::OkStatus();
}

absl::StatusOr<Work> RuntimeImpl::Submit(std::unique_ptr<TensorEntry> owned) {
  KOLO_RETURN_IF_ERROR(Prepare(owned.get()));
  Work work = internal::WorkAccess::Make(owned->work);
  KOLO_RETURN_IF_ERROR(queue_.Add(std::move(owned)));
  return work;
}

absl::StatusOr<std::vector<Work>> RuntimeImpl::SubmitAll(
    std::vector<std::unique_ptr<TensorEntry>>* entries) {
  // Recycled entries bring their renewed states (Note [Works recycled]);
  // the others get one each from Prepare, which the next steps renew (one
  // block for the batch could be renewed only as a whole).
  std::vector<Work> works;
  works.reserve(entries->size());
  for (auto& entry : *entries) {
    KOLO_RETURN_IF_ERROR(Prepare(entry.get()));
    works.push_back(internal::WorkAccess::Make(entry->work));
  }
  KOLO_RETURN_IF_ERROR(queue_.AddAll(entries));
  return works;
}

absl::StatusOr<int> RuntimeImpl::Join() {
  TensorEntry entry;
  entry.request.set_type(wire::JOIN);
  entry.request.set_name("__kolo_join__");
  return SubmitForValue(std::move(entry));
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
  const LogExecutor::Counters& executed = log_.counters();
  s.tensors_executed = executed.tensors_executed;
  s.collectives_executed = executed.collectives_executed;
  s.negotiation_messages_sent = loop_.messages_sent();
  s.negotiation_messages_received = executed.response_lists_received;
  s.host_buffer_bytes = sets_.buffer_bytes();
  return s;
}

std::map<std::string, int64_t> RuntimeImpl::Counters() const {
  // docs/tuning.md lists them; the names follow the parts that count.
  const LogExecutor::Counters& executed = log_.counters();
  std::map<std::string, int64_t> c = {
      {"negotiation.response_lists_received", executed.response_lists_received},
      {"board.records_executed", executed.board_records_executed},
      {"phase.prepare_ns", executed.prepare_ns},
      {"phase.collective_ns", executed.collective_ns},
      {"phase.complete_ns", executed.complete_ns},
      {"phase.recycle_ns", executed.recycle_ns},
  };
  loop_.AddCounters(&c);
  sets_.AddCounters(&c);
  return c;
}

void RuntimeImpl::Fatal(const absl::Status& status, bool quiet) {
  if (!job_.Fail(status)) return;
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
  sets_.Close(status);
  Notify();
}

absl::Status RuntimeImpl::ExplainCollectiveFailure(const absl::Status& error) {
  absl::Status fatal = job_.WaitForFailure(absl::Now() + kExplainWait);
  return fatal.ok() ? error : fatal;
}

bool RuntimeImpl::StopLoop(absl::Time deadline) {
  const bool finished = job_.WaitLoopEnded(deadline);
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
    result = absl::AbortedError(absl::StrCat("Shutdown timed out after ",
                                             FormatSeconds(timeout),
                                             " with work pending"));
    queue_.Close(result);
  }
  loop_.RequestShutdown();
  // The loop ends once every rank has asked to shut down.
  if (!StopLoop(deadline)) {
    std::string waiting_for = "the other ranks";
    if (std::vector<int> waiting = job_.ShutdownWaiting(); !waiting.empty()) {
      waiting_for =
          absl::StrCat(RankList(waiting), " (which never called Shutdown)");
    }
    Fatal(absl::DeadlineExceededError(
        absl::StrCat("Shutdown timed out after ", FormatSeconds(timeout),
                     " waiting for ", waiting_for, " to shut down")));
    StopLoop(absl::Now() + absl::Milliseconds(100));
  } else if (options_.host_store && options_.size > 1 && !options_.store) {
    // Note [Rank 0's store at shutdown]: every rank has asked to shut
    // down, so nobody needs the store any more. Rank 0 closes the store it
    // hosts now, and the others return only once they have seen it closed:
    // a rank that joins again at once (init() after shutdown()) can then
    // reach only rank 0's next store, never the one that is going away.
    if (store_server_) {
      store_server_->Stop();
    } else {
      // No one sets this key: the Get ends when the store closes.
      absl::Status closed =
          store_->Get("store.closed", deadline - absl::Now()).status();
      if (absl::IsDeadlineExceeded(closed)) {
        logger_.Warning(absl::StrCat(
            "Shutdown: rank 0's rendezvous store was still open after ",
            FormatSeconds(timeout)));
      }
    }
  }
  timeline_.Stop();
  if (control_) control_->Close();
  absl::Status fatal = fatal_status();
  if (absl::IsUnavailable(fatal) && options_.rank != 0) {
    // The coordinator's own Shutdown timed out a moment before ours and it
    // left: what it waited for is the reason, not its departure.
    if (std::vector<int> waiting = job_.ShutdownWaiting(); !waiting.empty()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "Shutdown failed: the coordinator (rank 0) stopped waiting for ",
          RankList(waiting),
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

absl::Status RuntimeImpl::RemoveProcessSet(int process_set) {
  if (process_set == kGlobalProcessSet) {
    return absl::InvalidArgumentError(
        "remove_process_set: the global process set (0) cannot be removed");
  }
  if (!sets_.Find(process_set)) {
    return absl::InvalidArgumentError(
        absl::StrCat("remove_process_set: unknown process set ", process_set));
  }
  TensorEntry entry;
  entry.request.set_type(wire::REMOVE_PROCESS_SET);
  entry.request.set_name(
      absl::StrCat("__kolo_remove_process_set_", process_set_calls_++));
  entry.request.set_target_process_set(process_set);
  auto work = Submit(std::move(entry));
  if (!work.ok()) return work.status();
  return work->Wait();
}

absl::StatusOr<int> RuntimeImpl::SubmitForValue(TensorEntry entry) {
  auto work = Submit(std::move(entry));
  if (!work.ok()) return work.status();
  KOLO_RETURN_IF_ERROR(work->Wait());
  return static_cast<int>(internal::WorkAccess::State(*work)->value());
}

absl::StatusOr<int> RuntimeImpl::AddProcessSet(const std::vector<int>& ranks) {
  const std::string name =
      absl::StrCat("__kolo_process_set_", process_set_calls_++);
  if (ranks.empty()) {
    return absl::InvalidArgumentError("a process set needs at least one rank");
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= options_.size ||
        (i > 0 && ranks[i] <= ranks[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("process set ranks [", absl::StrJoin(ranks, ", "),
                       "] must be distinct ranks of the job (0 to ",
                       options_.size - 1, "), sorted"));
    }
  }
  TensorEntry entry;
  entry.request.set_type(wire::ADD_PROCESS_SET);
  entry.request.set_name(name);
  for (int r : ranks) entry.request.add_member_ranks(r);
  return SubmitForValue(std::move(entry));
}

// Note [Sets created by their members] in runtime/negotiation/coordinator.cc.
absl::StatusOr<int> RuntimeImpl::AddMemberProcessSet(
    const std::vector<int>& ranks, const std::string& key) {
  if (key.empty()) {
    return absl::InvalidArgumentError(
        "a process set created by its members needs a key that names it");
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= options_.size ||
        (i > 0 && ranks[i] <= ranks[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "process set \"", key, "\": ranks [", absl::StrJoin(ranks, ", "),
          "] must be distinct ranks of the job (0 to ", options_.size - 1,
          "), sorted"));
    }
  }
  if (!std::binary_search(ranks.begin(), ranks.end(), options_.rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("process set \"", key, "\": rank ", options_.rank,
                     " is not one of its ranks [", absl::StrJoin(ranks, ", "),
                     "]; only members create it"));
  }
  TensorEntry entry;
  entry.request.set_type(wire::ADD_MEMBER_PROCESS_SET);
  entry.request.set_name(absl::StrCat("__kolo_member_set_", key));
  for (int r : ranks) entry.request.add_member_ranks(r);
  return SubmitForValue(std::move(entry));
}

}  // namespace kolo
