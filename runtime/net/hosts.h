// Where hosts are: interface addresses, name resolution, the local address
// that reaches a host, and Slurm node lists. None of it reads the
// environment (runtime/api/config.h does, and calls these).
//
// Thread safety: every function may be called from any thread.
#ifndef KOLO_RUNTIME_NET_HOSTS_H_
#define KOLO_RUNTIME_NET_HOSTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kolo {

// The first IPv4 address of network interface `iface` (e.g. "eth0", "lo").
absl::StatusOr<std::string> InterfaceAddress(const std::string& iface);

// The IPv4 addresses of `host` (a numeric address or a name, resolved with
// getaddrinfo: /etc/hosts, then DNS), in resolver order, without duplicates.
// With `allow_lookup` false, names fail: numeric addresses only.
absl::StatusOr<std::vector<std::string>> ResolveIPv4(const std::string& host,
                                                     bool allow_lookup = true);

// True if `addr` (numeric IPv4) belongs to this machine, in this network
// namespace: a listener can bind to it (any of 127.0.0.0/8 included).
bool IsLocalAddress(const std::string& addr);

// The local IPv4 address through which this machine reaches `host`: one of
// host's own addresses if it is local (see IsLocalAddress), else the source
// address the kernel routes packets to it from. Sends nothing.
absl::StatusOr<std::string> LocalAddressFor(const std::string& host,
                                            bool allow_lookup = true);

// Expands a Slurm node list such as "node[1-3,05],gpu7,rack[1-2]-n[1-2]"
// into host names, in order ("node1,node2,node3,node05,gpu7,rack1-n1,...").
// Numbers keep the zero padding of a range's first bound ("n[08-10]" gives
// n08, n09, n10). InvalidArgument on malformed lists.
absl::StatusOr<std::vector<std::string>> ExpandSlurmNodelist(
    const std::string& nodelist);

}  // namespace kolo

#endif  // KOLO_RUNTIME_NET_HOSTS_H_
