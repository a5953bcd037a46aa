// Test harness for the real kolorun binary: runs it with pipes on its
// output, waits for events (its output, its exit) with a harness deadline,
// and gives each test a scratch directory and a private TMPDIR (where the
// secret file goes).
#ifndef KOLO_TESTS_TOOLS_KOLORUN_KOLORUN_HARNESS_H_
#define KOLO_TESTS_TOOLS_KOLORUN_KOLORUN_HARNESS_H_

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

extern char** environ;

namespace kolorun_testing {

inline constexpr absl::Duration kHarnessDeadline = absl::Seconds(60);

inline std::string Runfile(const std::string& path) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir && workspace)
    return absl::StrCat(srcdir, "/", workspace, "/", path);
  return path;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines =
      absl::StrSplit(text, '\n', absl::SkipEmpty());
  return lines;
}

inline bool ProcessExists(pid_t pid) {
  return kill(pid, 0) == 0 || errno != ESRCH;
}

inline int CountOf(const std::string& haystack, const std::string& needle) {
  int count = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + needle.size())) {
    ++count;
  }
  return count;
}

struct Result {
  int wait_status = -1;
  std::string out;
  std::string err;
  int exit_code() const {
    return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  }
};

// One kolorun process with its stdout and stderr on pipes.
class Kolorun {
 public:
  Kolorun(const std::vector<std::string>& args,
          const std::vector<std::string>& env) {
    int out[2], err[2];
    EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(pipe2(err, O_CLOEXEC), 0);
    std::vector<std::string> argv = {Runfile("tools/kolorun/kolorun")};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> c_argv, c_env;
    for (std::string& a : argv) c_argv.push_back(a.data());
    c_argv.push_back(nullptr);
    std::vector<std::string> env_copy = env;
    for (std::string& e : env_copy) c_env.push_back(e.data());
    c_env.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execve(c_argv[0], c_argv.data(), c_env.data());
      _exit(126);
    }
    close(out[1]);
    close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
    deadline_ = absl::Now() + kHarnessDeadline;
  }

  ~Kolorun() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (err_fd_ >= 0) close(err_fd_);
  }

  pid_t pid() const { return pid_; }

  // Reads output until `stream` (1 = stdout, 2 = stderr) holds `count`
  // occurrences of `needle`. False at EOF or at the harness deadline.
  bool WaitFor(int stream, const std::string& needle, int count = 1) {
    for (;;) {
      const std::string& text = stream == 1 ? out_ : err_;
      if (CountOf(text, needle) >= count) return true;
      if (!ReadSome()) return false;
    }
  }

  // What kolorun has printed so far (exit status not set).
  Result Snapshot() const {
    Result result;
    result.out = out_;
    result.err = err_;
    return result;
  }

  // Reads both streams to EOF and reaps kolorun.
  Result Wait() {
    while (ReadSome()) {
    }
    Result result;
    if (out_fd_ >= 0 || err_fd_ >= 0) {
      ADD_FAILURE() << "kolorun did not exit within the harness deadline\n"
                    << "stdout:\n"
                    << out_ << "stderr:\n"
                    << err_;
      kill(pid_, SIGKILL);
    }
    waitpid(pid_, &result.wait_status, 0);
    reaped_ = true;
    result.out = out_;
    result.err = err_;
    return result;
  }

 private:
  // One poll round; false once both streams are at EOF or the deadline
  // passed.
  bool ReadSome() {
    struct pollfd fds[2];
    int* owners[2];
    std::string* sinks[2];
    nfds_t n = 0;
    if (out_fd_ >= 0) {
      fds[n] = {out_fd_, POLLIN, 0};
      owners[n] = &out_fd_;
      sinks[n++] = &out_;
    }
    if (err_fd_ >= 0) {
      fds[n] = {err_fd_, POLLIN, 0};
      owners[n] = &err_fd_;
      sinks[n++] = &err_;
    }
    if (n == 0) return false;
    const absl::Duration left = deadline_ - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    const int ready = poll(fds, n, absl::ToInt64Milliseconds(left) + 1);
    if (ready < 0 && errno == EINTR) return true;
    if (ready <= 0) return ready == 0 ? absl::Now() < deadline_ : false;
    for (nfds_t i = 0; i < n; ++i) {
      if (!fds[i].revents) continue;
      char buffer[4096];
      const ssize_t got = read(fds[i].fd, buffer, sizeof(buffer));
      if (got > 0) {
        sinks[i]->append(buffer, got);
      } else if (got == 0 || errno != EINTR) {
        close(*owners[i]);
        *owners[i] = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool reaped_ = false;
  std::string out_;
  std::string err_;
  absl::Time deadline_;
};

class KolorunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Processes kolorun leaves behind (or orphans after kill -9) come back to
    // this process, so that the tests can see and reap them.
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    const char* tmp = getenv("TEST_TMPDIR");
    std::string templ =
        absl::StrCat(tmp ? tmp : "/tmp", "/kolorun_test.XXXXXX");
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    scratch_ = templ;
    secret_dir_ = scratch_ + "/tmp";
    ASSERT_EQ(mkdir(secret_dir_.c_str(), 0700), 0);
  }

  // The test's environment without KOLO_* and OMP_NUM_THREADS, with TMPDIR
  // (where the secret file goes), SCRATCH and SET_READY for the workers;
  // `extra` entries replace inherited ones of the same name.
  std::vector<std::string> Environment(
      const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('=') + 1);
      const bool replaced = std::any_of(
          extra.begin(), extra.end(),
          [&](const std::string& x) { return absl::StartsWith(x, name); });
      if (replaced || absl::StartsWith(entry, "KOLO_") ||
          absl::StartsWith(entry, "OMP_NUM_THREADS=") ||
          absl::StartsWith(entry, "TMPDIR=")) {
        continue;
      }
      env.push_back(entry);
    }
    env.push_back("TMPDIR=" + secret_dir_);
    env.push_back("SCRATCH=" + scratch_);
    env.push_back("SET_READY=" + Runfile("tests/tools/kolorun/set_ready"));
    env.insert(env.end(), extra.begin(), extra.end());
    return env;
  }

  Result Run(const std::vector<std::string>& args,
             const std::vector<std::string>& extra_env = {}) {
    Kolorun kolorun(args, Environment(extra_env));
    return kolorun.Wait();
  }

  // Pid written by a worker into $SCRATCH/<name>.
  pid_t PidFromFile(const std::string& name) const {
    int pid = 0;
    const std::string text = ReadFile(scratch_ + "/" + name);
    EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &pid))
        << name << ": \"" << text << "\"";
    return pid;
  }

  void ExpectGone(const std::vector<std::string>& pid_files) const {
    for (const std::string& name : pid_files) {
      const pid_t pid = PidFromFile(name);
      ASSERT_GT(pid, 0) << name;
      EXPECT_FALSE(ProcessExists(pid))
          << name << ": pid " << pid << " is still alive";
    }
  }

  std::vector<std::string> SecretDirEntries() const {
    std::vector<std::string> names;
    DIR* dir = opendir(secret_dir_.c_str());
    if (!dir) return names;
    while (struct dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(dir);
    return names;
  }

  std::string scratch_;
  std::string secret_dir_;
};

inline int Cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

}  // namespace kolorun_testing

#endif  // KOLO_TESTS_TOOLS_KOLORUN_KOLORUN_HARNESS_H_
