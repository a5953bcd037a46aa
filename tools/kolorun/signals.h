// Self-pipe delivery of the signals kolorun reacts to, so that one poll()
// loop sees child exits, SIGINT and SIGTERM next to worker output.
//
// Process-wide by nature (signal dispositions are): at most one SignalPipe
// may exist at a time. Install() and the destructor run on the main thread;
// the handler itself may run on any thread and only write()s one byte.
#ifndef KOLO_TOOLS_KOLORUN_SIGNALS_H_
#define KOLO_TOOLS_KOLORUN_SIGNALS_H_

#include <csignal>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/os/unique_fd.h"

namespace kolo {
namespace kolorun {

class SignalPipe {
 public:
  // Routes SIGCHLD, SIGINT, SIGTERM, SIGHUP and SIGQUIT to the pipe and
  // ignores SIGPIPE (a closed stdout must not kill kolorun before it has
  // torn the workers down).
  static absl::StatusOr<std::unique_ptr<SignalPipe>> Install();
  // Restores the previous dispositions and closes the pipe.
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  // Readable (poll POLLIN) while signals are pending.
  int read_fd() const { return pipe_.read_end.get(); }
  // Non-blocking: the signals received since the last call, in order.
  std::vector<int> Drain();

  // In a forked child before exec: gives every signal this class touches the
  // disposition kolorun inherited (SIG_IGN stays ignored, as under nohup;
  // anything else becomes SIG_DFL). Async-signal-safe: allocates nothing.
  void ResetInChild() const;

 private:
  explicit SignalPipe(os::Pipe pipe) : pipe_(std::move(pipe)) {}
  static void Handler(int signo);

  const os::Pipe pipe_;
  std::vector<std::pair<int, struct sigaction>> previous_;
};

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_SIGNALS_H_
