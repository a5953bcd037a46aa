#include "runtime/rendezvous/tcp_store.h"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <iterator>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/net/secure_channel.h"
#include "runtime/net/socket.h"
#include "runtime/rendezvous/in_memory_store.h"
#include "runtime/wire.pb.h"

namespace kolo {
namespace rendezvous {
namespace {

// Largest frame either side accepts: store values are small (addresses,
// NCCL unique ids), and a cap keeps a confused peer from making us buffer
// gigabytes.
constexpr size_t kMaxFrameBytes = 64u << 20;

// How much longer than the operation's own timeout a client waits for the
// server's answer (the server answers a timed-out GET/WAIT itself).
constexpr absl::Duration kResponseMargin = absl::Seconds(10);

// Timeouts at least this long wait forever (see ToChronoDeadline).
constexpr absl::Duration kForever = absl::Hours(24 * 365 * 100);

std::string HostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

// timeout_ms on the wire: int64 max stands for "forever".
int64_t ToWireTimeout(absl::Duration timeout) {
  if (timeout >= kForever) return std::numeric_limits<int64_t>::max();
  return std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout));
}

absl::Duration FromWireTimeout(int64_t timeout_ms) {
  if (timeout_ms == std::numeric_limits<int64_t>::max()) {
    return absl::InfiniteDuration();
  }
  return absl::Milliseconds(std::max<int64_t>(0, timeout_ms));
}

// --- Server ---

// The server's data, calling `on_change` after every successful change.
class NotifyingStore final : public Store {
 public:
  NotifyingStore(std::shared_ptr<InMemoryStore> state,
                 std::function<void()> on_change)
      : state_(std::move(state)), on_change_(std::move(on_change)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::Status s = state_->Set(key, value);
    if (s.ok() && on_change_) on_change_();
    return s;
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    return state_->Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    absl::StatusOr<int64_t> v = state_->Add(key, delta);
    if (v.ok() && on_change_) on_change_();
    return v;
  }
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override {
    return state_->Wait(keys, timeout);
  }
  absl::StatusOr<bool> Check(const std::string& key) override {
    return state_->Check(key);
  }

 private:
  const std::shared_ptr<InMemoryStore> state_;
  const std::function<void()> on_change_;
};

// Threads: one accept thread, and one thread per connection that runs the
// handshake and then serves requests one at a time (a parked GET blocks only
// its own connection). A finished connection thread hands its std::thread to
// `last_finished_` and joins the previous holder, so at most one finished
// thread is ever unjoined; Stop() joins that last one.
class TcpStoreServerImpl final : public TcpStoreServer {
 public:
  TcpStoreServerImpl(net::Listener listener, std::string secret,
                     ServerOptions options)
      : listener_(std::move(listener)),
        port_(listener_.port()),
        secret_(std::move(secret)),
        options_(std::move(options)),
        state_(std::make_shared<InMemoryStore>()),
        local_(std::make_shared<NotifyingStore>(state_, options_.on_change)) {}

  ~TcpStoreServerImpl() override { Stop(); }

  void StartAccepting() {
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  int port() const override { return port_; }
  std::shared_ptr<Store> local() override { return local_; }
  int64_t auth_failures() const override { return auth_failures_.load(); }

  void Stop() override {
    std::lock_guard<std::mutex> stop_lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    listener_.Close();
    if (accept_thread_.joinable()) accept_thread_.join();
    // No connection is added from here on. Wake parked GET/WAITs, then cut
    // every socket so that handshakes and Receive()s return at once.
    state_->Shutdown();
    std::thread last;
    {
      std::unique_lock<std::mutex> lock(mu_);
      for (Connection& connection : connections_) {
        connection.socket.ShutdownBoth();
      }
      cv_.wait(lock, [this] { return connections_.empty(); });
      last = std::move(last_finished_);
    }
    if (last.joinable()) last.join();
  }

 private:
  struct Connection {
    // Owned here so that Stop() can shut it down in any phase; the
    // connection thread's SecureChannel works on a dup() of it.
    net::Socket socket;
    std::thread thread;
  };
  using ConnectionIter = std::list<Connection>::iterator;

  void AcceptLoop() {
    for (;;) {
      absl::StatusOr<net::Socket> socket =
          listener_.Accept(absl::InfiniteFuture());
      if (absl::IsCancelled(socket.status())) return;
      if (!socket.ok()) {
        // Out of fds or similar: back off instead of spinning on the same
        // pending connection; Stop() cuts the wait short.
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, std::chrono::milliseconds(100),
                         [this] { return stopping_; })) {
          return;
        }
        continue;
      }
      int dup_fd = ::fcntl(socket->fd(), F_DUPFD_CLOEXEC, 0);
      if (dup_fd < 0) continue;  // Dropping the connection closes it.
      net::Socket channel_socket(dup_fd);
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      connections_.emplace_back();
      ConnectionIter connection = std::prev(connections_.end());
      connection->socket = std::move(*socket);
      // The new thread cannot finish (Finish takes mu_) before its
      // std::thread is stored.
      connection->thread = std::thread(&TcpStoreServerImpl::Serve, this,
                                       connection, std::move(channel_socket));
    }
  }

  void Serve(ConnectionIter connection, net::Socket socket) {
    {
      absl::StatusOr<std::unique_ptr<net::SecureChannel>> channel =
          net::SecureChannel::Server(std::move(socket), secret_,
                                     absl::Now() + kHandshakeTimeout,
                                     kMaxFrameBytes);
      if (!channel.ok()) {
        if (absl::IsPermissionDenied(channel.status())) ++auth_failures_;
      } else {
        ServeRequests(**channel);
      }
    }  // The channel (and its fd) closes before the connection is dropped.
    Finish(connection);
  }

  void ServeRequests(net::SecureChannel& channel) {
    for (;;) {
      absl::StatusOr<std::string> frame = channel.Receive();
      if (!frame.ok()) return;  // Closed by the client, by Stop(), or torn.
      wire::StoreRequest request;
      wire::StoreResponse response;
      if (!request.ParseFromString(*frame)) {
        SetStatus(absl::InvalidArgumentError("malformed StoreRequest"),
                  &response);
      } else {
        Handle(request, &response);
      }
      std::string bytes;
      response.SerializeToString(&bytes);
      if (!channel.Send(bytes).ok()) return;
    }
  }

  static void SetStatus(const absl::Status& status,
                        wire::StoreResponse* response) {
    response->set_code(static_cast<int>(status.code()));
    response->set_message(std::string(status.message()));
  }

  void Handle(const wire::StoreRequest& request,
              wire::StoreResponse* response) {
    switch (request.op()) {
      case wire::STORE_SET:
        SetStatus(local_->Set(request.key(), request.value()), response);
        return;
      case wire::STORE_GET: {
        absl::StatusOr<std::string> value =
            state_->Get(request.key(), FromWireTimeout(request.timeout_ms()));
        SetStatus(value.status(), response);
        if (value.ok()) response->set_value(std::move(*value));
        return;
      }
      case wire::STORE_ADD: {
        absl::StatusOr<int64_t> value =
            local_->Add(request.key(), request.delta());
        SetStatus(value.status(), response);
        if (value.ok()) response->set_int_value(*value);
        return;
      }
      case wire::STORE_WAIT: {
        std::vector<std::string> keys(request.keys().begin(),
                                      request.keys().end());
        SetStatus(state_->Wait(keys, FromWireTimeout(request.timeout_ms())),
                  response);
        return;
      }
      case wire::STORE_CHECK: {
        absl::StatusOr<bool> exists = state_->Check(request.key());
        SetStatus(exists.status(), response);
        if (exists.ok()) response->set_exists(*exists);
        return;
      }
      default:
        SetStatus(absl::InvalidArgumentError(
                      absl::StrCat("unknown store operation ", request.op())),
                  response);
    }
  }

  // Runs last on a connection thread: drops the connection and reaps the
  // previously finished thread (see the class comment).
  void Finish(ConnectionIter connection) {
    std::thread previous;
    {
      std::lock_guard<std::mutex> lock(mu_);
      previous = std::move(last_finished_);
      last_finished_ = std::move(connection->thread);
      connections_.erase(connection);
    }
    cv_.notify_all();
    if (previous.joinable()) previous.join();
  }

  net::Listener listener_;
  const int port_;
  const std::string secret_;
  const ServerOptions options_;
  const std::shared_ptr<InMemoryStore> state_;
  const std::shared_ptr<Store> local_;  // state_, calling on_change
  std::atomic<int64_t> auth_failures_{0};
  std::thread accept_thread_;

  std::mutex stop_mu_;    // Serializes Stop().
  bool stopped_ = false;  // guarded by stop_mu_

  std::mutex mu_;
  std::condition_variable cv_;  // stopping_ set, or a connection finished
  bool stopping_ = false;       // guarded by mu_
  std::list<Connection> connections_;  // guarded by mu_
  std::thread last_finished_;          // guarded by mu_
};

// --- Client ---

// One authenticated connection; calls are serialized by mu_ because the
// protocol is strictly request/response.
class TcpStoreClient final : public Store {
 public:
  TcpStoreClient(std::unique_ptr<net::SecureChannel> channel, std::string where)
      : channel_(std::move(channel)), where_(std::move(where)) {}

  ~TcpStoreClient() override { channel_->Shutdown(); }

  absl::Status Set(const std::string& key, const std::string& value) override {
    wire::StoreRequest request;
    request.set_op(wire::STORE_SET);
    request.set_key(key);
    request.set_value(value);
    return Call(request, absl::ZeroDuration()).status();
  }

  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    wire::StoreRequest request;
    request.set_op(wire::STORE_GET);
    request.set_key(key);
    request.set_timeout_ms(ToWireTimeout(timeout));
    absl::StatusOr<wire::StoreResponse> response = Call(request, timeout);
    if (!response.ok()) return response.status();
    return std::move(*response->mutable_value());
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    wire::StoreRequest request;
    request.set_op(wire::STORE_ADD);
    request.set_key(key);
    request.set_delta(delta);
    absl::StatusOr<wire::StoreResponse> response =
        Call(request, absl::ZeroDuration());
    if (!response.ok()) return response.status();
    return response->int_value();
  }

  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override {
    wire::StoreRequest request;
    request.set_op(wire::STORE_WAIT);
    for (const std::string& key : keys) request.add_keys(key);
    request.set_timeout_ms(ToWireTimeout(timeout));
    return Call(request, timeout).status();
  }

  absl::StatusOr<bool> Check(const std::string& key) override {
    wire::StoreRequest request;
    request.set_op(wire::STORE_CHECK);
    request.set_key(key);
    absl::StatusOr<wire::StoreResponse> response =
        Call(request, absl::ZeroDuration());
    if (!response.ok()) return response.status();
    return response->exists();
  }

 private:
  // Sends `request` and waits for its response; `timeout` is how long the
  // server may itself wait (GET/WAIT). Any transport failure leaves the
  // connection unusable: a late response would answer the next request.
  absl::StatusOr<wire::StoreResponse> Call(const wire::StoreRequest& request,
                                           absl::Duration timeout) {
    std::string bytes;
    if (!request.SerializeToString(&bytes)) {
      return absl::InternalError("cannot serialize StoreRequest");
    }
    if (bytes.size() > kMaxFrameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store request of ", bytes.size(), " bytes exceeds the ",
          kMaxFrameBytes, "-byte frame limit of the rendezvous store"));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return broken_;
    const absl::Time deadline =
        timeout >= kForever
            ? absl::InfiniteFuture()
            : absl::Now() + std::max(timeout, absl::ZeroDuration()) +
                  kResponseMargin;
    absl::Status sent = channel_->Send(bytes, deadline);
    if (!sent.ok()) return Break(sent);
    absl::StatusOr<std::string> frame = channel_->Receive(deadline);
    if (!frame.ok()) return Break(frame.status());
    wire::StoreResponse response;
    if (!response.ParseFromString(*frame)) {
      return Break(absl::DataLossError("malformed StoreResponse"));
    }
    if (response.code() != 0) {
      int code = response.code();
      if (code < 0 ||
          code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
        code = static_cast<int>(absl::StatusCode::kUnknown);
      }
      return absl::Status(static_cast<absl::StatusCode>(code),
                          response.message());
    }
    return response;
  }

  // Marks the connection unusable: every later call fails with Unavailable.
  // Requires mu_.
  absl::Status Break(const absl::Status& cause) {
    channel_->Shutdown();
    broken_ = absl::UnavailableError(
        absl::StrCat("lost connection to the rendezvous store at ", where_,
                     ": ", cause.message()));
    if (absl::IsDeadlineExceeded(cause)) {
      return absl::DeadlineExceededError(
          absl::StrCat("the rendezvous store at ", where_,
                       " did not answer in time: ", cause.message()));
    }
    return broken_;
  }

  const std::unique_ptr<net::SecureChannel> channel_;
  const std::string where_;
  std::mutex mu_;
  absl::Status broken_;  // guarded by mu_; OK while the connection is usable
};

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
  auto server =
      std::make_unique<TcpStoreServerImpl>(std::move(*listener), secret,
                                           std::move(options));
  server->StartAccepting();
  return std::unique_ptr<TcpStoreServer>(std::move(server));
}

absl::StatusOr<std::shared_ptr<Store>> ConnectTcpStore(
    const std::string& addr, int port, const std::string& secret,
    absl::Duration timeout) {
  const std::string where = HostPort(addr, port);
  const absl::Time deadline =
      timeout >= kForever ? absl::InfiniteFuture() : absl::Now() + timeout;
  absl::StatusOr<net::Socket> socket =
      net::Socket::Connect(addr, port, deadline);
  if (!socket.ok()) {
    return absl::Status(
        socket.status().code(),
        absl::StrCat("rendezvous store: ", socket.status().message()));
  }
  // The timeout is for waiting on a server that is not up yet; once it
  // answers, the handshake gets its own full allowance.
  const absl::Time handshake_deadline =
      std::max(deadline, absl::Now() + kHandshakeTimeout);
  absl::StatusOr<std::unique_ptr<net::SecureChannel>> channel =
      net::SecureChannel::Client(std::move(*socket), secret, handshake_deadline,
                                 kMaxFrameBytes);
  if (!channel.ok()) {
    if (absl::IsPermissionDenied(channel.status())) return channel.status();
    return absl::Status(channel.status().code(),
                        absl::StrCat("rendezvous store at ", where, ": ",
                                     channel.status().message()));
  }
  return std::shared_ptr<Store>(
      std::make_shared<TcpStoreClient>(std::move(*channel), where));
}

}  // namespace rendezvous
}  // namespace kolo
