// TcpStoreServer: one thread, one epoll set, every connection non-blocking
// (Note [One thread for every store connection] in tcp_store.h).
#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/net/handshake_queue.h"
#include "runtime/net/secure_channel.h"
#include "runtime/net/socket.h"
#include "runtime/os/errno_text.h"
#include "runtime/os/poll_timeout.h"
#include "runtime/os/unique_fd.h"
#include "runtime/rendezvous/in_memory_store.h"
#include "runtime/rendezvous/store_wire.h"
#include "runtime/rendezvous/tcp_store.h"
#include "runtime/sync/mutex.h"
#include "runtime/wire.pb.h"

namespace kolo {
namespace rendezvous {
namespace {

// Out of descriptors on accept: how long the listener rests before the
// next try (the queued connection waits in the kernel meanwhile).
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);
// Accepts per turn of the loop, so that a flood of new connections cannot
// keep the thread from the answers of those already accepted.
constexpr int kAcceptsPerTurn = 16;
// Bytes read from one connection per turn of the loop.
constexpr size_t kReadPerTurn = 256u << 10;

// epoll data of the fixed descriptors; connections count up from kFirstId.
constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr uint64_t kHandshakesId = 2;
constexpr uint64_t kFirstId = 16;

using os::ErrnoText;

void SetStatus(const absl::Status& status, wire::StoreResponse* response) {
  response->set_code(static_cast<int>(status.code()));
  response->set_message(std::string(status.message()));
}

// Wakes the server's thread from other threads and runs the user's
// on_change; shared with local()'s store, which may outlive the server.
class ChangeNotifier {
 public:
  ChangeNotifier(int event_fd, std::function<void()> on_change)
      : event_fd_(event_fd), on_change_(std::move(on_change)) {}

  void Changed() {
    MutexLock lock(&mu_);
    if (stopped_) return;
    Wake();
    if (on_change_) on_change_();
  }
  // After Stop() returns, Changed() does nothing.
  void Stop() {
    MutexLock lock(&mu_);
    stopped_ = true;
  }
  void Wake() {
    const uint64_t one = 1;
    // Fails only when the counter is saturated: it is awake anyway.
    (void)!::write(event_fd_, &one, sizeof(one));
  }

 private:
  const int event_fd_;  // borrowed: the server closes it after Stop()
  const std::function<void()> on_change_;
  Mutex mu_;
  bool stopped_ KOLO_GUARDED_BY(mu_) = false;
};

class TcpStoreServerImpl final : public TcpStoreServer {
 public:
  static absl::StatusOr<std::unique_ptr<TcpStoreServerImpl>> Create(
      net::Listener listener, const std::string& secret, ServerOptions options);
  ~TcpStoreServerImpl() override;

  int port() const override { return port_; }
  std::shared_ptr<Store> local() override { return state_; }
  int64_t auth_failures() const override {
    return handshakes_->auth_failures();
  }
  void Stop() override;
  ServerStats stats() const override {
    ServerStats stats;
    stats.connections = stat_connections_.load();
    stats.pending_handshakes = stat_pending_.load();
    stats.parked_requests = stat_parked_.load();
    return stats;
  }

 private:
  struct Connection {
    uint64_t id = 0;
    std::unique_ptr<net::SecureChannel> channel;
    std::string in;   // received, not yet taken as frames
    std::string out;  // the response being sent
    size_t out_sent = 0;
    bool eof = false;  // the peer will send no more
    // A GET or WAIT waiting for its keys (parked_ holds its deadline).
    bool parked = false;
    wire::StoreRequest parked_request;
    absl::Duration parked_timeout;
    absl::Time parked_deadline;
    uint32_t registered = 0;  // epoll events asked for now
  };

  TcpStoreServerImpl(net::Listener listener, ServerOptions options,
                     std::unique_ptr<net::HandshakeQueue> handshakes,
                     os::UniqueFd epoll_fd, os::UniqueFd event_fd);
  absl::Status Register(int fd, uint64_t id, uint32_t events);

  void Loop();
  // One turn of the loop: wait, handle what is ready. False once stopped.
  bool Turn();
  void AcceptSome(absl::Time now);
  void SetAccepting(bool accepting);
  void AddConnection(std::unique_ptr<net::SecureChannel> channel);
  void HandleEvents(Connection& c, uint32_t events);
  // Takes and handles the connection's frames until one parks, a response
  // is still on its way out, or no complete frame is left.
  void Pump(Connection& c);
  void Handle(Connection& c, const wire::StoreRequest& request);
  // Answers a parked request if its keys are there (or `timed_out`).
  bool TryAnswerParked(Connection& c, bool timed_out);
  void Respond(Connection& c, const wire::StoreResponse& response);
  void Flush(Connection& c);
  void UpdateInterest(Connection& c);
  void Unpark(Connection& c);
  void Close(uint64_t id);
  // Runs `f` on connection `id` if it is still open; a connection that runs
  // out of memory is closed, the others carry on.
  template <typename F>
  void ForConnection(uint64_t id, F&& f);
  void WakeParked();
  void ExpireParked(absl::Time now);
  void Shutdown();

  net::Listener listener_;
  const int port_;
  const ServerOptions options_;
  const os::UniqueFd epoll_fd_;
  const os::UniqueFd event_fd_;
  const std::shared_ptr<ChangeNotifier> notifier_;
  const std::shared_ptr<InMemoryStore> state_;
  const std::unique_ptr<net::HandshakeQueue> handshakes_;
  std::thread thread_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<int64_t> stat_connections_{0};
  std::atomic<int64_t> stat_pending_{0};
  std::atomic<int64_t> stat_parked_{0};

  Mutex stop_mu_;  // Serializes Stop().
  bool stopped_ KOLO_GUARDED_BY(stop_mu_) = false;

  // Owned by the server's thread.
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  std::set<std::pair<absl::Time, uint64_t>> parked_;  // deadline, id
  uint64_t next_id_ = kFirstId;
  bool accepting_ = true;
  absl::Time accept_resume_ = absl::InfinitePast();
  bool changed_ = false;  // a SET/ADD since parked requests were checked
};

absl::StatusOr<std::unique_ptr<TcpStoreServerImpl>> TcpStoreServerImpl::Create(
    net::Listener listener, const std::string& secret, ServerOptions options) {
  net::HandshakeQueue::Limits limits;
  limits.max_pending = options.max_pending_handshakes;
  limits.timeout = kHandshakeTimeout;
  absl::StatusOr<std::unique_ptr<net::HandshakeQueue>> handshakes =
      net::HandshakeQueue::Create(secret, kMaxStoreFrameBytes, limits);
  if (!handshakes.ok()) return handshakes.status();
  os::UniqueFd epoll_fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd.valid()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("epoll_create1: ", ErrnoText(errno)));
  }
  os::UniqueFd event_fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_fd.valid()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("eventfd: ", ErrnoText(errno)));
  }
  std::unique_ptr<TcpStoreServerImpl> server(new TcpStoreServerImpl(
      std::move(listener), std::move(options), std::move(*handshakes),
      std::move(epoll_fd), std::move(event_fd)));
  absl::Status st =
      server->Register(server->listener_.fd(), kListenerId, EPOLLIN);
  if (st.ok()) {
    st = server->Register(server->event_fd_.get(), kWakeId, EPOLLIN);
  }
  if (st.ok()) {
    st = server->Register(server->handshakes_->fd(), kHandshakesId, EPOLLIN);
  }
  if (!st.ok()) return st;
  try {
    server->thread_ = std::thread(&TcpStoreServerImpl::Loop, server.get());
  } catch (const std::system_error& e) {
    // Out of threads (EAGAIN: a pids limit, RLIMIT_NPROC) or memory.
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the server's thread: ", e.what()));
  }
  return server;
}

TcpStoreServerImpl::TcpStoreServerImpl(
    net::Listener listener, ServerOptions options,
    std::unique_ptr<net::HandshakeQueue> handshakes, os::UniqueFd epoll_fd,
    os::UniqueFd event_fd)
    : listener_(std::move(listener)),
      port_(listener_.port()),
      options_(std::move(options)),
      epoll_fd_(std::move(epoll_fd)),
      event_fd_(std::move(event_fd)),
      notifier_(std::make_shared<ChangeNotifier>(event_fd_.get(),
                                                 options_.on_change)),
      state_(std::make_shared<InMemoryStore>(
          [notifier = notifier_] { notifier->Changed(); })),
      handshakes_(std::move(handshakes)) {}

// The descriptors close after Stop(): the thread that waits on them has
// ended, and the notifier (which local()'s store may keep) writes no more.
TcpStoreServerImpl::~TcpStoreServerImpl() { Stop(); }

absl::Status TcpStoreServerImpl::Register(int fd, uint64_t id,
                                          uint32_t events) {
  struct epoll_event event = {};
  event.events = events;
  event.data.u64 = id;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("epoll_ctl: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

void TcpStoreServerImpl::Stop() {
  MutexLock stop_lock(&stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  notifier_->Stop();  // No on_change from here on.
  stop_requested_.store(true);
  notifier_->Wake();
  if (thread_.joinable()) thread_.join();
  // Parked local() callers fail with Unavailable instead of waiting out
  // their timeouts.
  state_->Shutdown();
}

void TcpStoreServerImpl::Loop() {
  for (;;) {
    try {
      if (!Turn()) return;
    } catch (const std::bad_alloc&) {
      // Outside any one connection (the list of parked requests, say):
      // nothing was half done that the next turn cannot redo.
    }
  }
}

bool TcpStoreServerImpl::Turn() {
  struct epoll_event events[256];
  absl::Time now = absl::Now();
  SetAccepting(accept_resume_ <= now && handshakes_->HasRoom(now));
  absl::Time next = handshakes_->NextDeadline();
  if (!parked_.empty()) next = std::min(next, parked_.begin()->first);
  if (accept_resume_ > now) next = std::min(next, accept_resume_);
  const int n =
      ::epoll_wait(epoll_fd_.get(), events, 256, os::PollTimeoutMs(next, now));
  if (n < 0 && errno != EINTR) {
    // Only a bug (EBADF, EINVAL) gets here: serve no more, but let Stop()
    // find a thread that ended cleanly.
    std::fprintf(stderr, "kolo: rendezvous store: epoll_wait: %s\n",
                 ErrnoText(errno).c_str());
    Shutdown();
    return false;
  }
  now = absl::Now();
  bool handshakes_ready = handshakes_->NextDeadline() <= now;
  for (int i = 0; i < n; ++i) {
    const uint64_t id = events[i].data.u64;
    if (id == kWakeId) {
      uint64_t count;
      (void)!::read(event_fd_.get(), &count, sizeof(count));
      // A change through local(), or Stop(); parked requests are checked
      // below either way.
      changed_ = true;
    } else if (id == kListenerId) {
      AcceptSome(now);
    } else if (id == kHandshakesId) {
      handshakes_ready = true;
    } else {
      const uint32_t ready = events[i].events;
      ForConnection(id, [&](Connection& c) { HandleEvents(c, ready); });
    }
  }
  if (stop_requested_.load()) {
    Shutdown();
    return false;
  }
  if (handshakes_ready) {
    std::vector<std::unique_ptr<net::SecureChannel>> done;
    try {
      done = handshakes_->Process(now);
    } catch (const std::bad_alloc&) {
      // The queue closed what it could not hold; try again next turn.
    }
    for (auto& channel : done) AddConnection(std::move(channel));
  }
  // A request answered here may let its connection's next request change
  // the store again: loop until nothing changes.
  while (changed_) {
    changed_ = false;
    WakeParked();
  }
  ExpireParked(absl::Now());
  stat_connections_.store(static_cast<int64_t>(connections_.size()));
  stat_pending_.store(static_cast<int64_t>(handshakes_->pending()));
  stat_parked_.store(static_cast<int64_t>(parked_.size()));
  return true;
}

void TcpStoreServerImpl::SetAccepting(bool accepting) {
  if (accepting == accepting_) return;
  struct epoll_event event = {};
  event.events = accepting ? EPOLLIN : 0;
  event.data.u64 = kListenerId;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, listener_.fd(), &event) ==
      0) {
    accepting_ = accepting;
  }
}

void TcpStoreServerImpl::AcceptSome(absl::Time now) {
  for (int i = 0; i < kAcceptsPerTurn && handshakes_->HasRoom(now); ++i) {
    absl::StatusOr<net::Socket> socket = listener_.TryAccept();
    if (!socket.ok()) {
      // Out of descriptors (or another accept error): rest, then try again.
      accept_resume_ = now + kAcceptPause;
      SetAccepting(false);
      return;
    }
    if (!socket->valid()) return;  // Nothing more queued.
    handshakes_->Add(std::move(*socket), now);
  }
}

void TcpStoreServerImpl::AddConnection(
    std::unique_ptr<net::SecureChannel> channel) {
  try {
    auto c = std::make_unique<Connection>();
    c->id = next_id_++;
    c->channel = std::move(channel);
    c->registered = EPOLLIN | EPOLLRDHUP;
    if (!Register(c->channel->fd(), c->id, c->registered).ok()) return;
    connections_.emplace(c->id, std::move(c));
  } catch (const std::bad_alloc&) {
    // Not served: the channel closes with this scope.
  }
}

void TcpStoreServerImpl::HandleEvents(Connection& c, uint32_t events) {
  const uint64_t id = c.id;
  if (events & EPOLLOUT) {
    Flush(c);
    if (connections_.count(id) == 0) return;
  }
  const bool may_read = !c.parked && c.out.empty();
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && may_read &&
      !c.eof) {
    char buf[64 << 10];
    size_t total = 0;
    while (total < kReadPerTurn) {
      const ssize_t got = ::recv(c.channel->fd(), buf, sizeof(buf), 0);
      if (got > 0) {
        c.in.append(buf, static_cast<size_t>(got));
        total += static_cast<size_t>(got);
        continue;
      }
      if (got == 0) {
        c.eof = true;
        break;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      Close(id);  // Reset or broken.
      return;
    }
  } else if ((events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && !may_read) {
    // Gone while a request was parked or its response unsent: nobody is
    // left to answer.
    Close(id);
    return;
  }
  Pump(c);
}

void TcpStoreServerImpl::Pump(Connection& c) {
  const uint64_t id = c.id;
  size_t taken = 0;
  while (!c.parked && c.out.empty()) {
    absl::StatusOr<net::SecureChannel::Opened> opened =
        c.channel->Open(absl::string_view(c.in).substr(taken));
    if (!opened.ok()) {
      Close(id);  // Torn, forged or replayed: the stream is unusable.
      return;
    }
    if (opened->consumed == 0) break;
    taken += opened->consumed;
    wire::StoreRequest request;
    if (!request.ParseFromString(opened->payload)) {
      wire::StoreResponse response;
      SetStatus(absl::InvalidArgumentError("malformed StoreRequest"),
                &response);
      Respond(c, response);
    } else {
      Handle(c, request);
    }
    if (connections_.count(id) == 0) return;  // Closed while responding.
  }
  if (taken > 0) c.in.erase(0, taken);
  if (c.eof) {
    // The client closed its end: what it sent before has been handled, and
    // nobody is left to read what it asked to wait for. (Closing here also
    // keeps a half-closed socket, always readable, out of the epoll set.)
    Close(id);
    return;
  }
  UpdateInterest(c);
}

void TcpStoreServerImpl::Handle(Connection& c,
                                const wire::StoreRequest& request) {
  wire::StoreResponse response;
  switch (request.op()) {
    case wire::STORE_SET:
      SetStatus(state_->Set(request.key(), request.value()), &response);
      changed_ = true;
      break;
    case wire::STORE_ADD: {
      absl::StatusOr<int64_t> value =
          state_->Add(request.key(), request.delta());
      SetStatus(value.status(), &response);
      if (value.ok()) {
        response.set_int_value(*value);
        changed_ = true;
      }
      break;
    }
    case wire::STORE_CHECK: {
      absl::StatusOr<bool> exists = state_->Check(request.key());
      SetStatus(exists.status(), &response);
      if (exists.ok()) response.set_exists(*exists);
      break;
    }
    case wire::STORE_GET:
    case wire::STORE_WAIT:
      c.parked = true;
      c.parked_request = request;
      c.parked_timeout = FromWireTimeout(request.timeout_ms());
      c.parked_deadline = c.parked_timeout == absl::InfiniteDuration()
                              ? absl::InfiniteFuture()
                              : absl::Now() + c.parked_timeout;
      // A zero timeout looks once, as InMemoryStore does.
      if (!TryAnswerParked(
              c, /*timed_out=*/c.parked_timeout <= absl::ZeroDuration())) {
        parked_.emplace(c.parked_deadline, c.id);
        stat_parked_.store(static_cast<int64_t>(parked_.size()));
      }
      return;
    default:
      SetStatus(absl::InvalidArgumentError(
                    absl::StrCat("unknown store operation ", request.op())),
                &response);
  }
  Respond(c, response);
}

bool TcpStoreServerImpl::TryAnswerParked(Connection& c, bool timed_out) {
  const wire::StoreRequest& request = c.parked_request;
  wire::StoreResponse response;
  if (request.op() == wire::STORE_GET) {
    std::optional<std::string> value = state_->TryGet(request.key());
    if (value.has_value()) {
      SetStatus(absl::OkStatus(), &response);
      response.set_value(std::move(*value));
    } else if (timed_out) {
      SetStatus(StoreGetTimedOut(request.key(), c.parked_timeout), &response);
    } else {
      return false;
    }
  } else {
    std::vector<std::string> keys(request.keys().begin(), request.keys().end());
    std::vector<std::string> missing = state_->MissingKeys(keys);
    if (missing.empty()) {
      SetStatus(absl::OkStatus(), &response);
    } else if (timed_out) {
      SetStatus(StoreWaitTimedOut(missing, c.parked_timeout), &response);
    } else {
      return false;
    }
  }
  Unpark(c);
  Respond(c, response);
  return true;
}

void TcpStoreServerImpl::Unpark(Connection& c) {
  if (!c.parked) return;
  parked_.erase({c.parked_deadline, c.id});
  // Counted before the answer goes out: a client that has its answer sees
  // its request no longer parked in stats().
  stat_parked_.store(static_cast<int64_t>(parked_.size()));
  c.parked = false;
  c.parked_request.Clear();
}

void TcpStoreServerImpl::Respond(Connection& c,
                                 const wire::StoreResponse& response) {
  std::string bytes;
  response.SerializeToString(&bytes);
  absl::StatusOr<std::string> frame = c.channel->Seal(bytes);
  if (!frame.ok() && absl::IsInvalidArgument(frame.status())) {
    // A value set just under the cap does not fit a response with it.
    wire::StoreResponse too_big;
    SetStatus(absl::ResourceExhaustedError(absl::StrCat(
                  "the response of ", bytes.size(),
                  " bytes exceeds the rendezvous store's frame limit (",
                  kMaxStoreFrameBytes, " bytes)")),
              &too_big);
    too_big.SerializeToString(&bytes);
    frame = c.channel->Seal(bytes);
  }
  if (!frame.ok()) {
    Close(c.id);
    return;
  }
  c.out = std::move(*frame);
  c.out_sent = 0;
  Flush(c);
}

void TcpStoreServerImpl::Flush(Connection& c) {
  while (c.out_sent < c.out.size()) {
    const ssize_t n =
        ::send(c.channel->fd(), c.out.data() + c.out_sent,
               c.out.size() - c.out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      UpdateInterest(c);  // Wait for EPOLLOUT.
      return;
    }
    Close(c.id);  // The peer is gone.
    return;
  }
  const bool was_pending = !c.out.empty();
  c.out.clear();
  c.out.shrink_to_fit();  // A large GET's buffer is not kept.
  c.out_sent = 0;
  // Once the response is out, the connection's next frames may be taken
  // (from the event handler or the waker that called us: they Pump).
  if (was_pending) UpdateInterest(c);
}

void TcpStoreServerImpl::UpdateInterest(Connection& c) {
  uint32_t want = EPOLLRDHUP;
  if (!c.out.empty()) want |= EPOLLOUT;
  if (!c.parked && c.out.empty() && !c.eof) want |= EPOLLIN;
  if (want == c.registered) return;
  struct epoll_event event = {};
  event.events = want;
  event.data.u64 = c.id;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.channel->fd(), &event) ==
      0) {
    c.registered = want;
  }
}

void TcpStoreServerImpl::Close(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& c = *it->second;
  Unpark(c);
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, c.channel->fd(), nullptr);
  connections_.erase(it);  // The channel closes its socket.
}

template <typename F>
void TcpStoreServerImpl::ForConnection(uint64_t id, F&& f) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  try {
    f(*it->second);
  } catch (const std::bad_alloc&) {
    Close(id);  // No memory for this connection's buffers or messages.
  }
}

void TcpStoreServerImpl::WakeParked() {
  std::vector<uint64_t> ids;
  ids.reserve(parked_.size());
  for (const auto& [deadline, id] : parked_) ids.push_back(id);
  for (uint64_t id : ids) {
    ForConnection(id, [&](Connection& c) {
      if (c.parked && TryAnswerParked(c, /*timed_out=*/false) &&
          connections_.count(id)) {
        Pump(c);
      }
    });
  }
}

void TcpStoreServerImpl::ExpireParked(absl::Time now) {
  while (!parked_.empty() && parked_.begin()->first <= now) {
    const uint64_t id = parked_.begin()->second;
    if (connections_.count(id) == 0) {
      parked_.erase(parked_.begin());
      continue;
    }
    ForConnection(id, [&](Connection& c) {
      TryAnswerParked(c, /*timed_out=*/true);
      if (connections_.count(id)) Pump(c);
    });
  }
  while (changed_) {  // An answered connection's next request set a key.
    changed_ = false;
    WakeParked();
  }
}

void TcpStoreServerImpl::Shutdown() {
  // The listener closes first: a client that takes the last answer below
  // as "the store is gone" and connects again at once (a rank joining
  // again after Shutdown, Note [Rank 0's store at shutdown]) must be
  // refused, and so retry until the next store is up, not be accepted
  // into this listener's backlog and reset in its handshake.
  listener_.Close();
  // Parked requests get a last answer, best effort (one non-blocking send
  // each), then every connection closes.
  wire::StoreResponse response;
  SetStatus(StoreShuttingDown(), &response);
  std::string bytes;
  response.SerializeToString(&bytes);
  for (auto& [id, c] : connections_) {
    if (!c->parked) continue;
    absl::StatusOr<std::string> frame = c->channel->Seal(bytes);
    if (frame.ok()) {
      (void)!::send(c->channel->fd(), frame->data(), frame->size(),
                    MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }
  parked_.clear();
  connections_.clear();
  handshakes_->CloseAll();
  stat_connections_.store(0);
  stat_pending_.store(0);
  stat_parked_.store(0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    const std::string& bind_addr, int port, const std::string& secret,
    ServerOptions options) {
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        "the rendezvous store needs a non-empty job secret");
  }
  absl::StatusOr<net::Listener> listener = net::Listener::Bind(bind_addr, port);
  if (!listener.ok()) {
    return absl::Status(
        listener.status().code(),
        absl::StrCat("rendezvous store: ", listener.status().message()));
  }
  absl::StatusOr<std::unique_ptr<TcpStoreServerImpl>> server =
      TcpStoreServerImpl::Create(std::move(*listener), secret,
                                 std::move(options));
  if (!server.ok()) {
    return absl::Status(
        server.status().code(),
        absl::StrCat("rendezvous store: ", server.status().message()));
  }
  return std::unique_ptr<TcpStoreServer>(std::move(*server));
}

}  // namespace rendezvous
}  // namespace kolo
