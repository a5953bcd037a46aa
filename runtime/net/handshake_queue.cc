#include "runtime/net/handshake_queue.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/os/errno_text.h"

namespace kolo {
namespace net {

// See Note [Unauthenticated connections cost no thread] in the header.

absl::StatusOr<std::unique_ptr<HandshakeQueue>> HandshakeQueue::Create(
    std::string secret, size_t max_frame_bytes, Limits limits) {
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        "the job secret is empty: an empty secret authenticates nobody");
  }
  os::UniqueFd epoll_fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd.valid()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "epoll_create1 for pending handshakes: ", os::ErrnoText(errno)));
  }
  limits.max_pending = std::max<size_t>(limits.max_pending, 1);
  return std::unique_ptr<HandshakeQueue>(new HandshakeQueue(
      std::move(secret), max_frame_bytes, limits, std::move(epoll_fd)));
}

HandshakeQueue::HandshakeQueue(std::string secret, size_t max_frame_bytes,
                               Limits limits, os::UniqueFd epoll_fd)
    : secret_(std::move(secret)),
      max_frame_bytes_(max_frame_bytes),
      limits_(limits),
      epoll_fd_(std::move(epoll_fd)) {}

HandshakeQueue::~HandshakeQueue() { CloseAll(); }

void HandshakeQueue::CloseAll() {
  while (!queue_.empty()) Drop(queue_.begin());
}

bool HandshakeQueue::HasRoom(absl::Time now) const {
  return queue_.size() < limits_.max_pending ||
         queue_.front().accepted + limits_.min_age_to_evict <= now;
}

absl::Time HandshakeQueue::NextDeadline() const {
  if (queue_.empty()) return absl::InfiniteFuture();
  absl::Time next = queue_.front().accepted + limits_.timeout;
  if (queue_.size() >= limits_.max_pending) {
    next = std::min(next, queue_.front().accepted + limits_.min_age_to_evict);
  }
  return next;
}

void HandshakeQueue::Drop(Iterator it) {
  // Out of the epoll set before the descriptor closes (and its number can
  // be reused by the next accept).
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, it->socket.fd(), nullptr);
  by_id_.erase(it->id);
  queue_.erase(it);
}

void HandshakeQueue::Add(Socket socket, absl::Time now) {
  // 32 bytes into the empty send buffer of a new connection: a deadline of
  // `now` only stops a peer that is already gone from costing a wait.
  absl::StatusOr<std::string> nonce =
      SecureChannel::ServerHello(socket, absl::Now());
  if (!nonce.ok()) return;  // The socket closes here.
  if (queue_.size() >= limits_.max_pending) {
    Drop(queue_.begin());
    ++evicted_;
  }
  try {
    Pending pending;
    pending.id = next_id_++;
    pending.socket = std::move(socket);
    pending.nonce = std::move(*nonce);
    pending.answer.reserve(SecureChannel::kClientAnswerBytes);
    pending.accepted = now;
    queue_.push_back(std::move(pending));
    Iterator it = std::prev(queue_.end());
    by_id_.emplace(it->id, it);
    struct epoll_event event = {};
    event.events = EPOLLIN | EPOLLRDHUP;
    event.data.u64 = it->id;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, it->socket.fd(), &event) !=
        0) {
      Drop(it);  // Out of epoll watches (ENOSPC) or memory: closed.
    }
  } catch (const std::bad_alloc&) {
    // No memory for one more pending connection: it is closed. If it was
    // already queued, it is the newest entry.
    if (!queue_.empty() && queue_.back().id == next_id_ - 1) {
      Drop(std::prev(queue_.end()));
    }
  }
}

void HandshakeQueue::Read(Iterator it,
                          std::vector<std::unique_ptr<SecureChannel>>* done) {
  Pending& pending = *it;
  char buf[SecureChannel::kClientAnswerBytes];
  // Only the answer: bytes after it are the peer's first frame and stay in
  // the socket for whoever serves the channel.
  const size_t want = sizeof(buf) - pending.answer.size();
  const ssize_t got = ::recv(pending.socket.fd(), buf, want, MSG_DONTWAIT);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    return;
  }
  if (got <= 0) {  // Closed or reset before answering.
    Drop(it);
    return;
  }
  pending.answer.append(buf, static_cast<size_t>(got));
  if (pending.answer.size() < sizeof(buf)) return;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, pending.socket.fd(), nullptr);
  // The proof goes into an otherwise empty send buffer: does not block.
  absl::StatusOr<std::unique_ptr<SecureChannel>> channel =
      SecureChannel::ServerFinish(pending.socket, secret_, pending.nonce,
                                  pending.answer, absl::Now(),
                                  max_frame_bytes_);
  if (!channel.ok()) {
    // Counted before the close, so a peer that sees the close can rely on
    // the count.
    if (absl::IsPermissionDenied(channel.status())) ++auth_failures_;
  } else {
    done->push_back(std::move(*channel));
  }
  by_id_.erase(pending.id);
  queue_.erase(it);  // Closes the socket unless the channel took it.
}

std::vector<std::unique_ptr<SecureChannel>> HandshakeQueue::Process(
    absl::Time now) {
  std::vector<std::unique_ptr<SecureChannel>> done;
  struct epoll_event events[64];
  // A bounded number of rounds, so that a flood of answers cannot keep the
  // caller from its other connections; level-triggered, the rest stay ready.
  for (int round = 0; round < 8 && !queue_.empty(); ++round) {
    const int n = ::epoll_wait(epoll_fd_.get(), events, 64, 0);
    if (n <= 0) break;  // Nothing ready (or EINTR: the caller polls again).
    for (int i = 0; i < n; ++i) {
      // A copy: epoll_event is packed, its u64 misaligned for a reference.
      const uint64_t id = events[i].data.u64;
      auto found = by_id_.find(id);
      if (found == by_id_.end()) continue;
      try {
        Read(found->second, &done);
      } catch (const std::bad_alloc&) {
        auto again = by_id_.find(id);
        if (again != by_id_.end()) Drop(again->second);
      }
    }
    if (n < 64) break;
  }
  while (!queue_.empty() && queue_.front().accepted + limits_.timeout <= now) {
    Drop(queue_.begin());  // Late: closed, nothing parsed.
    ++timed_out_;
  }
  return done;
}

}  // namespace net
}  // namespace kolo
