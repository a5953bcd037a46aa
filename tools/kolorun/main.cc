// kolorun: starts the N workers of one kolo job, on this machine or on
// several hosts over ssh. See `kolorun --help`, Note [Launcher lifecycle] in
// launcher.h and Note [Remote ranks] in remote.h.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/os/unique_fd.h"
#include "tools/kolorun/args.h"
#include "tools/kolorun/elastic.h"
#include "tools/kolorun/job.h"
#include "tools/kolorun/launcher.h"

namespace {

// Descriptors 0-2 must be open before kolorun creates pipes, or a pipe could
// land on 1 and a worker's output on kolorun's stdout unprefixed.
void EnsureStandardDescriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) < 0) {
      kolo::os::UniqueFd opened(open("/dev/null", O_RDWR));
      // Kept for good only where it landed on `fd` itself.
      if (opened.get() == fd) (void)opened.release();
    }
  }
}

int UsageError(const absl::Status& status) {
  std::fprintf(stderr, "kolorun: %s\nRun 'kolorun --help' for usage.\n",
               std::string(status.message()).c_str());
  return 2;
}

// Elastic mode with a discovery script: the first hosts are what it prints
// once it offers --min-np slots (polled every --discovery-interval, up to
// --elastic-timeout); the job starts with min(-np, slots, --max-np).
absl::Status DiscoverFirstHosts(kolo::kolorun::LaunchOptions* options) {
  const absl::Time deadline = absl::Now() + options->elastic_timeout;
  for (bool said = false;; said = true) {
    absl::StatusOr<std::string> output = kolo::kolorun::RunDiscoveryScript(
        options->host_discovery_script, absl::Seconds(10));
    if (!output.ok()) return output.status();
    absl::StatusOr<std::vector<kolo::kolorun::HostSlots>> hosts =
        kolo::kolorun::ParseDiscoveryOutput(*output, options->slots_per_host);
    if (!hosts.ok()) return hosts.status();
    int slots = 0;
    for (const auto& host : *hosts) slots += host.slots;
    if (slots >= options->min_np) {
      options->hosts.clear();
      for (const auto& host : *hosts) {
        if (host.slots > 0) options->hosts.push_back(host);
      }
      options->num_proc = std::min({options->num_proc, slots, options->max_np});
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "the discovery script offers ", slots, " slot", slots == 1 ? "" : "s",
          ", fewer than --min-np ", options->min_np, ", and no more within ",
          kolo::kolorun::FormatSeconds(options->elastic_timeout),
          " s (--elastic-timeout)"));
    }
    if (!said) {
      std::fprintf(stderr,
                   "kolorun: the discovery script offers %d slots, fewer "
                   "than --min-np %d; waiting for more\n",
                   slots, options->min_np);
    }
    absl::SleepFor(options->discovery_interval);
  }
}

}  // namespace

int main(int argc, char** argv) {
  EnsureStandardDescriptors();
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<kolo::kolorun::LaunchOptions> options =
      kolo::kolorun::ParseArgs(args);
  if (!options.ok()) return UsageError(options.status());
  if (options->help) {
    std::fputs(kolo::kolorun::Usage().c_str(), stdout);
    return 0;
  }
  // Everything that can be wrong with the command line, the files it names
  // and the hosts is found before anything starts.
  if (absl::Status s = kolo::kolorun::LoadFiles(&*options); !s.ok()) {
    return UsageError(s);
  }
  if (!options->host_discovery_script.empty()) {
    if (absl::Status s = DiscoverFirstHosts(&*options); !s.ok()) {
      std::fprintf(stderr, "kolorun: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  absl::StatusOr<kolo::kolorun::JobPlan> plan =
      kolo::kolorun::PlanJob(*options);
  if (!plan.ok()) return UsageError(plan.status());
  if (absl::Status s = kolo::kolorun::CheckResources(
          *options, *plan, kolo::kolorun::ReadResourceLimits());
      !s.ok()) {
    std::fprintf(stderr, "kolorun: %s\n", std::string(s.message()).c_str());
    return 2;  // Nothing started, as for a usage error.
  }
  kolo::kolorun::Launcher launcher(*std::move(options), *std::move(plan));
  return launcher.Run();
}
