// Hosts of a kolorun job: the -H list and the --hostfile, where each rank
// runs (placement), and whether a host is this machine.
#ifndef KOLO_TOOLS_KOLORUN_HOSTS_H_
#define KOLO_TOOLS_KOLORUN_HOSTS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kolo {
namespace kolorun {

// One host and how many workers it may run.
struct HostSlots {
  std::string name;
  int slots = 1;
  bool operator==(const HostSlots& o) const {
    return name == o.name && slots == o.slots;
  }
};

// "host1:2,host2:2" (":N" may be left out: 1 slot). InvalidArgument naming
// the bad entry on empty entries, bad names, slot counts < 1 and hosts
// listed twice.
absl::StatusOr<std::vector<HostSlots>> ParseHostList(absl::string_view list);

// The text of a hostfile: one host per line as "host slots=N" (or just
// "host": 1 slot); '#' starts a comment; blank lines are skipped. Errors
// name `filename` and the line number.
absl::StatusOr<std::vector<HostSlots>> ParseHostfile(
    absl::string_view content, const std::string& filename);

// Where one rank runs.
struct RankPlacement {
  int rank = 0;
  std::string host;     // As given in -H or the hostfile ("localhost" if none).
  bool remote = false;  // Started over ssh.
  int local_rank = 0;   // Among the ranks on `host`.
  int local_size = 1;
  int cross_rank = 0;  // Index of `host` among the hosts that run ranks.
  int cross_size = 1;
};

// Fills hosts in order: the first host's slots take ranks 0..slots-1, and so
// on, until `num_proc` ranks are placed; hosts left over run nothing. No
// hosts: every rank on "localhost". `is_local` says which hosts are this
// machine (not started over ssh). InvalidArgument if the slots do not
// suffice, or if two used hosts are both this machine.
absl::StatusOr<std::vector<RankPlacement>> PlaceRanks(
    int num_proc, const std::vector<HostSlots>& hosts,
    const std::function<bool(const std::string&)>& is_local);

// True if `host` is this machine: "localhost", this machine's host name (or
// its first label), or a name or address that resolves to an address of
// this machine. Names that do not resolve are taken as remote (ssh may
// still know them from its configuration).
bool IsLocalHost(const std::string& host);

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_HOSTS_H_
