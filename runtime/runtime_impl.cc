#include "runtime/runtime_impl.h"

#include "absl/strings/str_cat.h"
#include "runtime/fusion.h"
#include "runtime/rendezvous/tcp_store.h"

namespace kolo {
namespace {

// A rank that cannot reach the coordinator gives up this long after the
// coordinator itself would have reported the op timeout.
constexpr absl::Duration kLocalTimeoutSlack = absl::Seconds(2);
// After a collective fails, how long to wait for the control plane to name
// the lost rank.
constexpr absl::Duration kExplainWait = absl::Seconds(1);

}  // namespace

RuntimeImpl::RuntimeImpl(const Options& options)
    : options_(options),
      logger_(options.log_level, options.rank),
      coordinator_(options.size),
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
  if (control_) control_->Close();
  if (store_server_) store_server_->Stop();
}

absl::Status RuntimeImpl::Start() {
  const absl::Time deadline = absl::Now() + options_.start_timeout;
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
    auto client = rendezvous::ConnectTcpStore(
        options_.rendezvous_addr, options_.rendezvous_port, options_.secret,
        options_.start_timeout);
    if (!client.ok()) {
      return absl::Status(
          client.status().code(),
          absl::StrCat("rank ", options_.rank,
                       ": cannot reach the rendezvous store at ",
                       options_.rendezvous_addr, ":", options_.rendezvous_port,
                       ": ", client.status().message()));
    }
    base = *client;
  }
  if (!base) base = NewInMemoryStore();  // A job of one.
  store_ = NewPrefixStore("kolo", base);

  if (options_.size > 1) {
    if (options_.secret.empty()) {
      return absl::FailedPreconditionError(
          "no job secret: the control channel needs Options::secret");
    }
    ControlCallbacks callbacks;
    callbacks.notify = [this] { Notify(); };
    callbacks.on_fatal = [this](const absl::Status& s) { Fatal(s); };
    auto control = ControlPlane::Create(options_.rank, options_.size, store_,
                                        options_.secret, options_.bind_addr,
                                        deadline, std::move(callbacks));
    if (!control.ok()) return control.status();
    control_ = std::move(*control);
  }

  BackendContext context;
  context.rank = options_.rank;
  context.size = options_.size;
  context.store = NewPrefixStore("gloo/global", store_);
  context.bind_addr = options_.bind_addr;
  context.start_timeout = std::max(deadline - absl::Now(), absl::Seconds(1));
  context.op_timeout = options_.op_timeout;
  auto backend = BackendRegistry::Get().Create(DeviceType::kCpu, context);
  if (!backend.ok()) return backend.status();
  backend_ = std::move(*backend);
  executor_ = std::make_unique<Executor>(backend_.get(), options_.rank,
                                         options_.size);

  // Tells kolorun that this rank finished rendezvous.
  absl::Status s = store_->Set(absl::StrCat("ready/", options_.rank), "1");
  if (!s.ok()) return s;

  accepting_ = true;
  thread_ = std::thread([self = shared_from_this()] { self->BackgroundLoop(); });
  logger_.Info(absl::StrCat("joined a job of ", options_.size, " ranks"));
  return absl::OkStatus();
}

absl::StatusOr<Work> RuntimeImpl::Submit(TensorEntry entry) {
  if (!accepting_) {
    absl::Status f = fatal_status();
    if (!f.ok()) return f;
    return absl::FailedPreconditionError(absl::StrCat(
        CollectiveName(entry.request.type()), " \"", entry.request.name(),
        "\": the runtime was shut down"));
  }
  entry.request.set_rank(options_.rank);
  entry.work = std::make_shared<internal::WorkState>();
  entry.deadline = absl::Now() + options_.op_timeout + kLocalTimeoutSlack;
  Work work(entry.work);
  absl::Status s = queue_.Add(std::move(entry));
  if (!s.ok()) return s;
  return work;
}

void RuntimeImpl::Notify() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_pending_ = true;
  }
  wake_cv_.notify_one();
}

void RuntimeImpl::Fatal(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!fatal_.ok()) return;
    fatal_ = status;
  }
  state_cv_.notify_all();
  accepting_ = false;
  logger_.Error(std::string(status.message()));
  queue_.Close(status);
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
// window, an op timeout). There is no fixed tick: an idle job costs nothing
// and a lone request is sent at once. Each pass:
//  1. sends this rank's new requests (and its shutdown request) to the
//     coordinator;
//  2. rank 0: feeds received request lists to the Coordinator; other ranks:
//     execute received response lists in order;
//  3. rank 0: when names are ready, waits at most KOLO_CYCLE_TIME from the
//     oldest ready name for more names to complete (only while some are
//     partially submitted), then fuses, broadcasts and executes the list.
void RuntimeImpl::BackgroundLoop() {
  const bool coordinator = options_.rank == 0;
  absl::Time next_wakeup = absl::InfiniteFuture();
  bool done = false;
  while (!done) {
    {
      std::unique_lock<std::mutex> lock(wake_mu_);
      if (next_wakeup == absl::InfiniteFuture()) {
        wake_cv_.wait(lock, [&] { return wake_pending_; });
      } else {
        wake_cv_.wait_for(lock,
                          absl::ToChronoNanoseconds(next_wakeup - absl::Now()),
                          [&] { return wake_pending_; });
      }
      wake_pending_ = false;
    }
    if (!fatal_status().ok()) break;
    const absl::Time now = absl::Now();
    next_wakeup = absl::InfiniteFuture();

    std::vector<wire::Request> fresh = queue_.TakeNewRequests();
    const bool send_shutdown = shutdown_requested_ && !shutdown_sent_;
    if (!fresh.empty() || send_shutdown) {
      wire::ControlMessage message;
      wire::RequestList* list = message.mutable_request_list();
      for (auto& r : fresh) *list->add_requests() = std::move(r);
      list->set_shutdown(send_shutdown);
      shutdown_sent_ |= send_shutdown;
      if (coordinator) {
        coordinator_.AddRequests(0, *list, now);
      } else {
        absl::Status s = control_->SendToCoordinator(message);
        if (!s.ok()) {
          Fatal(s);
          break;
        }
      }
    }

    if (control_) {
      for (ControlEvent& event : control_->TakeEvents()) {
        if (coordinator && event.message.has_request_list()) {
          coordinator_.AddRequests(event.from_rank,
                                   event.message.request_list(), now);
        } else if (!coordinator && event.message.has_response_list()) {
          const wire::ResponseList& list = event.message.response_list();
          ExecuteList(list);
          if (list.shutdown()) done = true;
        }
      }
    }
    if (coordinator && !done) CoordinatorStep(now, &next_wakeup, &done);
    if (!fatal_status().ok()) break;
    next_wakeup = std::min(
        next_wakeup, queue_.ExpireLocal(now, options_.op_timeout));
  }
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    loop_done_ = true;
  }
  state_cv_.notify_all();
}

void RuntimeImpl::CoordinatorStep(absl::Time now, absl::Time* next_wakeup,
                                  bool* done) {
  coordinator_.ExpireOlderThan(options_.op_timeout, now);
  bool emit = false;
  if (coordinator_.HasReady()) {
    const absl::Time batch_until =
        coordinator_.OldestReadyTime() + options_.cycle_time;
    if (!coordinator_.HasPartial() || now >= batch_until) {
      emit = true;
    } else {
      *next_wakeup = std::min(*next_wakeup, batch_until);
    }
  }
  const bool all_shutdown = coordinator_.AllShutdown();
  if (emit || all_shutdown) {
    wire::ControlMessage message;
    wire::ResponseList* list = message.mutable_response_list();
    for (auto& r : PlanFusion(coordinator_.TakeReady(),
                              options_.fusion_threshold_bytes, options_.size)) {
      *list->add_responses() = std::move(r);
    }
    // Every rank asked to shut down, so none can add requests any more.
    list->set_shutdown(all_shutdown);
    if (control_) {
      if (all_shutdown) control_->MarkShuttingDown();
      absl::Status s = control_->Broadcast(message);
      if (!s.ok()) {
        Fatal(s);
        return;
      }
    }
    ExecuteList(*list);
    if (all_shutdown) *done = true;
  }
  *next_wakeup =
      std::min(*next_wakeup, coordinator_.NextExpiry(options_.op_timeout));
}

void RuntimeImpl::ExecuteList(const wire::ResponseList& list) {
  if (list.shutdown() && control_) control_->MarkShuttingDown();
  for (const wire::Response& response : list.responses()) {
    std::vector<std::unique_ptr<TensorEntry>> entries;
    entries.reserve(response.names_size());
    bool missing = false;
    for (const std::string& name : response.names()) {
      auto entry = queue_.Take(name);
      if (!entry) {
        missing = true;
        break;
      }
      entries.push_back(std::move(entry));
    }
    if (missing) {
      if (response.type() == wire::RESPONSE_ERROR) continue;  // Not ours.
      // Every rank submitted every name of a data response: this one did
      // not, so the ranks are out of step.
      Fatal(absl::InternalError(absl::StrCat(
          "rank ", options_.rank, " received a response for \"",
          response.names(0), "\" that it never submitted")));
      return;
    }
    absl::Status s = executor_->Execute(response, entries);
    if (!s.ok()) {
      Fatal(ExplainCollectiveFailure(s));
      return;
    }
  }
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
    return absl::FailedPreconditionError("Shutdown() or Abort() was already called");
  }
  const absl::Time deadline = absl::Now() + timeout;
  accepting_ = false;
  absl::Status result;
  if (!queue_.WaitDrained(deadline)) {
    result = absl::AbortedError(
        absl::StrCat("Shutdown timed out after ", absl::FormatDuration(timeout),
                     " with work pending"));
    queue_.Close(result);
  }
  shutdown_requested_ = true;
  Notify();
  // The loop ends once every rank has asked to shut down.
  if (!StopLoop(deadline)) {
    Fatal(absl::DeadlineExceededError(absl::StrCat(
        "Shutdown timed out after ", absl::FormatDuration(timeout),
        " waiting for the other ranks to shut down")));
    StopLoop(absl::Now() + absl::Milliseconds(100));
  }
  if (control_) control_->Close();
  absl::Status fatal = fatal_status();
  if (!fatal.ok()) return fatal;
  return result;
}

void RuntimeImpl::Abort() {
  if (stopped_.exchange(true)) return;
  Fatal(absl::AbortedError("Abort() was called"));
  if (control_) control_->Close();
  StopLoop(absl::Now() + absl::Milliseconds(100));
}

}  // namespace kolo
