// Command line of kolorun: `kolorun [options] [--] command args...`.
//
// Parsed by hand (CLI11 rejects the conventional `-np`). kolorun's own options
// end at the first positional argument or at `--`; everything after belongs
// to the worker command, including arguments that look like options. The
// flags follow horovodrun's where it has them.
#ifndef KOLO_TOOLS_KOLORUN_ARGS_H_
#define KOLO_TOOLS_KOLORUN_ARGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/kolorun/hosts.h"

namespace kolo {
namespace kolorun {

// One -x option: forward NAME with kolorun's own value, or set NAME=value.
struct ForwardedVariable {
  std::string name;
  bool has_value = false;
  std::string value;
};

struct LaunchOptions {
  // -np N / --num-proc N (required): number of workers, >= 1.
  int num_proc = 0;
  // -H / --hosts "host1:2,host2:2" (parsed), or read from `hostfile` by
  // LoadHostfile(). Empty: every worker on this machine.
  std::vector<HostSlots> hosts;
  // --hostfile FILE: lines "host slots=N". Exclusive with -H.
  std::string hostfile;
  // -p / --ssh-port PORT (0: ssh's own default).
  int ssh_port = 0;
  // -i / --ssh-identity-file FILE, passed to ssh as -i.
  std::string ssh_identity_file;
  // --ssh-config FILE, passed to ssh as -F.
  std::string ssh_config;
  // --network-interface NAME: the store listens on this interface's IPv4
  // address and workers get KOLO_IFACE=NAME. Default: loopback for a job on
  // this machine only, else the address that routes to the first remote host.
  std::string network_interface;
  // -x NAME or -x NAME=value (repeatable): environment for every worker.
  std::vector<ForwardedVariable> forwarded;
  // --output-filename DIR: also write each rank's output to DIR/rank.<N>.log.
  std::string output_dir;
  // --prefix-timestamp: prefix each output line with the time kolorun got it.
  bool prefix_timestamp = false;
  // --tag-output (default) / --no-tag-output: the "[rank] " prefix.
  bool tag_output = true;
  // --output-ranks LIST ("0", "0,2-3"): print only these ranks' output
  // (empty: every rank). --output-filename files still get every rank's.
  std::vector<int> output_ranks;
  // Whether rank `rank`'s output goes to kolorun's stdout/stderr.
  bool ShowsRank(int rank) const;
  // --log-level LEVEL: exported to the workers as KOLO_LOG_LEVEL.
  std::string log_level;
  // --start-timeout SECONDS: how long every rank has to set its
  // `kolo/ready/<rank>` key before the job is torn down. Also exported to the
  // workers as KOLO_START_TIMEOUT unless that is set already.
  absl::Duration start_timeout = absl::Seconds(60);
  // --grace-period SECONDS: time between SIGTERM and SIGKILL at teardown.
  absl::Duration grace_period = absl::Seconds(5);
  // --bind-to core|none: each worker on its own share of the host's CPUs
  // (Note [Binding] in process.h), or placement left to the kernel.
  bool bind_to_core = true;
  // --- Elastic mode (docs/elastic.md): on when --min-np, --max-np or
  // --host-discovery-script is given. -np is then the size to start with.
  bool elastic = false;
  // --min-np N: the fewest workers the job trains with (default: -np).
  int min_np = 0;
  // --max-np N: the most (default: -np without a discovery script, else no
  // limit but the hosts' slots).
  int max_np = 0;
  // --host-discovery-script PATH: prints the hosts available now, one
  // "host" or "host:slots" per line; run at start and every
  // discovery_interval. Exclusive with -H and --hostfile.
  std::string host_discovery_script;
  // --slots-per-host N: slots of a discovered host printed without ":slots"
  // (default 1).
  int slots_per_host = 1;
  // --elastic-timeout SECONDS: how long the job waits for --min-np workers
  // (at start and after losing some) before it fails (default 600).
  absl::Duration elastic_timeout = absl::Seconds(600);
  // --reset-limit N: how many times the job may re-form (a new generation)
  // before it fails; -1 (the default): no limit.
  int reset_limit = -1;
  // --blacklist-cooldown SECONDS: a host with kBlacklistFailures failures
  // gets no new workers for this long (default 60; 0: for good).
  absl::Duration blacklist_cooldown = absl::Seconds(60);
  // --discovery-interval SECONDS: how often the script runs (default 1).
  absl::Duration discovery_interval = absl::Seconds(1);

  // --verbose: print the command, the placement and the store address.
  bool verbose = false;
  // -h / --help: print Usage() and exit 0; nothing else is checked.
  bool help = false;
  // The worker command and its arguments (non-empty unless `help`).
  std::vector<std::string> command;
};

// Parses the arguments after argv[0]. InvalidArgument with a message fit for
// the user on unknown options, a missing or invalid -np, malformed host
// lists, bad -x names, bad durations or ports, or a missing command. Touches
// no file (see LoadHostfile).
absl::StatusOr<LaunchOptions> ParseArgs(const std::vector<std::string>& args);

// Reads options->hostfile (if set) into options->hosts, and checks that the
// files named by --ssh-config and -i exist. InvalidArgument naming the file.
absl::Status LoadFiles(LaunchOptions* options);

// The --help text, listing every option with its default.
std::string Usage();

// "60", "0.5": seconds as a user would type them.
std::string FormatSeconds(absl::Duration d);

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_ARGS_H_
