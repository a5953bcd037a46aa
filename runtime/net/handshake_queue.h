// HandshakeQueue: the server side of SecureChannel's handshake for many
// connections at once, driven by one thread that polls fd().
//
// Note [Unauthenticated connections cost no thread]
// Anyone who can reach a kolo port can open connections to it; only the
// handshake tells a peer that holds the job secret from one that does not.
// So until the handshake completes a connection must cost the server
// nothing it could run out of: no thread (threads count against the
// process's and the cgroup's task limits, and std::thread throws when none
// is left), and only a bounded number of descriptors and bytes. A server
// therefore hands each accepted socket to a HandshakeQueue, which
//   - sends the server nonce at once (32 bytes into an empty send buffer:
//     never blocks) and reads the 64-byte answer as it arrives, without
//     blocking, for every pending connection from the caller's one thread;
//   - holds at most `max_pending` connections: a new one closes the oldest
//     pending one, which has had the longest time to answer (a client that
//     holds the secret answers within microseconds of receiving the nonce);
//   - never closes a connection younger than `min_age_to_evict` to make
//     room: when every pending connection is that young, HasRoom() is false
//     and the server stops accepting until one ages, answers or goes. New
//     connections then wait in the kernel's accept queue, not in our
//     memory, and a flood can slow a real client down but not starve it;
//   - closes every connection that has not completed the handshake within
//     `timeout` of its accept (kHandshakeTimeout, 3 s), and every one whose
//     answer is wrong, without a word (counted in auth_failures(), before
//     the peer can see the close).
// Only connections that completed the handshake come out of Process(), as
// SecureChannels; what the server spends on them is its own business.
//
// Thread safety: one thread calls everything but auth_failures(), which may
// be read from any thread.
#ifndef KOLO_RUNTIME_NET_HANDSHAKE_QUEUE_H_
#define KOLO_RUNTIME_NET_HANDSHAKE_QUEUE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/net/secure_channel.h"
#include "runtime/net/socket.h"
#include "runtime/os/unique_fd.h"

namespace kolo {
namespace net {

class HandshakeQueue {
 public:
  struct Limits {
    size_t max_pending = 256;
    absl::Duration timeout = absl::Seconds(3);
    absl::Duration min_age_to_evict = absl::Milliseconds(100);
  };

  // Fails only when the kernel gives no epoll instance.
  static absl::StatusOr<std::unique_ptr<HandshakeQueue>> Create(
      std::string secret, size_t max_frame_bytes, Limits limits);
  static absl::StatusOr<std::unique_ptr<HandshakeQueue>> Create(
      std::string secret, size_t max_frame_bytes) {
    return Create(std::move(secret), max_frame_bytes, Limits());
  }
  ~HandshakeQueue();  // Closes every pending connection.

  // Readable (POLLIN) when some pending connection has bytes or closed.
  int fd() const { return epoll_fd_.get(); }

  // Whether Add() now would close no connection younger than
  // min_age_to_evict.
  bool HasRoom(absl::Time now) const;
  // Sends the nonce to a freshly accepted connection and queues it,
  // closing the oldest pending one if the queue is full. A connection that
  // cannot be queued (its peer is gone, no memory) is closed.
  void Add(Socket socket, absl::Time now);
  // Reads the answers that have arrived, closes wrong, broken and late
  // connections, and returns those that completed the handshake.
  std::vector<std::unique_ptr<SecureChannel>> Process(absl::Time now);
  // When Process() or HasRoom() will next give a different answer without
  // any I/O (a handshake's deadline; when full, the oldest's coming of age).
  absl::Time NextDeadline() const;

  // Closes every pending connection.
  void CloseAll();

  size_t pending() const { return queue_.size(); }
  int64_t auth_failures() const { return auth_failures_.load(); }
  // Closed to make room, and closed at their deadline (for tests and logs).
  int64_t evicted() const { return evicted_; }
  int64_t timed_out() const { return timed_out_; }

 private:
  struct Pending {
    uint64_t id = 0;
    Socket socket;
    std::string nonce;
    std::string answer;  // bytes received so far
    absl::Time accepted;
  };
  using Iterator = std::list<Pending>::iterator;

  HandshakeQueue(std::string secret, size_t max_frame_bytes, Limits limits,
                 os::UniqueFd epoll_fd);
  void Drop(Iterator it);
  // Reads what `it` has sent; a completed channel goes to `done`.
  void Read(Iterator it, std::vector<std::unique_ptr<SecureChannel>>* done);

  const std::string secret_;
  const size_t max_frame_bytes_;
  const Limits limits_;
  const os::UniqueFd epoll_fd_;
  uint64_t next_id_ = 1;
  std::list<Pending> queue_;  // oldest first (so also by deadline)
  std::unordered_map<uint64_t, Iterator> by_id_;
  std::atomic<int64_t> auth_failures_{0};
  int64_t evicted_ = 0;
  int64_t timed_out_ = 0;
};

}  // namespace net
}  // namespace kolo

#endif  // KOLO_RUNTIME_NET_HANDSHAKE_QUEUE_H_
