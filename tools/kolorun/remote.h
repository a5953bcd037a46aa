// Starting a rank on another host: the ssh command line, and what kolorun
// and kolo_rank_guard say to each other.
//
// Note [Remote ranks]
// kolorun runs, for each remote rank,
//   ssh -o BatchMode=yes [-F config] [-p port] [-i key] -o ConnectTimeout=T
//       -T HOST exec GUARD --rank R -- COMMAND...
// where GUARD is kolo_rank_guard at the path it has next to kolorun (hosts
// share paths, as the worker command does). The command line carries no
// secret and no environment: ssh's standard input carries a GuardRequest
// (netstrings): the working directory, the environment to add, the job
// secret, the grace period, the CPU binding and a status token. kolorun
// keeps that pipe open for the life of the rank. The guard
//  1. puts the secret in a sealed memory file the rank inherits
//     (KOLO_SECRET_FD; Note [Secret without a file] in secret_fd.h);
//  2. starts the command in a new process group;
//  3. when its standard input closes (kolorun closed it to tear the job
//     down, or kolorun or the ssh connection died: ssh without a terminal
//     does not end the remote command by itself) or on SIGTERM/SIGINT/SIGHUP,
//     sends SIGTERM to the group and SIGKILL after the grace period;
//  4. once the group is empty, closes the secret's descriptor, writes one
//  status
//     line, "kolo_rank_guard[TOKEN] pid=P wait_status=S", to its stderr,
//     which kolorun reads (and does not print) to name how the rank ended;
//     then exits with the rank's exit code (128+n after signal n).
#ifndef KOLO_TOOLS_KOLORUN_REMOTE_H_
#define KOLO_TOOLS_KOLORUN_REMOTE_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tools/kolorun/args.h"

namespace kolo {
namespace kolorun {

// `arg` quoted for a POSIX shell (unchanged when it needs no quotes).
std::string ShellQuote(const std::string& arg);

// The ssh command (argv) that starts `rank` of `command` on `host` under the
// guard at `guard_path` (Note [Remote ranks]).
std::vector<std::string> SshCommand(const LaunchOptions& options,
                                    const std::string& host, int rank,
                                    const std::string& guard_path);

// What kolorun sends the guard on ssh's standard input.
struct GuardRequest {
  std::string cwd;               // chdir here before starting the command
  std::vector<std::string> env;  // "NAME=value", set over the guard's own
  std::string secret;            // the job secret
  std::string status_token;      // names the guard's status line
  absl::Duration grace_period = absl::Seconds(5);
  // --bind-to core: the guard binds the rank to its share of the host's
  // CPUs (Note [Binding] in process.h), from KOLO_LOCAL_RANK/KOLO_LOCAL_SIZE.
  bool bind_to_core = false;
};

std::string EncodeGuardRequest(const GuardRequest& request);

// Decodes a request from bytes as they arrive.
class GuardRequestDecoder {
 public:
  // Adds bytes. InvalidArgument on malformed or oversized input.
  absl::Status Feed(absl::string_view bytes);
  // True once the whole request has arrived; later bytes are ignored.
  bool done() const { return done_; }
  const GuardRequest& request() const { return request_; }

 private:
  absl::Status Record(absl::string_view record);

  std::string buffer_;
  bool started_ = false;
  bool done_ = false;
  GuardRequest request_;
};

// The status line prefix for `token`: "kolo_rank_guard[TOKEN]".
std::string GuardStatusMarker(const std::string& token);
// "kolo_rank_guard[TOKEN] pid=P wait_status=S\n".
std::string GuardStatusLine(const std::string& token, pid_t pid,
                            int wait_status);
// Parses what follows the marker (" pid=P wait_status=S").
bool ParseGuardStatus(absl::string_view rest, pid_t* pid, int* wait_status);

// Where kolo_rank_guard is: next to this kolorun executable.
std::string GuardPathNextToSelf();

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_REMOTE_H_
