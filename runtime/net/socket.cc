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
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/os/errno_text.h"
#include "runtime/os/poll_timeout.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace net {

// Every fd here is non-blocking and every wait goes through poll() with the
// caller's deadline, so no call can block past its deadline.
struct Listener::AcceptState {
  Mutex mu;
  CondVar cv;
  bool closed KOLO_GUARDED_BY(mu) = false;
  int active_accepts KOLO_GUARDED_BY(mu) = 0;
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

using os::ErrnoText;
using os::UniqueFd;

// Waits for `events` on fd. OK when ready (or when poll reports an error or
// hang-up: the next syscall on the fd reports it precisely).
absl::Status PollFd(int fd, short events, absl::Time deadline,
                    const char* what) {
  for (;;) {
    struct pollfd pfd = {fd, events, 0};
    int timeout_ms = os::PollTimeoutMs(deadline);
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

// One non-blocking connect attempt. Returns the connected socket, or an
// invalid one with *err set (ETIMEDOUT when the deadline passed).
UniqueFd ConnectOnce(const struct addrinfo* ai, absl::Time deadline, int* err) {
  UniqueFd fd(::socket(ai->ai_family,
                       ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                       ai->ai_protocol));
  if (!fd.valid()) {
    *err = errno;
    return UniqueFd();
  }
  int rc;
  do {
    rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0 && errno != EINPROGRESS) {
    *err = errno;
    return UniqueFd();
  }
  if (rc < 0) {
    absl::Status ready = PollFd(fd.get(), POLLOUT, deadline, "connect");
    if (!ready.ok()) {
      *err = ETIMEDOUT;
      return UniqueFd();
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len) < 0) {
      so_error = errno;
    }
    if (so_error != 0) {
      *err = so_error;
      return UniqueFd();
    }
  }
  SetNoDelay(fd.get());
  return fd;
}

}  // namespace

// --- Socket ---

Socket::Socket(UniqueFd fd) : fd_(std::move(fd)) {
  if (!fd_.valid()) return;
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (::getpeername(fd_.get(), reinterpret_cast<struct sockaddr*>(&ss), &len) ==
      0) {
    peer_ = SockaddrToString(ss);
  }
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
        UniqueFd fd = ConnectOnce(ai, deadline, &err);
        if (fd.valid()) {
          ::freeaddrinfo(result);
          return Socket(std::move(fd));
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
  if (!fd_.valid())
    return absl::UnavailableError("connection closed (socket closed)");
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    // MSG_DONTWAIT keeps the call non-blocking even for an fd handed to us
    // in blocking mode; MSG_NOSIGNAL turns SIGPIPE into EPIPE.
    ssize_t n = ::send(fd_.get(), p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      absl::Status ready = PollFd(fd_.get(), POLLOUT, deadline, "send");
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
  if (!fd_.valid())
    return absl::UnavailableError("connection closed (socket closed)");
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = ::recv(fd_.get(), p, len, MSG_DONTWAIT);
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
      absl::Status ready = PollFd(fd_.get(), POLLIN, deadline, "receive");
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
  if (!fd_.valid())
    return absl::UnavailableError("connection closed (socket closed)");
  return PollFd(fd_.get(), POLLIN, deadline, "receive");
}

void Socket::ShutdownBoth() {
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
}

void Socket::Close() { fd_.reset(); }

// --- Listener ---

Listener::~Listener() { Close(); }

Listener::Listener(Listener&& other) noexcept
    : fd_(std::move(other.fd_)),
      wake_pipe_(std::move(other.wake_pipe_)),
      accept_state_(std::move(other.accept_state_)),
      port_(other.port_),
      addr_(std::move(other.addr_)) {
  other.port_ = 0;
}

Listener& Listener::operator=(Listener&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::move(other.fd_);
    wake_pipe_ = std::move(other.wake_pipe_);
    accept_state_ = std::move(other.accept_state_);
    port_ = other.port_;
    addr_ = std::move(other.addr_);
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
  UniqueFd fd(::socket(result->ai_family,
                       result->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                       result->ai_protocol));
  if (!fd.valid()) {
    int err = errno;
    ::freeaddrinfo(result);
    return absl::UnavailableError(
        absl::StrCat("socket() for ", where, ": ", ErrnoText(err)));
  }
  // Lets a restarted server rebind while old connections sit in TIME_WAIT.
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), result->ai_addr, result->ai_addrlen) != 0) {
    int err = errno;
    ::freeaddrinfo(result);
    return absl::UnavailableError(
        absl::StrCat("cannot bind ", where, ": ", ErrnoText(err)));
  }
  ::freeaddrinfo(result);
  if (::listen(fd.get(), SOMAXCONN) != 0) {
    int err = errno;
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", where, ": ", ErrnoText(err)));
  }
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (::getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&ss), &len) !=
      0) {
    int err = errno;
    return absl::InternalError(
        absl::StrCat("getsockname for ", where, ": ", ErrnoText(err)));
  }
  int bound_port =
      ss.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<struct sockaddr_in6*>(&ss)->sin6_port)
          : ntohs(reinterpret_cast<struct sockaddr_in*>(&ss)->sin_port);
  absl::StatusOr<os::Pipe> wake_pipe = os::MakePipe(O_CLOEXEC | O_NONBLOCK);
  if (!wake_pipe.ok()) return wake_pipe.status();
  Listener listener;
  listener.fd_ = std::move(fd);
  listener.wake_pipe_ = *std::move(wake_pipe);
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
    MutexLock lock(&state.mu);
    if (state.closed) return absl::CancelledError("listener is closed");
    ++state.active_accepts;
  }
  // Close() waits for active_accepts to drop to zero before closing fds.
  auto leave = [&state]() {
    MutexLock lock(&state.mu);
    if (--state.active_accepts == 0) state.cv.NotifyAll();
  };
  const std::string where = HostPort(addr_, port_);
  for (;;) {
    struct pollfd pfds[2] = {{fd_.get(), POLLIN, 0},
                             {wake_pipe_.read_end.get(), POLLIN, 0}};
    int rc = ::poll(pfds, 2, os::PollTimeoutMs(deadline));
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
  if (!fd_.valid()) return absl::CancelledError("listener is closed");
  for (;;) {
    struct sockaddr_storage ss;
    socklen_t ss_len = sizeof(ss);
    UniqueFd fd(::accept4(fd_.get(), reinterpret_cast<struct sockaddr*>(&ss),
                          &ss_len, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.valid()) {
      SetNoDelay(fd.get());
      return Socket(std::move(fd), SockaddrToString(ss));
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
  MutexLock lock(&state.mu);
  if (state.closed) return;
  state.closed = true;
  char byte = 1;
  ssize_t ignored = ::write(wake_pipe_.write_end.get(), &byte, 1);
  (void)ignored;
  // The fds stay open until every Accept has left poll().
  while (state.active_accepts != 0) state.cv.Wait(&state.mu);
  fd_.reset();
  wake_pipe_ = os::Pipe();
}

}  // namespace net
}  // namespace kolo
