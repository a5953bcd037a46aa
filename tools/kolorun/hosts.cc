#include "tools/kolorun/hosts.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/api/config.h"
#include "runtime/net/hosts.h"

namespace kolo {
namespace kolorun {
namespace {

// Host names and IPv4 addresses. A leading '-' would read as an ssh option;
// '@', spaces and shell characters have no business in a host list.
absl::Status CheckHostName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("empty host name");
  const bool valid =
      name.size() <= 253 && absl::ascii_isalnum(name[0]) &&
      std::all_of(name.begin(), name.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_';
      });
  if (!valid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid host name \"", name,
        "\" (letters, digits, '.', '-' and '_', starting with a letter or "
        "digit)"));
  }
  return absl::OkStatus();
}

absl::Status ParseSlots(absl::string_view host, absl::string_view text,
                        int* slots) {
  if (!absl::SimpleAtoi(text, slots) || *slots < 1 || *slots > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("host \"", host,
                     "\": the number of slots must be a "
                     "positive integer, got \"",
                     text, "\""));
  }
  return absl::OkStatus();
}

absl::Status AddHost(HostSlots host, std::set<std::string>* seen,
                     std::vector<HostSlots>* hosts) {
  if (!seen->insert(host.name).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("host \"", host.name, "\" is listed twice"));
  }
  hosts->push_back(std::move(host));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<HostSlots>> ParseHostList(absl::string_view list) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  if (list.empty()) return absl::InvalidArgumentError("empty host list");
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "empty entry in host list \"", list, "\" (expected host:N,...)"));
    }
    HostSlots host;
    const std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
    if (parts.size() > 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid host list entry \"", entry,
                       "\" (expected host or host:N; IPv6 addresses are not "
                       "supported)"));
    }
    if (absl::Status s = CheckHostName(parts[0]); !s.ok()) return s;
    host.name = std::string(parts[0]);
    if (parts.size() == 2) {
      if (absl::Status s = ParseSlots(parts[0], parts[1], &host.slots);
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = AddHost(std::move(host), &seen, &hosts); !s.ok()) {
      return s;
    }
  }
  return hosts;
}

absl::StatusOr<std::vector<HostSlots>> ParseHostfile(
    absl::string_view content, const std::string& filename) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    ++line_number;
    const auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(filename, ":", line_number, ": ", what));
    };
    line = line.substr(0, line.find('#'));
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    HostSlots host;
    if (absl::Status s = CheckHostName(fields[0]); !s.ok()) {
      return error(s.message());
    }
    host.name = std::string(fields[0]);
    for (size_t i = 1; i < fields.size(); ++i) {
      absl::string_view field = fields[i];
      if (!absl::ConsumePrefix(&field, "slots=")) {
        return error(absl::StrCat("unknown field \"", fields[i],
                                  "\" (expected \"host slots=N\")"));
      }
      if (absl::Status s = ParseSlots(host.name, field, &host.slots); !s.ok()) {
        return error(s.message());
      }
    }
    if (absl::Status s = AddHost(std::move(host), &seen, &hosts); !s.ok()) {
      return error(s.message());
    }
  }
  if (hosts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(filename, ": no hosts in the hostfile"));
  }
  return hosts;
}

absl::StatusOr<std::vector<RankPlacement>> PlaceRanks(
    int num_proc, const std::vector<HostSlots>& hosts,
    const std::function<bool(const std::string&)>& is_local) {
  const std::vector<HostSlots> local_only = {{"localhost", num_proc}};
  const std::vector<HostSlots>& list = hosts.empty() ? local_only : hosts;
  int64_t total = 0;
  for (const HostSlots& host : list) total += host.slots;
  if (total < num_proc) {
    std::vector<std::string> names;
    for (const HostSlots& host : list) {
      names.push_back(absl::StrCat(host.name, ":", host.slots));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("-np ", num_proc, " is more than the ", total,
                     " slots of the hosts (", absl::StrJoin(names, ","), ")"));
  }
  std::vector<RankPlacement> ranks;
  int used_hosts = 0;
  std::string local_host;
  for (const HostSlots& host : list) {
    if (static_cast<int>(ranks.size()) == num_proc) break;
    const int count =
        std::min(host.slots, num_proc - static_cast<int>(ranks.size()));
    const bool local = hosts.empty() || is_local(host.name);
    if (local && !local_host.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("hosts \"", local_host, "\" and \"", host.name,
                       "\" are both this machine: list it once"));
    }
    if (local) local_host = host.name;
    for (int i = 0; i < count; ++i) {
      RankPlacement p;
      p.rank = static_cast<int>(ranks.size());
      p.host = host.name;
      p.remote = !local;
      p.local_rank = i;
      p.local_size = count;
      p.cross_rank = used_hosts;
      ranks.push_back(p);
    }
    ++used_hosts;
  }
  for (RankPlacement& p : ranks) p.cross_size = used_hosts;
  return ranks;
}

bool IsLocalHost(const std::string& host) {
  if (host == "localhost") return true;
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') {
    const std::string self = name;
    if (host == self || host == self.substr(0, self.find('.'))) return true;
  }
  struct in_addr numeric;
  if (inet_pton(AF_INET, host.c_str(), &numeric) == 1) {
    return IsLocalAddress(host);
  }
  absl::StatusOr<std::vector<std::string>> addrs = ResolveIPv4(host);
  if (!addrs.ok()) return false;
  return std::any_of(addrs->begin(), addrs->end(), IsLocalAddress);
}

}  // namespace kolorun
}  // namespace kolo
