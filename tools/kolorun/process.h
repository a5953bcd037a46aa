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

// The descriptors are borrowed: the caller owns them and closes its copies
// once SpawnWorker returns.
struct WorkerLaunch {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH (execvpe).
  std::vector<std::string> env;   // "NAME=value", the complete environment.
  int stdin_fd = -1;              // dup2'ed onto 0, 1 and 2 in the child.
  int stdout_fd = -1;
  int stderr_fd = -1;
  // CPUs the worker (every thread it starts) may run on; empty: those of
  // the launcher (Note [Binding]).
  std::vector<int> cpus;
  // A descriptor the worker inherits across exec (the job secret: Note
  // [Secret without a file] in secret_fd.h); -1: none.
  int inherited_fd = -1;
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
// (`signals`), an empty signal mask, no file descriptors but 0, 1, 2 and
// `launch.inherited_fd`, and the CPU affinity `launch.cpus` (when the kernel
// refuses it, the worker runs unbound: binding is for speed only). Returns once
// the child has exec'ed or failed to: exec errors come back through a
// close-on-exec pipe.
SpawnResult SpawnWorker(const WorkerLaunch& launch, const SignalPipe& signals);

// Sends `signo` to the worker's process group (`pid` leads it), and to the
// worker itself should it have left the group (setsid/setpgid in the
// worker; `running`: it has not been reaped). Nothing for pid <= 0.
void SignalWorker(pid_t pid, bool running, int signo);

// Note [Binding]
// With --bind-to core (the default, as mpirun's for small jobs), each worker
// on a host runs on its own share of the CPUs that kolorun (or, on a remote
// host, kolo_rank_guard) may use. The unit is the core, not the CPU number:
// the allowed cores (in the order of their lowest CPU) are cut into
// local-size contiguous blocks of equal size (+-1), block i for local rank
// i, and a rank gets every allowed hardware thread of its cores (on a
// machine that numbers the second threads of all cores after the first
// ones, cutting CPU numbers would hand two ranks the two threads of the
// same cores). With fewer cores than ranks but enough CPUs, the CPUs are cut
// the same way. A rank's threads (its training loop, kolo's background
// thread, its OpenMP pool, sized to the same share) then never compete with
// another rank's, and a thread that yields while it polls hands its core to
// its own rank's other thread. When a host runs more ranks than it has CPUs
// nothing is bound. --bind-to none leaves placement to the kernel.

// One CPU this process may run on, and its core: CPUs with the same `core`
// are hardware threads of one core.
struct Cpu {
  int id = 0;
  int core = 0;
};

// The CPUs this process may run on, ascending, with their cores (from
// /sys/devices/system/cpu/cpuN/topology; a CPU whose topology cannot be
// read counts as a core of its own).
std::vector<Cpu> AllowedCpus();
std::vector<int> CpuIds(const std::vector<Cpu>& cpus);
// Local rank `local_rank`'s share of `allowed` among `local_size` ranks,
// ascending; empty when local_size is 1 or exceeds the CPUs (nothing to
// bind).
std::vector<int> CpuShare(const std::vector<Cpu>& allowed, int local_rank,
                          int local_size);
// "0-3,8,10-11" (the kernel's cpulist format).
std::string FormatCpuList(const std::vector<int>& cpus);

// "exited with code 3", "was killed by signal SIGKILL".
std::string DescribeWaitStatus(int wait_status);
// "SIGKILL" (or "signal 77" when the number has no name).
std::string SignalName(int signo);

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_PROCESS_H_
