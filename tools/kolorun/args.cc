#include "tools/kolorun/args.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "runtime/os/errno_text.h"

namespace kolo {
namespace kolorun {
namespace {

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

absl::Status ParsePositive(absl::string_view flag, absl::string_view value,
                           int max_value, int* out) {
  int n;
  if (!absl::SimpleAtoi(value, &n) || n < 1 || n > max_value) {
    return Invalid(absl::StrCat(
        flag, " expects a positive integer",
        max_value < (1 << 30) ? absl::StrCat(" up to ", max_value) : "",
        ", got \"", value, "\""));
  }
  *out = n;
  return absl::OkStatus();
}

absl::Status ParseSeconds(absl::string_view flag, absl::string_view value,
                          bool allow_zero, absl::Duration* out) {
  double seconds;
  if (!absl::SimpleAtod(value, &seconds) || !std::isfinite(seconds) ||
      seconds < 0 || (!allow_zero && seconds == 0) || seconds > 1e9) {
    return Invalid(absl::StrCat(flag, " expects ",
                                allow_zero ? "a non-negative" : "a positive",
                                " number of seconds, got \"", value, "\""));
  }
  *out = absl::Seconds(seconds);
  return absl::OkStatus();
}

absl::Status ParseNonEmpty(absl::string_view flag, absl::string_view value,
                           std::string* out) {
  if (value.empty()) return Invalid(absl::StrCat(flag, " needs a value"));
  *out = std::string(value);
  return absl::OkStatus();
}

// Variables whose values kolorun itself gives each worker.
bool IsJobVariable(absl::string_view name) {
  static const std::set<absl::string_view> kJob = {"KOLO_RANK",
                                                   "KOLO_SIZE",
                                                   "KOLO_LOCAL_RANK",
                                                   "KOLO_LOCAL_SIZE",
                                                   "KOLO_CROSS_RANK",
                                                   "KOLO_CROSS_SIZE",
                                                   "KOLO_RENDEZVOUS_ADDR",
                                                   "KOLO_RENDEZVOUS_PORT",
                                                   "KOLO_SECRET_FILE",
                                                   "KOLO_SECRET_FD",
                                                   "KOLO_SECRET",
                                                   "KOLO_LAUNCHER",
                                                   "KOLO_ELASTIC_ID",
                                                   "KOLO_ELASTIC_GENERATION",
                                                   "KOLO_ELASTIC_TIMEOUT",
                                                   "HOROVOD_RANK",
                                                   "HOROVOD_SIZE",
                                                   "HOROVOD_LOCAL_RANK",
                                                   "HOROVOD_LOCAL_SIZE",
                                                   "HOROVOD_CROSS_RANK",
                                                   "HOROVOD_CROSS_SIZE",
                                                   "RANK",
                                                   "WORLD_SIZE",
                                                   "LOCAL_RANK",
                                                   "LOCAL_WORLD_SIZE",
                                                   "GROUP_RANK"};
  return kJob.count(name) > 0;
}

absl::Status ParseForwarded(absl::string_view value,
                            std::vector<ForwardedVariable>* out) {
  ForwardedVariable variable;
  const size_t eq = value.find('=');
  variable.name = std::string(value.substr(0, eq));
  if (eq != absl::string_view::npos) {
    variable.has_value = true;
    variable.value = std::string(value.substr(eq + 1));
  }
  const std::string& name = variable.name;
  const bool valid = !name.empty() && !absl::ascii_isdigit(name[0]) &&
                     std::all_of(name.begin(), name.end(), [](char c) {
                       return absl::ascii_isalnum(c) || c == '_';
                     });
  if (!valid) {
    return Invalid(
        absl::StrCat("-x expects NAME or NAME=value with a "
                     "variable name of letters, digits and '_', "
                     "got \"",
                     value, "\""));
  }
  if (IsJobVariable(name)) {
    return Invalid(absl::StrCat(
        "-x ", name, ": kolorun sets ", name,
        " itself (the job secret travels only in a private descriptor)"));
  }
  if (!variable.has_value && getenv(name.c_str()) == nullptr) {
    return Invalid(absl::StrCat("-x ", name, ": ", name,
                                " is not set in kolorun's environment (use -x ",
                                name, "=value)"));
  }
  out->push_back(std::move(variable));
  return absl::OkStatus();
}

absl::Status ParseLogLevel(absl::string_view value, std::string* out) {
  const std::string lower = absl::AsciiStrToLower(value);
  for (const char* level :
       {"trace", "debug", "info", "warning", "error", "fatal"}) {
    if (lower == level) {
      *out = lower;
      return absl::OkStatus();
    }
  }
  return Invalid(absl::StrCat(
      "--log-level expects trace, debug, info, warning, error or fatal, got \"",
      value, "\""));
}

// "0", "0,2-3": ranks, each >= 0, ranges inclusive; sorted, no duplicates.
absl::Status ParseRankList(absl::string_view flag, absl::string_view value,
                           std::vector<int>* out) {
  const auto invalid = [&] {
    return Invalid(
        absl::StrCat(flag, " expects ranks such as \"0\" or \"0,2-3\", got \"",
                     value, "\""));
  };
  std::set<int> ranks;
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    item = absl::StripAsciiWhitespace(item);
    int first, last;
    const size_t dash = item.find('-');
    if (dash == absl::string_view::npos) {
      if (!absl::SimpleAtoi(item, &first)) return invalid();
      last = first;
    } else if (!absl::SimpleAtoi(item.substr(0, dash), &first) ||
               !absl::SimpleAtoi(item.substr(dash + 1), &last)) {
      return invalid();
    }
    if (first < 0 || last < first || last >= (1 << 30)) return invalid();
    if (last - first > (1 << 20)) return invalid();
    for (int r = first; r <= last; ++r) ranks.insert(r);
  }
  out->assign(ranks.begin(), ranks.end());
  return absl::OkStatus();
}

}  // namespace

bool LaunchOptions::ShowsRank(int rank) const {
  return output_ranks.empty() ||
         std::binary_search(output_ranks.begin(), output_ranks.end(), rank);
}

absl::StatusOr<LaunchOptions> ParseArgs(const std::vector<std::string>& args) {
  LaunchOptions options;
  bool have_num_proc = false;
  bool have_host_list = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // First positional argument.

    if (arg == "-h" || arg == "--help") {
      options.help = true;
      return options;
    }
    if (arg == "--verbose") {
      options.verbose = true;
      continue;
    }
    if (arg == "--tag-output" || arg == "--no-tag-output") {
      options.tag_output = arg == "--tag-output";
      continue;
    }
    if (arg == "--prefix-timestamp" ||
        arg == "--prefix-output-with-timestamp") {
      options.prefix_timestamp = true;
      continue;
    }

    // Options that take a value, as `--flag value` or `--flag=value`.
    absl::string_view name = arg;
    std::string value;
    bool inline_value = false;
    if (size_t eq = name.find('='); eq != absl::string_view::npos) {
      value = std::string(name.substr(eq + 1));
      name = name.substr(0, eq);
      inline_value = true;
    }
    std::function<absl::Status(absl::string_view)> apply;
    if (name == "-np" || name == "--num-proc") {
      apply = [&, name](absl::string_view v) {
        have_num_proc = true;
        return ParsePositive(name, v, 1 << 30, &options.num_proc);
      };
    } else if (name == "-H" || name == "--hosts") {
      apply = [&, name](absl::string_view v) -> absl::Status {
        absl::StatusOr<std::vector<HostSlots>> hosts = ParseHostList(v);
        if (!hosts.ok()) {
          return Invalid(absl::StrCat(name, ": ", hosts.status().message()));
        }
        have_host_list = true;
        options.hosts = *std::move(hosts);
        return absl::OkStatus();
      };
    } else if (name == "--hostfile" || name == "-hostfile") {
      apply = [&, name](absl::string_view v) {
        return ParseNonEmpty(name, v, &options.hostfile);
      };
    } else if (name == "-p" || name == "--ssh-port") {
      apply = [&, name](absl::string_view v) {
        return ParsePositive(name, v, 65535, &options.ssh_port);
      };
    } else if (name == "-i" || name == "--ssh-identity-file") {
      apply = [&, name](absl::string_view v) {
        return ParseNonEmpty(name, v, &options.ssh_identity_file);
      };
    } else if (name == "--ssh-config") {
      apply = [&, name](absl::string_view v) {
        return ParseNonEmpty(name, v, &options.ssh_config);
      };
    } else if (name == "--network-interface") {
      apply = [&, name](absl::string_view v) {
        return ParseNonEmpty(name, v, &options.network_interface);
      };
    } else if (name == "-x") {
      apply = [&](absl::string_view v) {
        return ParseForwarded(v, &options.forwarded);
      };
    } else if (name == "--output-filename") {
      apply = [&, name](absl::string_view v) {
        return ParseNonEmpty(name, v, &options.output_dir);
      };
    } else if (name == "--output-ranks") {
      apply = [&, name](absl::string_view v) {
        return ParseRankList(name, v, &options.output_ranks);
      };
    } else if (name == "--log-level") {
      apply = [&](absl::string_view v) {
        return ParseLogLevel(v, &options.log_level);
      };
    } else if (name == "--start-timeout") {
      apply = [&, name](absl::string_view v) {
        return ParseSeconds(name, v, /*allow_zero=*/false,
                            &options.start_timeout);
      };
    } else if (name == "--min-np" || name == "--max-np") {
      apply = [&, name](absl::string_view v) {
        options.elastic = true;
        return ParsePositive(
            name, v, 1 << 30,
            name == "--min-np" ? &options.min_np : &options.max_np);
      };
    } else if (name == "--host-discovery-script") {
      apply = [&, name](absl::string_view v) {
        options.elastic = true;
        return ParseNonEmpty(name, v, &options.host_discovery_script);
      };
    } else if (name == "--slots-per-host" || name == "--slots") {
      apply = [&, name](absl::string_view v) {
        return ParsePositive(name, v, 1 << 20, &options.slots_per_host);
      };
    } else if (name == "--elastic-timeout") {
      apply = [&, name](absl::string_view v) {
        return ParseSeconds(name, v, /*allow_zero=*/false,
                            &options.elastic_timeout);
      };
    } else if (name == "--reset-limit") {
      apply = [&, name](absl::string_view v) -> absl::Status {
        int n;
        if (!absl::SimpleAtoi(v, &n) || n < 0) {
          return Invalid(absl::StrCat(
              name, " expects a non-negative integer, got \"", v, "\""));
        }
        options.reset_limit = n;
        return absl::OkStatus();
      };
    } else if (name == "--blacklist-cooldown") {
      apply = [&, name](absl::string_view v) {
        return ParseSeconds(name, v, /*allow_zero=*/true,
                            &options.blacklist_cooldown);
      };
    } else if (name == "--discovery-interval") {
      apply = [&, name](absl::string_view v) {
        return ParseSeconds(name, v, /*allow_zero=*/false,
                            &options.discovery_interval);
      };
    } else if (name == "--bind-to") {
      apply = [&, name](absl::string_view v) -> absl::Status {
        if (v == "core" || v == "none") {
          options.bind_to_core = v == "core";
          return absl::OkStatus();
        }
        return Invalid(
            absl::StrCat(name, ": \"", v, "\" is not one of core, none"));
      };
    } else if (name == "--grace-period") {
      apply = [&, name](absl::string_view v) {
        return ParseSeconds(name, v, /*allow_zero=*/true,
                            &options.grace_period);
      };
    } else {
      return Invalid(absl::StrCat("unknown option \"", arg, "\""));
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        return Invalid(absl::StrCat(name, " needs a value"));
      }
      value = args[++i];
    }
    if (absl::Status status = apply(value); !status.ok()) return status;
  }

  if (!have_num_proc) {
    return Invalid("the number of workers is required: -np N");
  }
  if (have_host_list && !options.hostfile.empty()) {
    return Invalid("-H and --hostfile both list hosts: use one of them");
  }
  if (!options.output_ranks.empty() &&
      options.output_ranks.back() >= options.num_proc) {
    return Invalid(absl::StrCat(
        "--output-ranks names rank ", options.output_ranks.back(), ", but -np ",
        options.num_proc, " has ranks 0 to ", options.num_proc - 1));
  }
  if (options.elastic) {
    if (options.min_np == 0) options.min_np = options.num_proc;
    if (options.max_np == 0) {
      options.max_np =
          options.host_discovery_script.empty() ? options.num_proc : (1 << 30);
    }
    if (options.min_np > options.num_proc ||
        options.num_proc > options.max_np) {
      return Invalid(absl::StrCat(
          "elastic mode needs --min-np <= -np <= --max-np, got --min-np ",
          options.min_np, ", -np ", options.num_proc, ", --max-np ",
          options.max_np));
    }
    if (!options.host_discovery_script.empty() &&
        (have_host_list || !options.hostfile.empty())) {
      return Invalid(
          "--host-discovery-script lists the hosts itself: drop -H / "
          "--hostfile");
    }
    if (!options.output_ranks.empty()) {
      return Invalid(
          "--output-ranks names ranks, which change in elastic mode; use "
          "--output-filename");
    }
  }
  options.command.assign(args.begin() + i, args.end());
  if (options.command.empty()) {
    return Invalid(
        "no command given: kolorun -np N [options] [--] command ...");
  }
  return options;
}

absl::Status LoadFiles(LaunchOptions* options) {
  for (const auto& [flag, path] :
       {std::make_pair("--ssh-config", &options->ssh_config),
        std::make_pair("--ssh-identity-file", &options->ssh_identity_file),
        std::make_pair("--hostfile", &options->hostfile)}) {
    if (path->empty()) continue;
    if (access(path->c_str(), R_OK) != 0) {
      return Invalid(
          absl::StrCat(flag, " ", *path, ": ", os::ErrnoText(errno)));
    }
    struct stat st;
    if (stat(path->c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      return Invalid(
          absl::StrCat(flag, " ", *path, ": is a directory, not a file"));
    }
  }
  if (options->hostfile.empty()) return absl::OkStatus();
  std::ifstream in(options->hostfile);
  std::stringstream content;
  content << in.rdbuf();
  if (!in) {
    return Invalid(absl::StrCat("--hostfile ", options->hostfile,
                                ": cannot read the file"));
  }
  absl::StatusOr<std::vector<HostSlots>> hosts =
      ParseHostfile(content.str(), options->hostfile);
  if (!hosts.ok()) return hosts.status();
  options->hosts = *std::move(hosts);
  return absl::OkStatus();
}

std::string Usage() {
  return R"(usage: kolorun -np N [options] [--] command [args...]

Starts N workers of one kolo job, on this machine or on several hosts over
ssh, each with KOLO_RANK, KOLO_SIZE, the placement and the rendezvous settings
in its environment, and forwards their output prefixed with "[rank] ".
kolorun's options end at the first positional argument or at "--";
everything after is the worker command.

Output is relayed live: a line still being written (a prompt, a progress bar
rewritten with '\r') appears after 100 ms as a line of its own, each '\r'
version of a line as an update (at most 4 a second per rank), and everything
a worker wrote is printed when it exits or dies. Python workers run
unbuffered (PYTHONUNBUFFERED=1); a C or C++ program writing to a pipe
buffers its stdout until it flushes: call setvbuf(stdout, NULL, _IONBF, 0)
(or fflush after a '\r' line), or run it as `stdbuf -o0 program`.

options:
  -np N, --num-proc N       number of workers to start (required, >= 1)
  -H, --hosts LIST          hosts and their slots, e.g. "host1:2,host2:2"
                            (":N" left out: 1 slot); ranks fill the hosts in
                            order (default: every worker on this machine)
  --hostfile FILE           hosts from a file: one "host slots=N" per line,
                            '#' starts a comment (instead of -H)
  -p, --ssh-port PORT       ssh port of the remote hosts (default: ssh's)
  -i, --ssh-identity-file FILE
                            private key for ssh (passed to ssh as -i)
  --ssh-config FILE         ssh configuration file (passed to ssh as -F):
                            host names, users, keys, known_hosts
  --network-interface NAME  interface whose IPv4 address the rendezvous store
                            and every worker's listeners bind to; workers get
                            KOLO_IFACE=NAME (default: loopback on one machine,
                            else the address that routes to the first remote
                            host, and workers pick theirs the same way)
  -x NAME[=VALUE]           set NAME for every worker: to VALUE, or to
                            kolorun's own value (repeatable)
  --output-filename DIR     also write each rank's output to DIR/rank.<N>.log
  --tag-output              prefix each output line with "[rank] " (default)
  --no-tag-output           print the workers' lines as they wrote them
  --output-ranks LIST       print only these ranks' output, e.g. "0" or
                            "0,2-3" (default: every rank); the others' files
                            under --output-filename are still written, and a
                            hidden rank that fails has its last 20 lines of
                            stderr shown
  --prefix-timestamp        prefix each output line with the UTC time
  --log-level LEVEL         KOLO_LOG_LEVEL of the workers: trace, debug,
                            info, warning, error or fatal
  --start-timeout SECONDS   time every rank has to join the rendezvous before
                            the job is torn down (default 60); exported as
                            KOLO_START_TIMEOUT unless that is already set
  --grace-period SECONDS    time between SIGTERM and SIGKILL when tearing the
                            workers down (default 5)
  --bind-to core|none       core (default): each worker on a host runs on
                            its own equal share of the cores kolorun may use,
                            hardware threads included (nothing is bound when
                            a host has more workers than CPUs); none:
                            placement left to the kernel

elastic mode (docs/elastic.md; on with any of the first three):
  --min-np N                the fewest workers the job trains with (default:
                            -np); a lost worker is removed and the others go
                            on while at least N remain
  --max-np N                the most workers (default: -np, or the hosts'
                            slots with a discovery script)
  --host-discovery-script PATH
                            prints the available hosts, one "host" or
                            "host:slots" per line; run every
                            --discovery-interval (default 1 s): new slots get
                            workers, hosts no longer printed are left
                            (instead of -H / --hostfile)
  --slots-per-host N        slots of a host the script prints without
                            ":slots" (default 1)
  --elastic-timeout SECONDS how long to wait for --min-np workers, at start
                            and after losing some (default 600)
  --reset-limit N           how many times the job may re-form before it
                            fails (default: no limit)
  --blacklist-cooldown SECONDS
                            a host whose workers failed twice gets no new
                            workers for this long (default 60; 0: for good)
  --discovery-interval SECONDS
                            how often the discovery script runs (default 1)

  --verbose                 print the command, the placement, the CPUs of
                            each worker and the store address to stderr
  -h, --help                print this help and exit

Remote workers start through `ssh -o BatchMode=yes HOST` (host keys are
checked) in the same directory and with the same paths as here, under
kolo_rank_guard (installed next to kolorun), which ends them when the ssh
connection closes. They get KOLO_* (the job's and kolorun's own), PATH,
LD_LIBRARY_PATH, OMP_NUM_THREADS and the -x variables; the job secret
travels on ssh's standard input, never on a command line.

exit status: 0 when every worker exits 0 (elastic: when the job finishes,
whatever workers it lost on the way); 1 when a worker fails or a rank
does not join in time; 2 for a usage error; 128+n after signal n (130 for
SIGINT, 143 for SIGTERM).
)";
}

std::string FormatSeconds(absl::Duration d) {
  return absl::StrCat(absl::ToDoubleSeconds(d));
}

}  // namespace kolorun
}  // namespace kolo
