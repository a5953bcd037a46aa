#include "runtime/os/unique_fd.h"

#include <errno.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/os/errno_text.h"

namespace kolo {
namespace os {

void UniqueFd::reset(int fd) {
  if (fd < 0) fd = -1;
  if (fd_ >= 0 && fd_ != fd) {
    const int saved_errno = errno;
    // Not retried on EINTR: the descriptor is gone either way (see the
    // header).
    ::close(fd_);
    errno = saved_errno;
  }
  fd_ = fd;
}

absl::StatusOr<Pipe> MakePipe(int flags) {
  int fds[2];
  if (::pipe2(fds, flags) != 0) {
    const int err = errno;
    const std::string message = absl::StrCat("pipe2: ", ErrnoText(err));
    if (err == EMFILE || err == ENFILE) {
      return absl::ResourceExhaustedError(message);
    }
    return absl::InternalError(message);
  }
  Pipe pipe;
  pipe.read_end.reset(fds[0]);
  pipe.write_end.reset(fds[1]);
  return pipe;
}

}  // namespace os
}  // namespace kolo
