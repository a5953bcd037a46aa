#include "runtime/net/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kolo {
namespace net {

// Every fd here is non-blocking and every wait goes through poll() with the
// caller's deadline, so no call can block past its deadline.
struct Listener::AcceptState {
  std::mutex mu;
  std::condition_variable cv;
  bool closed = false;     // guarded by mu
  int active_accepts = 0;  // guarded by mu
};

namespace {

// Connect retries refused connections at this pace: the peer is usually a
// process that is still starting up.
constexpr absl::Duration kConnectRetryInterval = absl::Milliseconds(50);

// "host:port", with brackets around IPv6 literals.
std::string HostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

std::string ErrnoText(int err) {
  char buf[256];
  // GNU strerror_r: thread-safe, returns a pointer that may not be buf.
  return ::strerror_r(err, buf, sizeof(buf));
}

// Milliseconds until `deadline` for poll(): -1 = forever, rounded up so
// that poll never returns just before the deadline and spins.
int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  int64_t ms =
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

// Waits for `events` on fd. OK when ready (or when poll reports an error or
// hang-up: the next syscall on the fd reports it precisely).
absl::Status PollFd(int fd, short events, absl::Time deadline,
                    const char* what) {
  for (;;) {
    struct pollfd pfd = {fd, events, 0};
    int timeout_ms = PollTimeoutMs(deadline);
    int rc = ::poll(&pfd, 1, timeout_ms);
    if (rc > 0) return absl::OkStatus();
    if (rc < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("poll: ", ErrnoText(errno)));
    }
    // Timed out; poll may wake a little early, so re-check the clock.
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("deadline exceeded while waiting to ", what));
    }
  }
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string SockaddrToString(const struct sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const struct sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    return absl::StrCat(buf, ":", ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const struct sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    return absl::StrCat("[", buf, "]:", ntohs(in6->sin6_port));
  }
  return "";
}

// Errors worth retrying while the peer's listener is coming up.
bool IsTransientConnectError(int err) {
  return err == ECONNREFUSED || err == ECONNRESET || err == ECONNABORTED ||
         err == EAGAIN;
}

// One non-blocking connect attempt. Returns the connected fd, or -1 with
// *err set (ETIMEDOUT when the deadline passed).
int ConnectOnce(const struct addrinfo* ai, absl::Time deadline, int* err) {
  int fd =
      ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
               ai->ai_protocol);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  int rc;
  do {
    rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0 && errno != EINPROGRESS) {
    *err = errno;
    ::close(fd);
    return -1;
  }
  if (rc < 0) {
    absl::Status ready = PollFd(fd, POLLOUT, deadline, "connect");
    if (!ready.ok()) {
      *err = ETIMEDOUT;
      ::close(fd);
      return -1;
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) < 0) {
      so_error = errno;
    }
    if (so_error != 0) {
      *err = so_error;
      ::close(fd);
      return -1;
    }
  }
  SetNoDelay(fd);
  return fd;
}

}  // namespace

// --- Socket ---

Socket::Socket(int fd) : fd_(fd) {
  if (fd_ < 0) return;
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (::getpeername(fd_, reinterpret_cast<struct sockaddr*>(&ss), &len) == 0) {
    peer_ = SockaddrToString(ss);
  }
}

Socket::~Socket() { Close(); }

Socket::Socket(Socket&& other) noexcept
    : fd_(other.fd_), peer_(std::move(other.peer_)) {
  other.fd_ = -1;
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.fd_;
    peer_ = std::move(other.peer_);
    other.fd_ = -1;
  }
  return *this;
}

absl::StatusOr<Socket> Socket::Connect(const std::string& host, int port,
                                       absl::Time deadline) {
  const std::string where = HostPort(host, port);
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid port in address ", where));
  }
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  const std::string port_str = std::to_string(port);

  std::string last_error = "no attempt made";
  for (;;) {
    struct addrinfo* result = nullptr;
    int gai = ::getaddrinfo(host.c_str(), port_str.c_str(), &hints, &result);
    if (gai != 0) {
      if (gai != EAI_AGAIN) {
        return absl::UnavailableError(
            absl::StrCat("cannot resolve ", where, ": ", ::gai_strerror(gai)));
      }
      last_error = ::gai_strerror(gai);
    } else {
      // Retry while any address merely refused us (the peer's listener is
      // not up yet), even if another family is unreachable (say ::1 on a
      // host without IPv6).
      bool transient = false;
      for (const struct addrinfo* ai = result; ai != nullptr;
           ai = ai->ai_next) {
        int err = 0;
        int fd = ConnectOnce(ai, deadline, &err);
        if (fd >= 0) {
          ::freeaddrinfo(result);
          return Socket(fd);
        }
        last_error = ErrnoText(err);
        if (IsTransientConnectError(err) || err == ETIMEDOUT) transient = true;
        if (absl::Now() >= deadline) break;
      }
      ::freeaddrinfo(result);
      if (!transient) {
        return absl::UnavailableError(
            absl::StrCat("cannot connect to ", where, ": ", last_error));
      }
    }
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("timed out connecting to ", where,
                       " (last error: ", last_error, ")"));
    }
    // Connection setup, not synchronization: the peer is not listening yet.
    absl::SleepFor(std::min(kConnectRetryInterval, deadline - now));
  }
}

absl::Status Socket::SendAll(const void* data, size_t len,
                             absl::Time deadline) {
  if (fd_ < 0)
    return absl::UnavailableError("connection closed (socket closed)");
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    // MSG_DONTWAIT keeps the call non-blocking even for an fd handed to us
    // in blocking mode; MSG_NOSIGNAL turns SIGPIPE into EPIPE.
    ssize_t n = ::send(fd_, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      absl::Status ready = PollFd(fd_, POLLOUT, deadline, "send");
      if (!ready.ok()) return ready;
      continue;
    }
    int err = n < 0 ? errno : EPIPE;
    if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) {
      return absl::UnavailableError(absl::StrCat("connection closed (send to ",
                                                 PeerAddress(), ": ",
                                                 ErrnoText(err), ")"));
    }
    return absl::UnavailableError(
        absl::StrCat("send to ", PeerAddress(), " failed: ", ErrnoText(err)));
  }
  return absl::OkStatus();
}

absl::Status Socket::RecvAll(void* data, size_t len, absl::Time deadline) {
  if (fd_ < 0)
    return absl::UnavailableError("connection closed (socket closed)");
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = ::recv(fd_, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(
          absl::StrCat("connection closed by peer ", PeerAddress()));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      absl::Status ready = PollFd(fd_, POLLIN, deadline, "receive");
      if (!ready.ok()) return ready;
      continue;
    }
    int err = errno;
    if (err == ECONNRESET || err == ENOTCONN || err == EPIPE) {
      return absl::UnavailableError(
          absl::StrCat("connection closed (receive from ", PeerAddress(), ": ",
                       ErrnoText(err), ")"));
    }
    return absl::UnavailableError(absl::StrCat("receive from ", PeerAddress(),
                                               " failed: ", ErrnoText(err)));
  }
  return absl::OkStatus();
}

absl::Status Socket::WaitReadable(absl::Time deadline) {
  if (fd_ < 0)
    return absl::UnavailableError("connection closed (socket closed)");
  return PollFd(fd_, POLLIN, deadline, "receive");
}

void Socket::ShutdownBoth() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void Socket::Close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

// --- Listener ---

Listener::~Listener() { Close(); }

Listener::Listener(Listener&& other) noexcept
    : fd_(other.fd_),
      accept_state_(std::move(other.accept_state_)),
      port_(other.port_),
      addr_(std::move(other.addr_)) {
  wake_pipe_[0] = other.wake_pipe_[0];
  wake_pipe_[1] = other.wake_pipe_[1];
  other.fd_ = -1;
  other.wake_pipe_[0] = other.wake_pipe_[1] = -1;
  other.port_ = 0;
}

Listener& Listener::operator=(Listener&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.fd_;
    wake_pipe_[0] = other.wake_pipe_[0];
    wake_pipe_[1] = other.wake_pipe_[1];
    accept_state_ = std::move(other.accept_state_);
    port_ = other.port_;
    addr_ = std::move(other.addr_);
    other.fd_ = -1;
    other.wake_pipe_[0] = other.wake_pipe_[1] = -1;
    other.port_ = 0;
  }
  return *this;
}

absl::StatusOr<Listener> Listener::Bind(const std::string& addr, int port) {
  const std::string where = HostPort(addr, port);
  if (addr.empty()) {
    // getaddrinfo would pick the wildcard address; that must be explicit.
    return absl::InvalidArgumentError(
        "empty bind address (use 0.0.0.0 to listen on every interface)");
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid port in bind address ", where));
  }
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  struct addrinfo* result = nullptr;
  int gai = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints,
                          &result);
  if (gai != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bind address ", where,
        " is not a numeric IPv4/IPv6 address: ", ::gai_strerror(gai)));
  }
  int fd = ::socket(result->ai_family,
                    result->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    result->ai_protocol);
  if (fd < 0) {
    int err = errno;
    ::freeaddrinfo(result);
    return absl::UnavailableError(
        absl::StrCat("socket() for ", where, ": ", ErrnoText(err)));
  }
  // Lets a restarted server rebind while old connections sit in TIME_WAIT.
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, result->ai_addr, result->ai_addrlen) != 0) {
    int err = errno;
    ::freeaddrinfo(result);
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot bind ", where, ": ", ErrnoText(err)));
  }
  ::freeaddrinfo(result);
  if (::listen(fd, SOMAXCONN) != 0) {
    int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", where, ": ", ErrnoText(err)));
  }
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<struct sockaddr*>(&ss), &len) != 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(
        absl::StrCat("getsockname for ", where, ": ", ErrnoText(err)));
  }
  int bound_port =
      ss.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<struct sockaddr_in6*>(&ss)->sin6_port)
          : ntohs(reinterpret_cast<struct sockaddr_in*>(&ss)->sin_port);
  Listener listener;
  if (::pipe2(listener.wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("pipe2: ", ErrnoText(err)));
  }
  listener.fd_ = fd;
  listener.port_ = bound_port;
  listener.addr_ = addr;
  listener.accept_state_ = std::make_shared<AcceptState>();
  return listener;
}

absl::StatusOr<Socket> Listener::Accept(absl::Time deadline) {
  if (accept_state_ == nullptr) {
    return absl::CancelledError("listener is closed");
  }
  AcceptState& state = *accept_state_;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    if (state.closed) return absl::CancelledError("listener is closed");
    ++state.active_accepts;
  }
  // Close() waits for active_accepts to drop to zero before closing fds.
  auto leave = [&state]() {
    std::lock_guard<std::mutex> lock(state.mu);
    if (--state.active_accepts == 0) state.cv.notify_all();
  };
  const std::string where = HostPort(addr_, port_);
  for (;;) {
    struct pollfd pfds[2] = {{fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    int rc = ::poll(pfds, 2, PollTimeoutMs(deadline));
    if (rc < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      leave();
      return absl::InternalError(absl::StrCat("poll: ", ErrnoText(err)));
    }
    if (pfds[1].revents != 0) {
      leave();
      return absl::CancelledError(
          absl::StrCat("listener on ", where, " was closed"));
    }
    if (rc == 0) {
      if (absl::Now() >= deadline) {
        leave();
        return absl::DeadlineExceededError(
            absl::StrCat("no connection on ", where, " before the deadline"));
      }
      continue;
    }
    absl::StatusOr<Socket> socket = TryAccept();
    // The connection may have gone away between poll and accept, or another
    // thread took it: wait again.
    if (socket.ok() && !socket->valid()) continue;
    leave();
    return socket;
  }
}

absl::StatusOr<Socket> Listener::TryAccept() {
  if (fd_ < 0) return absl::CancelledError("listener is closed");
  for (;;) {
    struct sockaddr_storage ss;
    socklen_t ss_len = sizeof(ss);
    int fd = ::accept4(fd_, reinterpret_cast<struct sockaddr*>(&ss), &ss_len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      SetNoDelay(fd);
      return Socket(fd, SockaddrToString(ss));
    }
    const int err = errno;
    if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return Socket();
    const std::string what = absl::StrCat("accept on ", HostPort(addr_, port_),
                                          ": ", ErrnoText(err));
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
      return absl::ResourceExhaustedError(what);
    }
    return absl::UnavailableError(what);
  }
}

void Listener::Close() {
  if (accept_state_ == nullptr) return;
  AcceptState& state = *accept_state_;
  std::unique_lock<std::mutex> lock(state.mu);
  if (state.closed) return;
  state.closed = true;
  char byte = 1;
  ssize_t ignored = ::write(wake_pipe_[1], &byte, 1);
  (void)ignored;
  // The fds stay open until every Accept has left poll().
  state.cv.wait(lock, [&state] { return state.active_accepts == 0; });
  if (fd_ >= 0) ::close(fd_);
  if (wake_pipe_[0] >= 0) ::close(wake_pipe_[0]);
  if (wake_pipe_[1] >= 0) ::close(wake_pipe_[1]);
  fd_ = -1;
  wake_pipe_[0] = wake_pipe_[1] = -1;
}

}  // namespace net
}  // namespace kolo
