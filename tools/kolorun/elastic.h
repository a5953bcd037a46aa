// kolorun's elastic mode: the parts that decide, without processes or I/O
// of the launcher's own (Launcher drives them; Note [Elastic launcher] in
// launcher.cc).
//
// Note [Generations of a job]
// Every membership of an elastic job is a generation: 0 is the one kolorun
// starts with; each later one is formed when the current one ends (a worker
// died or was reported lost, or the discovery script added or removed
// slots). kolorun forms generation g+1 once every member of g has left it
// (set elastic/g/left/<id>, kolo/elastic.h) or is gone, from the members
// that left and are still alive, minus those on removed hosts, plus new
// workers on free slots (up to --max-np); it needs at least --min-np of
// them, waiting up to --elastic-timeout for the script to offer more. Ranks
// follow the hosts' order, and on each host the survivors' old order, then
// the newcomers: rank 0 stays rank 0 while it lives.
#ifndef KOLO_TOOLS_KOLORUN_ELASTIC_H_
#define KOLO_TOOLS_KOLORUN_ELASTIC_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kolo/elastic.h"
#include "tools/kolorun/hosts.h"

namespace kolo {
namespace kolorun {

// Failures of one host's workers after which it gets no new workers for
// --blacklist-cooldown (a first failure never does: on one host that would
// end the job).
constexpr int kBlacklistFailures = 2;
// How long the discovery script may run; how long a worker reported lost
// may take to exit before kolorun kills it (Note [Elastic launcher]).
constexpr absl::Duration kDiscoveryTimeout = absl::Seconds(10);
constexpr absl::Duration kLostGrace = absl::Milliseconds(500);

// The discovery script's output: one "host" or "host:slots" per line
// (blank lines and '#' comments skipped; a host listed twice adds up).
// InvalidArgument naming the line for anything else.
absl::StatusOr<std::vector<HostSlots>> ParseDiscoveryOutput(
    const std::string& output, int slots_per_host);

// Runs `script` (no shell; its standard input /dev/null, stderr kolorun's)
// and returns what it printed. The script must exit 0 within `timeout`
// (else it is killed): Unavailable / DeadlineExceeded naming the script.
absl::StatusOr<std::string> RunDiscoveryScript(const std::string& script,
                                               absl::Duration timeout);

// One worker of the generation being formed.
struct Candidate {
  int64_t id = 0;
  std::string host;
  int previous_rank = -1;  // -1: a newcomer.
};

// Ranks for `candidates`, hosts in the order of `host_order` (hosts not in
// it last, in order of appearance), then survivors by previous rank, then
// newcomers by id (Note [Generations of a job]).
std::vector<std::pair<int64_t, elastic::Assignment>> AssignRanks(
    const std::vector<Candidate>& candidates,
    const std::vector<std::string>& host_order, int64_t generation);

// Failures per host and the blacklist.
class HostBook {
 public:
  explicit HostBook(absl::Duration cooldown) : cooldown_(cooldown) {}
  // Counts a failure on `host`; true if the host is now blacklisted.
  bool RecordFailure(const std::string& host, absl::Time now);
  bool Blacklisted(const std::string& host, absl::Time now) const;
  // When the blacklisting of `host` ends (InfinitePast: not blacklisted;
  // InfiniteFuture: for good).
  absl::Time BlacklistedUntil(const std::string& host) const;

 private:
  struct Entry {
    int failures = 0;  // Since the last cooldown ended.
    absl::Time until = absl::InfinitePast();
  };
  const absl::Duration cooldown_;
  std::map<std::string, Entry> hosts_;
};

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_ELASTIC_H_
