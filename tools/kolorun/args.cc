#include "tools/kolorun/args.h"

#include <cmath>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kolo {
namespace kolorun {
namespace {

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

absl::Status ParseNumProc(absl::string_view flag, absl::string_view value,
                          int* out) {
  int n;
  if (!absl::SimpleAtoi(value, &n) || n < 1) {
    return Invalid(
        absl::StrCat(flag, " expects a positive integer, got \"", value, "\""));
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

}  // namespace

absl::StatusOr<LaunchOptions> ParseArgs(const std::vector<std::string>& args) {
  LaunchOptions options;
  bool have_num_proc = false;
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
        return ParseNumProc(name, v, &options.num_proc);
      };
    } else if (name == "--start-timeout") {
      apply = [&, name](absl::string_view v) {
        return ParseSeconds(name, v, /*allow_zero=*/false,
                            &options.start_timeout);
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
  options.command.assign(args.begin() + i, args.end());
  if (options.command.empty()) {
    return Invalid(
        "no command given: kolorun -np N [options] [--] command ...");
  }
  return options;
}

std::string Usage() {
  return R"(usage: kolorun -np N [options] [--] command [args...]

Starts N local workers of one kolo job, each with KOLO_RANK, KOLO_SIZE and the
rendezvous settings in its environment, and forwards their output prefixed
with "[rank] ". kolorun's options end at the first positional argument or at
"--"; everything after is the worker command.

options:
  -np N, --num-proc N       number of workers to start (required, >= 1)
  --start-timeout SECONDS   time every rank has to join the rendezvous before
                            the job is torn down (default 60); exported as
                            KOLO_START_TIMEOUT unless that is already set
  --grace-period SECONDS    time between SIGTERM and SIGKILL when tearing the
                            workers down (default 5)
  --verbose                 print the command, N and the store port to stderr
  -h, --help                print this help and exit

exit status: 0 when every worker exits 0; 1 when a worker fails or a rank
does not join in time; 2 for a usage error; 128+n after signal n (130 for
SIGINT, 143 for SIGTERM).
)";
}

std::string FormatSeconds(absl::Duration d) {
  return absl::StrCat(absl::ToDoubleSeconds(d));
}

}  // namespace kolorun
}  // namespace kolo
