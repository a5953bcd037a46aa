#include "runtime/net/hosts.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "runtime/os/errno_text.h"
#include "runtime/os/unique_fd.h"
#include "runtime/util/status_macros.h"

namespace kolo {

absl::StatusOr<std::string> InterfaceAddress(const std::string& iface) {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::InternalError("getifaddrs failed");
  }
  std::string found;
  std::vector<std::string> names;
  for (struct ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET) continue;
    names.push_back(it->ifa_name);
    if (iface == it->ifa_name && found.empty()) {
      char buf[INET_ADDRSTRLEN];
      auto* sin = reinterpret_cast<struct sockaddr_in*>(it->ifa_addr);
      inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
      found = buf;
    }
  }
  freeifaddrs(list);
  if (found.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid value for KOLO_IFACE=\"", iface,
                     "\": no IPv4 interface of that name (have: ",
                     absl::StrJoin(names, ", "), ")"));
  }
  return found;
}

absl::StatusOr<std::vector<std::string>> ResolveIPv4(const std::string& host,
                                                     bool allow_lookup) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (!allow_lookup) hints.ai_flags = AI_NUMERICHOST;
  struct addrinfo* result = nullptr;
  const int gai = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (gai != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot resolve \"", host, "\": ", gai_strerror(gai)));
  }
  std::vector<std::string> addrs;
  for (struct addrinfo* ai = result; ai; ai = ai->ai_next) {
    char buf[INET_ADDRSTRLEN];
    auto* sin = reinterpret_cast<struct sockaddr_in*>(ai->ai_addr);
    inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
    if (std::find(addrs.begin(), addrs.end(), buf) == addrs.end()) {
      addrs.push_back(buf);
    }
  }
  freeaddrinfo(result);
  if (addrs.empty()) {
    return absl::NotFoundError(
        absl::StrCat("\"", host, "\" has no IPv4 address"));
  }
  return addrs;
}

namespace {

bool ToSockaddr(const std::string& addr, struct sockaddr_in* sin) {
  std::memset(sin, 0, sizeof(*sin));
  sin->sin_family = AF_INET;
  return inet_pton(AF_INET, addr.c_str(), &sin->sin_addr) == 1;
}

}  // namespace

bool IsLocalAddress(const std::string& addr) {
  struct sockaddr_in sin;
  if (!ToSockaddr(addr, &sin)) return false;
  const os::UniqueFd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return false;
  return bind(fd.get(), reinterpret_cast<struct sockaddr*>(&sin),
              sizeof(sin)) == 0;
}

absl::StatusOr<std::string> LocalAddressFor(const std::string& host,
                                            bool allow_lookup) {
  absl::StatusOr<std::vector<std::string>> addrs =
      ResolveIPv4(host, allow_lookup);
  if (!addrs.ok()) return addrs.status();
  for (const std::string& addr : *addrs) {
    if (IsLocalAddress(addr)) return addr;
  }
  // connect() on a UDP socket only picks the route and the source address.
  struct sockaddr_in peer;
  ToSockaddr(addrs->front(), &peer);
  peer.sin_port = htons(9);
  const os::UniqueFd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat("socket: ", os::ErrnoText(errno)));
  }
  struct sockaddr_in self;
  socklen_t self_len = sizeof(self);
  if (connect(fd.get(), reinterpret_cast<struct sockaddr*>(&peer),
              sizeof(peer)) != 0 ||
      getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&self),
                  &self_len) != 0) {
    return absl::UnavailableError(absl::StrCat("no route to ", addrs->front(),
                                               ": ", os::ErrnoText(errno)));
  }
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &self.sin_addr, buf, sizeof(buf));
  return std::string(buf);
}

namespace {

// Upper bound on the names one node list may expand to.
constexpr size_t kMaxNodelistNames = 1 << 16;

// Expands one node name with bracket groups, e.g. "rack[1-2]-n[01,03]".
absl::Status ExpandNodeName(absl::string_view name,
                            std::vector<std::string>* out) {
  const size_t open = name.find('[');
  if (open == absl::string_view::npos) {
    if (name.find(']') != absl::string_view::npos) {
      return absl::InvalidArgumentError("unbalanced ']'");
    }
    if (name.empty()) return absl::InvalidArgumentError("empty node name");
    out->emplace_back(name);
    return absl::OkStatus();
  }
  const size_t close = name.find(']', open);
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("unbalanced '['");
  }
  const absl::string_view prefix = name.substr(0, open);
  const absl::string_view rest = name.substr(close + 1);
  const absl::string_view ranges = name.substr(open + 1, close - open - 1);
  if (prefix.find(']') != absl::string_view::npos ||
      ranges.find('[') != absl::string_view::npos) {
    return absl::InvalidArgumentError("nested or unbalanced brackets");
  }
  // Everything after the first group expands the same for every number.
  std::vector<std::string> tails;
  if (rest.empty()) {
    tails.emplace_back();
  } else {
    KOLO_RETURN_IF_ERROR(ExpandNodeName(rest, &tails));
  }
  for (absl::string_view range : absl::StrSplit(ranges, ',')) {
    const size_t dash = range.find('-');
    const absl::string_view low_text = range.substr(0, dash);
    const absl::string_view high_text =
        dash == absl::string_view::npos ? low_text : range.substr(dash + 1);
    uint64_t low, high;
    const auto digits = [](absl::string_view t) {
      return !t.empty() && t.size() <= 9 &&
             std::all_of(t.begin(), t.end(), absl::ascii_isdigit);
    };
    if (!digits(low_text) || !digits(high_text) ||
        !absl::SimpleAtoi(low_text, &low) ||
        !absl::SimpleAtoi(high_text, &high) || high < low) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad range \"", range, "\" in brackets"));
    }
    for (uint64_t n = low; n <= high; ++n) {
      if (out->size() >= kMaxNodelistNames) {
        return absl::InvalidArgumentError(
            absl::StrCat("more than ", kMaxNodelistNames, " nodes"));
      }
      std::string number = absl::StrCat(n);
      if (number.size() < low_text.size()) {
        number.insert(0, low_text.size() - number.size(), '0');
      }
      for (const std::string& tail : tails) {
        out->push_back(absl::StrCat(prefix, number, tail));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandSlurmNodelist(
    const std::string& nodelist) {
  std::vector<std::string> names;
  // Split at commas outside brackets.
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= nodelist.size(); ++i) {
    const char c = i < nodelist.size() ? nodelist[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) {
      return absl::InvalidArgumentError("unbalanced brackets");
    }
    if (c != ',' || depth != 0) continue;
    KOLO_RETURN_IF_ERROR(ExpandNodeName(
        absl::string_view(nodelist).substr(start, i - start), &names));
    start = i + 1;
  }
  if (depth != 0) return absl::InvalidArgumentError("unbalanced '['");
  return names;
}

}  // namespace kolo
