// TCP rendezvous store: a server (in kolorun, or in rank 0 for jobs started
// by other launchers) and a client implementing kolo::Store.
//
// Every connection is authenticated (SecureChannel: HMAC-SHA256
// challenge-response over the job secret, then MAC'd frames carrying
// wire::StoreRequest / wire::StoreResponse). A connection that does not
// complete the handshake within kHandshakeTimeout is closed.
//
// Note [One thread for every store connection]
// The server runs one thread for everything: the listener, the pending
// handshakes (Note [Unauthenticated connections cost no thread] in
// runtime/net/handshake_queue.h: at most 256, each closed after 3 s) and the
// authenticated connections, all non-blocking, on one epoll set. So no
// number of connections, authenticated or not, can make the server start a
// thread or fail to. Per authenticated connection:
//   - requests are handled in order: the next frame is taken from the
//     connection's input only once the previous request is answered and its
//     response handed to the kernel. A GET or WAIT whose keys are not all
//     set is parked with its deadline; it is answered when the keys appear
//     (set through any connection or through local()) or at its deadline,
//     with the status and message InMemoryStore would give. Meanwhile the
//     connection's later frames wait, unread, in the kernel;
//   - the server buffers at most one frame of input (plus one read) and one
//     response of output, so a client that sends without reading only fills
//     its own socket buffers; frames are capped at kMaxStoreFrameBytes.
// Out of descriptors on accept (EMFILE, ENFILE), the server stops accepting
// for kAcceptPause instead of spinning on the queued connection. Resource
// failures are statuses: Start() returns one when it cannot create the
// thread, the epoll set or the wake-up eventfd; a connection that cannot
// get memory is closed. Stop() answers every parked request with
// Unavailable, closes every connection and joins the thread.
#ifndef KOLO_RUNTIME_RENDEZVOUS_TCP_STORE_H_
#define KOLO_RUNTIME_RENDEZVOUS_TCP_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kolo/store.h"

namespace kolo {
namespace rendezvous {

constexpr absl::Duration kHandshakeTimeout = absl::Seconds(3);
// Store values are small (addresses, NCCL unique ids, gloo's address lists:
// tens of bytes per rank); the cap keeps a confused or hostile peer from
// making either side buffer much.
constexpr size_t kMaxStoreFrameBytes = 16u << 20;

struct ServerOptions {
  // Called after every successful SET or ADD: on the server's thread for a
  // client's request, on the caller's thread for local()->Set/Add. It must
  // return quickly and must not call into the store or Stop(); it is never
  // called once Stop() has returned.
  std::function<void()> on_change;
  // Unauthenticated connections held at once (Note [Unauthenticated
  // connections cost no thread]).
  size_t max_pending_handshakes = 256;
};

// What the server holds right now (updated once per turn of its loop).
struct ServerStats {
  int64_t connections = 0;         // authenticated
  int64_t pending_handshakes = 0;  // accepted, not yet authenticated
  int64_t parked_requests = 0;     // GET/WAIT waiting for their keys
};

class TcpStoreServer {
 public:
  // Listens on bind_addr:port (port 0 = ephemeral) and serves until Stop().
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      const std::string& bind_addr, int port, const std::string& secret,
      ServerOptions options = ServerOptions());
  virtual ~TcpStoreServer() = default;

  virtual int port() const = 0;
  // Direct, in-process access to the same data (used by kolorun to watch
  // rendezvous progress without a connection). Its Get/Wait block the
  // caller, not the server.
  virtual std::shared_ptr<Store> local() = 0;
  // Closes the listener and every connection; joins the server's thread.
  virtual void Stop() = 0;
  // Connections refused so far because they failed authentication.
  virtual int64_t auth_failures() const = 0;
  virtual ServerStats stats() const = 0;
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
