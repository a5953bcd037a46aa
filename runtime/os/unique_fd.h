// UniqueFd: the owner of one file descriptor, and MakePipe() for both ends
// of a pipe.
//
// Every descriptor kolo opens is held by a UniqueFd (or by a class that
// keeps one, like net::Socket) from the moment it exists, so that every
// path out of a function, an error or an exception included, closes it
// exactly once. A plain `int` is a borrowed descriptor: whoever holds it
// must not close it.
//
// close() failing is not reported: on Linux the descriptor is released
// whatever close returns (EINTR included), so retrying could close another
// thread's new descriptor; data that must be on disk is fsync()ed first.
//
// Thread safety: as an int: one thread at a time changes a UniqueFd.
// reset() and release() call nothing but close(2) and keep errno as it was,
// so a forked child may use them before it execs (async-signal-safe), and
// an error path may close a descriptor before it formats errno.
#ifndef KOLO_RUNTIME_OS_UNIQUE_FD_H_
#define KOLO_RUNTIME_OS_UNIQUE_FD_H_

#include <fcntl.h>

#include "absl/status/statusor.h"

namespace kolo {
namespace os {

class UniqueFd {
 public:
  UniqueFd() = default;
  // Takes ownership of `fd` (-1, or any negative value: none).
  explicit UniqueFd(int fd) : fd_(fd < 0 ? -1 : fd) {}
  ~UniqueFd() { reset(); }

  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  // The descriptor, still owned (-1 if none).
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  // Gives up ownership without closing: the caller owns the result.
  [[nodiscard]] int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

  // Closes the descriptor held (if any and not `fd` itself) and takes
  // ownership of `fd`.
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Both ends of a pipe.
struct Pipe {
  UniqueFd read_end;
  UniqueFd write_end;
};

// pipe2(2) with `flags` (O_CLOEXEC, O_NONBLOCK). ResourceExhausted (out of
// descriptors) or Internal, with the errno text: callers add what the pipe
// was for.
absl::StatusOr<Pipe> MakePipe(int flags = O_CLOEXEC);

}  // namespace os
}  // namespace kolo

#endif  // KOLO_RUNTIME_OS_UNIQUE_FD_H_
