#include "tools/kolorun/job_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/os/errno_text.h"

namespace kolo {
namespace kolorun {
namespace {

// What kolorun writes on the pipe: a process group id (> 0), or kReleased.
constexpr int32_t kReleased = 0;

bool WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

[[noreturn]] void GuardMain(int fd) {
  setpgid(0, 0);
  for (int signo :
       {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU}) {
    signal(signo, SIG_IGN);
  }
  signal(SIGCHLD, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // Nothing of kolorun's stays open here but the pipe (its output must reach
  // EOF when kolorun ends).
  const int null_fd = open("/dev/null", O_RDWR);
  for (int target = 0; target <= 2; ++target) {
    if (null_fd >= 0 && null_fd != target) dup2(null_fd, target);
  }
  if (fd != 3) {
    dup2(fd, 3);
    fd = 3;
  }
  syscall(SYS_close_range, 4u, ~0u, 0);
  std::vector<pid_t> groups;
  int32_t value = 0;
  size_t have = 0;
  for (;;) {
    const ssize_t n =
        read(fd, reinterpret_cast<char*>(&value) + have, sizeof(value) - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // kolorun is gone.
    have += static_cast<size_t>(n);
    if (have < sizeof(value)) continue;
    have = 0;
    if (value == kReleased) _exit(0);
    groups.push_back(static_cast<pid_t>(value));
  }
  for (pid_t group : groups) killpg(group, SIGKILL);
  _exit(0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobGuard>> JobGuard::Start() {
  absl::StatusOr<os::Pipe> pipe = os::MakePipe(O_CLOEXEC);
  if (!pipe.ok()) {
    return absl::Status(pipe.status().code(),
                        absl::StrCat("cannot create the job guard's pipe: ",
                                     pipe.status().message()));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot start the job guard: fork: ", os::ErrnoText(errno)));
  }
  if (pid == 0) {
    // Async-signal-safe, as the child needs: reset() is one system call.
    pipe->write_end.reset();
    GuardMain(pipe->read_end.get());
  }
  pipe->read_end.reset();
  // Also here, whichever of the two runs first.
  setpgid(pid, pid);
  return std::unique_ptr<JobGuard>(
      new JobGuard(pid, std::move(pipe->write_end)));
}

JobGuard::~JobGuard() { Release(); }

void JobGuard::Watch(pid_t process_group) {
  if (!fd_.valid() || process_group <= 0) return;
  const int32_t value = static_cast<int32_t>(process_group);
  WriteAll(fd_.get(), &value, sizeof(value));
}

void JobGuard::Release() {
  if (!fd_.valid()) return;
  const int32_t value = kReleased;
  WriteAll(fd_.get(), &value, sizeof(value));
  fd_.reset();
  int status;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace kolorun
}  // namespace kolo
