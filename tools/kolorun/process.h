// Starting one worker process and describing how it ended.
#ifndef KOLO_TOOLS_KOLORUN_PROCESS_H_
#define KOLO_TOOLS_KOLORUN_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/kolorun/signals.h"

namespace kolo {
namespace kolorun {

struct WorkerLaunch {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH (execvpe).
  std::vector<std::string> env;   // "NAME=value", the complete environment.
  int stdin_fd = -1;              // dup2'ed onto 0, 1 and 2 in the child.
  int stdout_fd = -1;
  int stderr_fd = -1;
};

struct SpawnResult {
  // > 0 once fork succeeded, even when exec then failed (the child exits
  // 127 and must still be reaped).
  pid_t pid = -1;
  // Fork or exec failure, naming the command.
  absl::Status status;
};

// Forks and execs one worker. In the child, before exec: its own process
// group (setpgid(0, 0), so that teardown can signal it with everything it
// started), PR_SET_PDEATHSIG = SIGKILL plus a getppid() check (the worker
// dies with kolorun, even under kill -9), the inherited signal dispositions
// (`signals`), an empty signal mask and no file descriptors but 0, 1 and 2.
// Returns once the child has exec'ed or failed to: exec errors come back
// through a close-on-exec pipe.
SpawnResult SpawnWorker(const WorkerLaunch& launch, const SignalPipe& signals);

// "exited with code 3", "was killed by signal SIGKILL".
std::string DescribeWaitStatus(int wait_status);
// "SIGKILL" (or "signal 77" when the number has no name).
std::string SignalName(int signo);

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_PROCESS_H_
