// A job under test: kolorun started by the harness, its merged output read
// as it comes, and checks that nothing of the job is left behind. Every wait
// has a deadline, so a hang fails the test instead of blocking it.
#ifndef KOLO_TESTS_RELIABILITY_JOB_H_
#define KOLO_TESTS_RELIABILITY_JOB_H_

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace kolo {
namespace testing {

inline int64_t NowNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

inline double Seconds(int64_t ns) { return ns / 1e9; }

// How the job's first process starts, beyond its arguments.
struct JobOptions {
  // A cgroup's cgroup.procs: the process joins it before exec, so that
  // everything it starts is in it too.
  std::string cgroup_procs;
  // The soft RLIMIT_NOFILE the process starts with (0 = ours).
  rlim_t open_files = 0;
};

class Job {
 public:
  // Starts `args` (args[0] a path) with `env` ("NAME=value") added to ours.
  static std::unique_ptr<Job> Start(const std::vector<std::string>& args,
                                    const std::vector<std::string>& env = {},
                                    const JobOptions& options = JobOptions()) {
    auto job = std::unique_ptr<Job>(new Job());
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return nullptr;
    job->start_ns_ = NowNs();
    job->pid_ = fork();
    if (job->pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      if (!options.cgroup_procs.empty()) {
        int cg = open(options.cgroup_procs.c_str(), O_WRONLY | O_CLOEXEC);
        char digits[16];
        int len = 0;
        for (pid_t p = getpid(); p > 0; p /= 10) digits[len++] = '0' + p % 10;
        char text[16];
        for (int i = 0; i < len; ++i) text[i] = digits[len - 1 - i];
        if (cg < 0 || write(cg, text, len) != len) _exit(126);
        close(cg);
      }
      if (options.open_files > 0) {
        struct rlimit limit;
        getrlimit(RLIMIT_NOFILE, &limit);
        limit.rlim_cur = options.open_files;
        setrlimit(RLIMIT_NOFILE, &limit);
      }
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    job->fd_ = fds[0];
    return job;
  }

  ~Job() {
    if (exit_code_ == kRunning) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }

  pid_t pid() const { return pid_; }
  int64_t start_ns() const { return start_ns_; }
  const std::string& output() const { return output_; }

  // Reads until some line matches `pattern` (searched from `from`, a byte
  // offset into the output); fills `match` and returns the arrival time, or
  // 0 at the deadline or EOF.
  int64_t WaitFor(const std::string& pattern, double timeout_s,
                  std::smatch* match = nullptr, size_t from = 0) {
    const std::regex re(pattern);
    const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_s * 1e9);
    while (true) {
      std::smatch m;
      if (from < output_.size() &&
          std::regex_search(output_.cbegin() + from, output_.cend(), m, re)) {
        if (match) *match = m;
        return NowNs();
      }
      if (!ReadSome(deadline)) return 0;
    }
  }

  // Waits for kolorun to exit; its exit code, or -1 if the deadline passed
  // (it is then killed).
  int Wait(double timeout_s) {
    const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_s * 1e9);
    while (ReadSome(deadline)) {
    }
    if (exit_code_ != kRunning) return exit_code_;
    // The pipe is closed; kolorun exits right after. Bounded by a pidfd.
    int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      int left = static_cast<int>((deadline - NowNs()) / 1000000);
      poll(&p, 1, left > 0 ? left : 0);
      close(pidfd);
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      exit_code_ = -1;
      return -1;
    }
    exit_ns_ = NowNs();
    exit_code_ =
        WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return exit_code_;
  }
  int64_t exit_ns() const { return exit_ns_; }

 private:
  static constexpr int kRunning = -1000;
  Job() = default;

  // Reads one chunk; false at EOF or deadline.
  bool ReadSome(int64_t deadline) {
    int left = static_cast<int>((deadline - NowNs()) / 1000000);
    if (left <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) return false;
    char buf[8192];
    ssize_t n = read(fd_, buf, sizeof(buf));
    if (n <= 0) return false;
    output_.append(buf, n);
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  int64_t start_ns_ = 0;
  int64_t exit_ns_ = 0;
  int exit_code_ = kRunning;
  std::string output_;
};

// Waits until `pid` (any process) has exited, up to `timeout_s`; true if it
// has.
inline bool WaitForExit(pid_t pid, double timeout_s) {
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return kill(pid, 0) != 0;  // already gone
  pollfd p{pidfd, POLLIN, 0};
  const int ready = poll(&p, 1, static_cast<int>(timeout_s * 1000));
  close(pidfd);
  return ready > 0;
}

inline std::map<int, pid_t> WorkerPids(const std::string& dir, int np) {
  std::map<int, pid_t> pids;
  for (int r = 0; r < np; ++r) {
    std::ifstream in(dir + "/" + std::to_string(r));
    pid_t pid = 0;
    if (in >> pid) pids[r] = pid;
  }
  return pids;
}

// Listening TCP sockets on this machine, "addr:port" in /proc/net/tcp's hex.
inline std::set<std::string> ListeningSockets() {
  std::set<std::string> out;
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      if (state == "0A") out.insert(local);
    }
  }
  return out;
}

// Listening TCP sockets ("addr:port" as in ListeningSockets) held by a
// process in one of the process groups `groups` (the job's: kolorun's and
// each worker's). Other jobs on the machine do not count.
inline std::set<std::string> ListeningSocketsOf(const std::set<pid_t>& groups) {
  std::map<std::string, std::string> by_inode;  // inode -> addr:port
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmit, uid,
          timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >>
          retransmit >> uid >> timeout >> inode;
      if (state == "0A") by_inode[inode] = local;
    }
  }
  std::set<std::string> out;
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (pid <= 0) continue;
    const pid_t group = getpgid(pid);
    if (group < 0 || !groups.count(group)) continue;
    const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
    DIR* fds = opendir(fd_dir.c_str());
    if (!fds) continue;
    while (dirent* fd = readdir(fds)) {
      char target[64] = {};
      const std::string link = fd_dir + "/" + fd->d_name;
      if (readlink(link.c_str(), target, sizeof(target) - 1) <= 0) continue;
      const std::string t = target;
      if (t.rfind("socket:[", 0) != 0) continue;
      auto it = by_inode.find(t.substr(8, t.size() - 9));
      if (it != by_inode.end()) out.insert(it->second);
    }
    closedir(fds);
  }
  closedir(proc);
  return out;
}

inline std::set<std::string> ShmEntries() {
  std::set<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) out.insert(e->d_name);
    closedir(d);
  }
  return out;
}

// Resident memory of a process in kB (0 if gone).
inline long RssKb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  long value = 0;
  while (in >> key) {
    if (key == "VmRSS:") {
      in >> value;
      return value;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return 0;
}

}  // namespace testing
}  // namespace kolo

#endif  // KOLO_TESTS_RELIABILITY_JOB_H_
