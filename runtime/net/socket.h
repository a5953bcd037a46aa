// Thin RAII wrappers over TCP sockets with deadlines on every blocking call.
//
// Thread safety: a Socket may be used by one reader and one writer thread at
// once; ShutdownBoth() may be called from any thread to unblock both.
#ifndef KOLO_RUNTIME_NET_SOCKET_H_
#define KOLO_RUNTIME_NET_SOCKET_H_

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/os/unique_fd.h"

namespace kolo {
namespace net {

class Socket {
 public:
  Socket() = default;
  // Owns a connected socket; the peer's address is read now (see
  // PeerAddress()).
  explicit Socket(os::UniqueFd fd);
  Socket(os::UniqueFd fd, std::string peer)
      : fd_(std::move(fd)), peer_(std::move(peer)) {}
  ~Socket() = default;  // Closes the socket.
  Socket(Socket&& other) = default;
  Socket& operator=(Socket&& other) = default;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Connects to host:port (numeric address or name), retrying refused
  // connections until `deadline` (the peer may not listen yet).
  // DeadlineExceeded / Unavailable name host:port.
  static absl::StatusOr<Socket> Connect(const std::string& host, int port,
                                        absl::Time deadline);

  // Sends/receives exactly `len` bytes. Unavailable("connection closed") on
  // EOF, DeadlineExceeded when the deadline passes.
  absl::Status SendAll(const void* data, size_t len, absl::Time deadline);
  absl::Status RecvAll(void* data, size_t len, absl::Time deadline);

  // Waits until a read would not block (data, EOF or an error is pending)
  // without consuming anything. DeadlineExceeded when the deadline passes.
  // Lets framed readers tell "nothing arrived yet" from a torn frame.
  absl::Status WaitReadable(absl::Time deadline);

  // Unblocks any thread blocked in SendAll/RecvAll on this socket.
  void ShutdownBoth();
  void Close();
  bool valid() const { return fd_.valid(); }
  // Borrowed: the Socket keeps owning it.
  int fd() const { return fd_.get(); }
  // "127.0.0.1:41234" of the remote end ("" if unknown). Remembered when
  // the socket was connected or accepted, so that errors still name the
  // peer after it reset the connection (getpeername() then fails).
  const std::string& PeerAddress() const { return peer_; }

 private:
  os::UniqueFd fd_;
  std::string peer_;
};

class Listener {
 public:
  Listener() = default;
  ~Listener();
  Listener(Listener&& other) noexcept;
  Listener& operator=(Listener&& other) noexcept;

  // Binds to `addr` (numeric IPv4/IPv6; never a wildcard unless asked with
  // "0.0.0.0") and `port` (0 = ephemeral) and listens.
  static absl::StatusOr<Listener> Bind(const std::string& addr, int port);

  // Waits for a connection until `deadline` (InfiniteFuture = forever).
  // Cancelled once Close() was called.
  absl::StatusOr<Socket> Accept(absl::Time deadline);

  // One non-blocking accept, for a thread that polls fd() itself: a
  // connection, or an invalid Socket when none is pending.
  // ResourceExhausted when the process or system is out of descriptors or
  // buffers (EMFILE, ENFILE, ENOBUFS, ENOMEM): the pending connection stays
  // queued, so the caller should stop polling fd() for a while instead of
  // retrying at once. Not to be mixed with Accept() or Close() in other
  // threads.
  absl::StatusOr<Socket> TryAccept();
  // Borrowed: the Listener keeps owning it.
  int fd() const { return fd_.get(); }

  // Unblocks Accept and closes the socket. Thread-safe.
  void Close();
  int port() const { return port_; }
  const std::string& addr() const { return addr_; }

 private:
  // Lets Close() wait for threads inside Accept before it closes the fds
  // they poll (closing an fd another thread polls could let a new fd reuse
  // its number). Heap-allocated so that Listener stays movable; shared_ptr
  // because its deleter needs no complete type in this header.
  struct AcceptState;

  os::UniqueFd fd_;
  os::Pipe wake_pipe_;  // Close() writes here to unblock Accept.
  std::shared_ptr<AcceptState> accept_state_;
  int port_ = 0;
  std::string addr_;
};

}  // namespace net
}  // namespace kolo

#endif  // KOLO_RUNTIME_NET_SOCKET_H_
