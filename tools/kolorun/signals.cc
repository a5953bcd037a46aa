#include "tools/kolorun/signals.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "runtime/os/errno_text.h"

namespace kolo {
namespace kolorun {
namespace {

constexpr int kForwardedSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// The handler's only state: where to write. Written before the handlers are
// installed and reset after they are removed.
volatile sig_atomic_t g_signal_write_fd = -1;

}  // namespace

void SignalPipe::Handler(int signo) {
  const int saved_errno = errno;
  const int fd = g_signal_write_fd;
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(signo);
    // A full pipe drops the byte; the reader still wakes for the earlier
    // ones, and SIGCHLD handling reaps every exited child at once.
    (void)!write(fd, &byte, 1);
  }
  errno = saved_errno;
}

absl::StatusOr<std::unique_ptr<SignalPipe>> SignalPipe::Install() {
  absl::StatusOr<os::Pipe> fds = os::MakePipe(O_CLOEXEC | O_NONBLOCK);
  if (!fds.ok()) {
    return absl::Status(fds.status().code(),
                        absl::StrCat("cannot create the signal pipe: ",
                                     fds.status().message()));
  }
  std::unique_ptr<SignalPipe> pipe(new SignalPipe(*std::move(fds)));
  g_signal_write_fd = pipe->pipe_.write_end.get();

  struct sigaction action = {};
  action.sa_handler = &SignalPipe::Handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int signo : kForwardedSignals) {
    struct sigaction old;
    if (sigaction(signo, &action, &old) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot install a handler for signal ", signo, ": ",
                       os::ErrnoText(errno)));
    }
    pipe->previous_.emplace_back(signo, old);
  }
  // A blocked mask is inherited across exec: whoever started kolorun (a test
  // harness, a service manager) may have blocked SIGCHLD or SIGTERM.
  sigset_t forwarded;
  sigemptyset(&forwarded);
  for (int signo : kForwardedSignals) sigaddset(&forwarded, signo);
  pthread_sigmask(SIG_UNBLOCK, &forwarded, nullptr);

  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  struct sigaction old;
  if (sigaction(SIGPIPE, &ignore, &old) == 0) {
    pipe->previous_.emplace_back(SIGPIPE, old);
  }
  return pipe;
}

SignalPipe::~SignalPipe() {
  for (auto it = previous_.rbegin(); it != previous_.rend(); ++it) {
    sigaction(it->first, &it->second, nullptr);
  }
  g_signal_write_fd = -1;
  // pipe_ closes after the handler has stopped writing to it.
}

std::vector<int> SignalPipe::Drain() {
  std::vector<int> signals;
  unsigned char buffer[64];
  for (;;) {
    const ssize_t n = read(pipe_.read_end.get(), buffer, sizeof(buffer));
    if (n > 0) {
      signals.insert(signals.end(), buffer, buffer + n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EAGAIN: drained.
  }
  return signals;
}

void SignalPipe::ResetInChild() const {
  g_signal_write_fd = -1;
  for (const auto& [signo, inherited] : previous_) {
    struct sigaction action = {};
    action.sa_handler = inherited.sa_handler == SIG_IGN ? SIG_IGN : SIG_DFL;
    sigemptyset(&action.sa_mask);
    sigaction(signo, &action, nullptr);
  }
}

}  // namespace kolorun
}  // namespace kolo
