// Runs a command to completion with a harness deadline (a hang fails the
// test instead of blocking it), collecting stdout and stderr merged.
#ifndef KOLO_TESTS_TESTING_RUN_COMMAND_H_
#define KOLO_TESTS_TESTING_RUN_COMMAND_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace kolo {
namespace testing {

struct CommandResult {
  int exit_code = -1;  // -1: killed by the harness deadline
  std::string output;  // stdout and stderr, merged
};

// `args[0]` is a path.
inline CommandResult RunCommand(const std::vector<std::string>& args,
                                int deadline_s = 60) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  CommandResult result;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(deadline_s);
  char buf[4096];
  bool timed_out = false;
  while (true) {
    const int left = std::chrono::duration_cast<std::chrono::milliseconds>(
                         deadline - std::chrono::steady_clock::now())
                         .count();
    if (left <= 0) {
      timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n <= 0) break;
    result.output.append(buf, n);
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!timed_out && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (!timed_out && WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  return result;
}

}  // namespace testing
}  // namespace kolo

#endif  // KOLO_TESTS_TESTING_RUN_COMMAND_H_
