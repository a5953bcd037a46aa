// Command line of kolorun: `kolorun [options] [--] command args...`.
//
// Parsed by hand (CLI11 rejects the conventional `-np`). kolorun's own options
// end at the first positional argument or at `--`; everything after belongs
// to the worker command, including arguments that look like options.
#ifndef KOLO_TOOLS_KOLORUN_ARGS_H_
#define KOLO_TOOLS_KOLORUN_ARGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kolo {
namespace kolorun {

struct LaunchOptions {
  // -np N / --num-proc N (required): number of local workers, >= 1.
  int num_proc = 0;
  // --start-timeout SECONDS: how long every rank has to set its
  // `kolo/ready/<rank>` key before the job is torn down. Also exported to the
  // workers as KOLO_START_TIMEOUT unless that is set already.
  absl::Duration start_timeout = absl::Seconds(60);
  // --grace-period SECONDS: time between SIGTERM and SIGKILL at teardown.
  absl::Duration grace_period = absl::Seconds(5);
  // --verbose: print the command, N and the store port to stderr.
  bool verbose = false;
  // -h / --help: print Usage() and exit 0; nothing else is checked.
  bool help = false;
  // The worker command and its arguments (non-empty unless `help`).
  std::vector<std::string> command;
};

// Parses the arguments after argv[0]. InvalidArgument with a message fit for
// the user on unknown options, a missing or invalid -np, bad durations or a
// missing command.
absl::StatusOr<LaunchOptions> ParseArgs(const std::vector<std::string>& args);

// The --help text, listing every option with its default.
std::string Usage();

// "60", "0.5": seconds as a user would type them.
std::string FormatSeconds(absl::Duration d);

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_ARGS_H_
