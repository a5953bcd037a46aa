// JobGuard: a small process that ends everything kolorun started if kolorun
// itself dies without tearing the job down.
//
// Note [Job guard]
// Local workers die with kolorun (PR_SET_PDEATHSIG), but processes they
// started do not: when kolorun is killed (kill -9, a crash, the OOM killer)
// a worker's children are re-parented and live on. So before anything else
// starts, kolorun forks a guard that holds the read end of a pipe. kolorun
// tells it the process group of each worker as it starts it (every worker
// leads a group of its own, which its children share unless they leave it)
// and, once every group is empty, that the job ended. When the pipe closes
// without that word, kolorun is gone: the guard sends SIGKILL to every
// group it was told about and exits. The guard sits in a process group of
// its own (a Ctrl-C meant for kolorun does not reach it), ignores the
// terminating signals and holds no descriptor but its pipe, so kolorun's
// output reaches EOF when kolorun ends.
//
// Thread safety: Start() must be called while the process has one thread
// (the child runs code that is not async-signal-safe); Watch/Release from
// one thread.
#ifndef KOLO_TOOLS_KOLORUN_JOB_GUARD_H_
#define KOLO_TOOLS_KOLORUN_JOB_GUARD_H_

#include <sys/types.h>

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "runtime/os/unique_fd.h"

namespace kolo {
namespace kolorun {

class JobGuard {
 public:
  static absl::StatusOr<std::unique_ptr<JobGuard>> Start();
  // Release()s.
  ~JobGuard();
  JobGuard(const JobGuard&) = delete;
  JobGuard& operator=(const JobGuard&) = delete;

  // Adds a worker's process group to the ones the guard kills.
  void Watch(pid_t process_group);
  // The job ended normally: the guard exits without killing anything, and
  // is reaped here.
  void Release();
  pid_t pid() const { return pid_; }

 private:
  JobGuard(pid_t pid, os::UniqueFd fd) : pid_(pid), fd_(std::move(fd)) {}
  const pid_t pid_;
  os::UniqueFd fd_;  // the write end of the guard's pipe; closed at Release()
};

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_JOB_GUARD_H_
