// kolo_rank_guard: runs one remote rank for kolorun and ends it when the
// ssh connection closes. See Note [Remote ranks] in remote.h.
//
//   kolo_rank_guard --rank R -- command [args...]   (request on stdin)
//
// Single-threaded: one poll() loop over standard input and a self-pipe that
// carries SIGCHLD, SIGTERM, SIGINT, SIGHUP and SIGQUIT.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/os/errno_text.h"
#include "runtime/os/poll_timeout.h"
#include "runtime/os/unique_fd.h"
#include "tools/kolorun/output.h"
#include "tools/kolorun/process.h"
#include "tools/kolorun/remote.h"
#include "tools/kolorun/secret_fd.h"
#include "tools/kolorun/signals.h"

extern char** environ;

namespace kolo {
namespace kolorun {
namespace {

// How long kolorun has to deliver the request once ssh has started us.
constexpr absl::Duration kRequestTimeout = absl::Seconds(60);
// Exit status when the guard fails before it could start the rank.
constexpr int kGuardFailure = 125;

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

using os::ErrnoText;
using os::PollTimeoutMs;

int CpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

class RankGuard {
 public:
  RankGuard(int rank, std::vector<std::string> command)
      : rank_(rank), command_(std::move(command)) {}

  int Run();

 private:
  void Say(const std::string& message) const {
    WriteFully(STDERR_FILENO,
               absl::StrCat("kolo_rank_guard: rank ", rank_, " on ", HostName(),
                            ": ", message, "\n"));
  }
  absl::Status ReadRequest();
  absl::Status PrepareEnvironment();
  // Reaps every exited child; records the worker's status.
  void Reap();
  void BeginTeardown();
  bool GroupAlive() const { return pid_ > 0 && killpg(pid_, 0) == 0; }
  int Finish(int wait_status);

  const int rank_;
  const std::vector<std::string> command_;
  std::unique_ptr<SignalPipe> signals_;
  GuardRequest request_;
  std::unique_ptr<SecretDescriptor> secret_fd_;
  pid_t pid_ = -1;  // The worker, also its process group.
  bool worker_running_ = false;
  int wait_status_ = 0;
  bool stdin_open_ = true;
  bool tearing_down_ = false;
  bool killed_ = false;
  absl::Time kill_deadline_ = absl::InfiniteFuture();
};

absl::Status RankGuard::ReadRequest() {
  GuardRequestDecoder decoder;
  const absl::Time deadline = absl::Now() + kRequestTimeout;
  char buffer[16 * 1024];
  while (!decoder.done()) {
    struct pollfd p = {STDIN_FILENO, POLLIN, 0};
    const int ready = poll(&p, 1, PollTimeoutMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      return absl::DeadlineExceededError("no request from kolorun in time");
    }
    const ssize_t n = read(STDIN_FILENO, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(
          "standard input closed before kolorun's request arrived");
    }
    if (absl::Status s = decoder.Feed(absl::string_view(buffer, n)); !s.ok()) {
      return s;
    }
  }
  request_ = decoder.request();
  return absl::OkStatus();
}

absl::Status RankGuard::PrepareEnvironment() {
  if (!request_.cwd.empty() && chdir(request_.cwd.c_str()) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "cannot enter the directory ", request_.cwd, ": ", ErrnoText(errno)));
  }
  for (const std::string& entry : request_.env) {
    const size_t eq = entry.find('=');
    setenv(entry.substr(0, eq).c_str(), entry.substr(eq + 1).c_str(), 1);
  }
  unsetenv("KOLO_SECRET");
  unsetenv("KOLO_SECRET_FILE");
  // Note [Secret without a file] in secret_fd.h: nothing on this host's
  // disk either.
  absl::StatusOr<std::unique_ptr<SecretDescriptor>> secret =
      SecretDescriptor::Create(request_.secret);
  if (!secret.ok()) return secret.status();
  secret_fd_ = *std::move(secret);
  request_.secret.clear();
  setenv("KOLO_SECRET_FD", absl::StrCat(secret_fd_->fd()).c_str(), 1);
  if (getenv("OMP_NUM_THREADS") == nullptr) {
    int local_size = 1;
    const char* value = getenv("KOLO_LOCAL_SIZE");
    if (value == nullptr || !absl::SimpleAtoi(value, &local_size) ||
        local_size < 1) {
      local_size = 1;
    }
    setenv("OMP_NUM_THREADS",
           absl::StrCat(std::max(1, CpuCount() / local_size)).c_str(), 1);
  }
  return absl::OkStatus();
}

void RankGuard::Reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    if (pid == pid_) {
      worker_running_ = false;
      wait_status_ = status;
    }
  }
}

void RankGuard::BeginTeardown() {
  if (tearing_down_) return;
  tearing_down_ = true;
  killpg(pid_, SIGTERM);
  killpg(pid_, SIGCONT);  // A stopped process acts on SIGTERM once continued.
  kill_deadline_ = absl::Now() + request_.grace_period;
}

int RankGuard::Finish(int wait_status) {
  secret_fd_.reset();
  if (!request_.status_token.empty()) {
    WriteFully(STDERR_FILENO,
               GuardStatusLine(request_.status_token, pid_, wait_status));
  }
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return kGuardFailure;
}

int RankGuard::Run() {
  absl::StatusOr<std::unique_ptr<SignalPipe>> signals = SignalPipe::Install();
  if (!signals.ok()) {
    Say(std::string(signals.status().message()));
    return kGuardFailure;
  }
  signals_ = *std::move(signals);
  // Processes the rank leaves behind come back to us, so that the guard can
  // see its process group empty.
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  if (absl::Status s = ReadRequest(); !s.ok()) {
    Say(std::string(s.message()));
    return kGuardFailure;
  }
  if (absl::Status s = PrepareEnvironment(); !s.ok()) {
    Say(std::string(s.message()));
    return Finish(kGuardFailure << 8);
  }

  os::UniqueFd dev_null(open("/dev/null", O_RDONLY | O_CLOEXEC));
  std::vector<std::string> env;
  for (char** entry = environ; entry && *entry; ++entry) env.push_back(*entry);
  WorkerLaunch launch;
  launch.argv = command_;
  launch.env = std::move(env);
  // The rank must not read the connection: its end is the guard's signal.
  launch.stdin_fd = dev_null.valid() ? dev_null.get() : STDIN_FILENO;
  launch.stdout_fd = STDOUT_FILENO;
  launch.stderr_fd = STDERR_FILENO;
  launch.inherited_fd = secret_fd_->fd();
  if (request_.bind_to_core) {
    // Note [Binding]: the share of this host's CPUs, from the placement.
    int local_rank = 0, local_size = 1;
    const char* r = getenv("KOLO_LOCAL_RANK");
    const char* n = getenv("KOLO_LOCAL_SIZE");
    if (r && n && absl::SimpleAtoi(r, &local_rank) &&
        absl::SimpleAtoi(n, &local_size)) {
      launch.cpus = CpuShare(AllowedCpus(), local_rank, local_size);
    }
  }
  const SpawnResult spawned = SpawnWorker(launch, *signals_);
  dev_null.reset();  // The rank has its copy.
  pid_ = spawned.pid;
  if (!spawned.status.ok()) {
    Say(std::string(spawned.status.message()));
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
    return Finish(127 << 8);
  }
  worker_running_ = true;

  for (;;) {
    if (!worker_running_) {
      Reap();  // Orphans re-parented to us.
      if (!GroupAlive()) break;
      BeginTeardown();  // The rank left processes behind.
    }
    struct pollfd fds[2] = {{signals_->read_fd(), POLLIN, 0},
                            {STDIN_FILENO, POLLIN, 0}};
    const int ready =
        poll(fds, stdin_open_ ? 2 : 1, PollTimeoutMs(kill_deadline_));
    if (ready < 0 && errno != EINTR) {
      Say(absl::StrCat("poll: ", ErrnoText(errno)));
      BeginTeardown();
    }
    if (ready > 0 && stdin_open_ && fds[1].revents) {
      char buffer[4096];
      const ssize_t n = read(STDIN_FILENO, buffer, sizeof(buffer));
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        // kolorun closed the connection, or died, or ssh did.
        stdin_open_ = false;
        BeginTeardown();
      }
    }
    if (ready > 0 && fds[0].revents) {
      for (int signo : signals_->Drain()) {
        if (signo == SIGCHLD) {
          Reap();
        } else {
          BeginTeardown();
        }
      }
    }
    if (tearing_down_ && !killed_ && absl::Now() >= kill_deadline_) {
      killed_ = true;
      killpg(pid_, SIGKILL);
      kill_deadline_ = absl::InfiniteFuture();
    }
  }
  return Finish(wait_status_);
}

}  // namespace
}  // namespace kolorun
}  // namespace kolo

int main(int argc, char** argv) {
  int rank = -1;
  int i = 1;
  if (i + 1 < argc && std::string(argv[i]) == "--rank" &&
      absl::SimpleAtoi(argv[i + 1], &rank) && rank >= 0) {
    i += 2;
  }
  if (rank < 0 || i >= argc || std::string(argv[i]) != "--" || i + 1 >= argc) {
    std::fprintf(stderr,
                 "usage: kolo_rank_guard --rank R -- command [args...]\n"
                 "(started by kolorun over ssh, with its request on standard "
                 "input)\n");
    return 2;
  }
  kolo::kolorun::RankGuard guard(
      rank, std::vector<std::string>(argv + i + 1, argv + argc));
  return guard.Run();
}
