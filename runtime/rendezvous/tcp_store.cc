#include "runtime/rendezvous/tcp_store.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/net/secure_channel.h"
#include "runtime/net/socket.h"
#include "runtime/rendezvous/store_wire.h"
#include "runtime/sync/mutex.h"
#include "runtime/wire.pb.h"

namespace kolo {
namespace rendezvous {
namespace {

// How much longer than the operation's own timeout a client waits for the
// server's answer (the server answers a timed-out GET/WAIT itself).
constexpr absl::Duration kResponseMargin = absl::Seconds(10);

std::string HostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

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
    if (bytes.size() > kMaxStoreFrameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store request of ", bytes.size(), " bytes exceeds the ",
          kMaxStoreFrameBytes, "-byte frame limit of the rendezvous store"));
    }
    MutexLock lock(&mu_);
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
  absl::Status Break(const absl::Status& cause) KOLO_REQUIRES(mu_) {
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
  Mutex mu_;
  absl::Status broken_
      KOLO_GUARDED_BY(mu_);  // OK while the connection is usable
};

}  // namespace

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
                                 kMaxStoreFrameBytes);
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
