#include "tools/kolorun/process.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/os/errno_text.h"
#include "runtime/os/unique_fd.h"

namespace kolo {
namespace kolorun {
namespace {

// Marks every descriptor from 3 up close-on-exec. Async-signal-safe; `max_fd`
// is computed before fork for the fallback on kernels without close_range.
void CloseOnExecFrom3(int max_fd) {
  if (syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) == 0) return;
  for (int fd = 3; fd < max_fd; ++fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
}

int MaxFd() {
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
      limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < (1u << 20)) {
    return static_cast<int>(limit.rlim_cur);
  }
  return 1 << 20;
}

std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (const std::string& s : strings)
    pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

[[noreturn]] void ExecChild(const WorkerLaunch& launch,
                            const SignalPipe& signals, char* const* argv,
                            char* const* envp, const cpu_set_t* cpus,
                            pid_t parent, int max_fd, int status_fd) {
  signals.ResetInChild();
  sigset_t none;
  sigemptyset(&none);
  // Own process group first: from here on a teardown that signals the group
  // reaches this process, whatever it execs.
  setpgid(0, 0);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) {
    _exit(127);  // kolorun is already gone.
  }
  if (dup2(launch.stdin_fd, 0) < 0 || dup2(launch.stdout_fd, 1) < 0 ||
      dup2(launch.stderr_fd, 2) < 0) {
    const int error = errno;
    (void)!write(status_fd, &error, sizeof(error));
    _exit(127);
  }
  if (cpus) sched_setaffinity(0, sizeof(*cpus), cpus);
  CloseOnExecFrom3(max_fd);  // status_fd is close-on-exec already.
  if (launch.inherited_fd >= 0) fcntl(launch.inherited_fd, F_SETFD, 0);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execvpe(argv[0], argv, envp);
  const int error = errno;
  (void)!write(status_fd, &error, sizeof(error));
  _exit(127);
}

}  // namespace

SpawnResult SpawnWorker(const WorkerLaunch& launch, const SignalPipe& signals) {
  SpawnResult result;
  // Everything the child needs is built here: after fork it may only make
  // async-signal-safe calls (the store server's threads exist).
  std::vector<char*> argv = CStrings(launch.argv);
  std::vector<char*> envp = CStrings(launch.env);
  const int max_fd = MaxFd();
  const pid_t parent = getpid();
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : launch.cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &cpus);
  }
  const cpu_set_t* bind = CPU_COUNT(&cpus) > 0 ? &cpus : nullptr;

  // Exec errors come back on this pipe; exec itself closes the child's
  // write end (O_CLOEXEC), which the parent's read sees as EOF.
  absl::StatusOr<os::Pipe> status_pipe = os::MakePipe(O_CLOEXEC);
  if (!status_pipe.ok()) {
    result.status = absl::Status(
        status_pipe.status().code(),
        absl::StrCat("cannot create a pipe: ", status_pipe.status().message()));
    return result;
  }
  // No signal handler may run in the child before ResetInChild(): it would
  // write into kolorun's signal pipe.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t pid = fork();
  if (pid == 0) {
    ExecChild(launch, signals, argv.data(), envp.data(), bind, parent, max_fd,
              status_pipe->write_end.get());
  }
  const int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  status_pipe->write_end.reset();
  if (pid < 0) {
    result.status = absl::ResourceExhaustedError(
        absl::StrCat("fork failed: ", os::ErrnoText(fork_errno)));
    return result;
  }
  result.pid = pid;
  // Also here, so that the group exists before anyone signals it, whichever
  // of parent and child runs first (EACCES once the child has exec'ed).
  setpgid(pid, pid);

  int child_errno = 0;
  ssize_t n;
  do {
    n = read(status_pipe->read_end.get(), &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  if (n == sizeof(child_errno)) {
    result.status =
        absl::NotFoundError(absl::StrCat("cannot execute \"", launch.argv[0],
                                         "\": ", os::ErrnoText(child_errno)));
  }
  return result;
}

std::string SignalName(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  if (abbrev == nullptr) return absl::StrCat("signal ", signo);
  return absl::StrCat("SIG", abbrev);
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) {
    return absl::StrCat("exited with code ", WEXITSTATUS(wait_status));
  }
  if (WIFSIGNALED(wait_status)) {
    return absl::StrCat("was killed by signal ",
                        SignalName(WTERMSIG(wait_status)),
                        WCOREDUMP(wait_status) ? " (core dumped)" : "");
  }
  return absl::StrCat("ended with wait status ", wait_status);
}

namespace {

// The first CPU of a cpulist file ("0,32", "0-1"): the core's name.
int FirstCpuOf(const std::string& path, int fallback) {
  std::ifstream in(path);
  int first = -1;
  if (!(in >> first) || first < 0) return fallback;
  return first;
}

}  // namespace

std::vector<Cpu> AllowedCpus() {
  std::vector<Cpu> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string topology =
        absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/");
    // core_cpus_list is the newer name of thread_siblings_list.
    int core = FirstCpuOf(topology + "core_cpus_list", -1);
    if (core < 0) core = FirstCpuOf(topology + "thread_siblings_list", cpu);
    cpus.push_back({cpu, core});
  }
  return cpus;
}

std::vector<int> CpuIds(const std::vector<Cpu>& cpus) {
  std::vector<int> ids;
  ids.reserve(cpus.size());
  for (const Cpu& c : cpus) ids.push_back(c.id);
  return ids;
}

std::vector<int> CpuShare(const std::vector<Cpu>& allowed, int local_rank,
                          int local_size) {
  const int n = static_cast<int>(allowed.size());
  if (local_size <= 1 || local_size > n || local_rank < 0 ||
      local_rank >= local_size) {
    return {};
  }
  // Cores in the order of their lowest allowed CPU, with their CPUs.
  std::vector<int> order;
  std::map<int, std::vector<int>> threads;
  for (const Cpu& c : allowed) {
    auto [it, added] = threads.try_emplace(c.core);
    if (added) order.push_back(c.core);
    it->second.push_back(c.id);
  }
  auto cut = [&](int count) {
    return std::make_pair(
        static_cast<int64_t>(count) * local_rank / local_size,
        static_cast<int64_t>(count) * (local_rank + 1) / local_size);
  };
  std::vector<int> share;
  if (static_cast<int>(order.size()) >= local_size) {
    const auto [begin, end] = cut(static_cast<int>(order.size()));
    for (int64_t k = begin; k < end; ++k) {
      const std::vector<int>& ids = threads[order[k]];
      share.insert(share.end(), ids.begin(), ids.end());
    }
  } else {
    const auto [begin, end] = cut(n);
    for (int64_t k = begin; k < end; ++k) share.push_back(allowed[k].id);
  }
  std::sort(share.begin(), share.end());
  return share;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::vector<std::string> ranges;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    ranges.push_back(j == i ? absl::StrCat(cpus[i])
                            : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(ranges, ",");
}

void SignalWorker(pid_t pid, bool running, int signo) {
  if (pid <= 0) return;
  killpg(pid, signo);
  if (running && getpgid(pid) != pid) kill(pid, signo);
}

}  // namespace kolorun
}  // namespace kolo
