// TCP rendezvous store: a server (in kolorun, or in rank 0 for jobs started
// by other launchers) and a client implementing kolo::Store.
//
// Every connection is authenticated (SecureChannel: HMAC-SHA256
// challenge-response over the job secret, then MAC'd frames carrying
// wire::StoreRequest / wire::StoreResponse). A connection that does not
// complete the handshake within kHandshakeTimeout is closed.
#ifndef KOLO_RUNTIME_RENDEZVOUS_TCP_STORE_H_
#define KOLO_RUNTIME_RENDEZVOUS_TCP_STORE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kolo/store.h"

namespace kolo {
namespace rendezvous {

constexpr absl::Duration kHandshakeTimeout = absl::Seconds(3);

struct ServerOptions {
  // Called after every successful SET or ADD, by the server's thread (a
  // client's request) or by the caller of local() (must not block).
  std::function<void()> on_change;
};

class TcpStoreServer {
 public:
  // Listens on bind_addr:port (port 0 = ephemeral) and serves until Stop().
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      const std::string& bind_addr, int port, const std::string& secret,
      ServerOptions options = {});
  virtual ~TcpStoreServer() = default;

  virtual int port() const = 0;
  // Direct, in-process access to the same data (used by kolorun to watch
  // rendezvous progress without a connection).
  virtual std::shared_ptr<Store> local() = 0;
  // Closes the listener and every connection; joins all threads.
  virtual void Stop() = 0;
  // Connections refused so far because they failed authentication.
  virtual int64_t auth_failures() const = 0;
};

// Connects (retrying until `timeout` while the server is not up yet) and
// authenticates. PermissionDenied("authentication failed ...") on a wrong
// secret.
absl::StatusOr<std::shared_ptr<Store>> ConnectTcpStore(
    const std::string& addr, int port, const std::string& secret,
    absl::Duration timeout);

}  // namespace rendezvous
}  // namespace kolo

#endif  // KOLO_RUNTIME_RENDEZVOUS_TCP_STORE_H_
