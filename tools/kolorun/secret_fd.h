// The job secret in an anonymous, sealed memory file (memfd) that the
// workers inherit: KOLO_SECRET_FD names the descriptor, never the secret.
//
// Note [Secret without a file]
// Nothing is written to disk, so nothing is left behind however kolorun or a
// worker ends (kill -9 included): the memory goes with the last descriptor.
// A worker reads the secret with pread() at offset 0, as often as it likes
// (a second Runtime, an elastic generation); the runtime marks the
// descriptor close-on-exec once it has read it, so that the programs a
// worker starts do not inherit it. Like a 0600 file, the descriptor is
// readable only by processes that may ptrace the worker (through
// /proc/PID/fd). KOLO_SECRET_FILE and KOLO_SECRET stay for other launchers.
#ifndef KOLO_TOOLS_KOLORUN_SECRET_FD_H_
#define KOLO_TOOLS_KOLORUN_SECRET_FD_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "runtime/os/unique_fd.h"

namespace kolo {
namespace kolorun {

class SecretDescriptor {
 public:
  // A close-on-exec memfd holding `secret`, sealed against every change.
  static absl::StatusOr<std::unique_ptr<SecretDescriptor>> Create(
      const std::string& secret);
  ~SecretDescriptor() = default;  // Closes the descriptor.
  SecretDescriptor(const SecretDescriptor&) = delete;
  SecretDescriptor& operator=(const SecretDescriptor&) = delete;

  // The descriptor a worker inherits (SpawnWorker clears close-on-exec in
  // the child only).
  int fd() const { return fd_.get(); }

 private:
  explicit SecretDescriptor(os::UniqueFd fd) : fd_(std::move(fd)) {}
  const os::UniqueFd fd_;
};

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_SECRET_FD_H_
