// The "shm+gloo" backend: CPU collectives for a process set that spans
// several hosts with several ranks on some of them. Within a host the ranks
// use the shm backend; between hosts one leader per host uses gloo.
//
// Note [Hierarchical CPU collectives]
// Allreduce: shm allreduce within each host, gloo allreduce among the host
// leaders (the lowest set rank of each host), shm broadcast from the leader
// within each host. Bytes crossing the network: one host's worth per host
// instead of one per rank, and the intra-host part moves at memory speed.
// Broadcast: within the root's host from the root, among the leaders from
// the root's host, within every other host from its leader. Every rank ends
// with the leaders' bits, which gloo makes identical on every leader, so
// results stay bitwise identical on every rank. Allgatherv and alltoallv
// (whose blocks are ordered by set rank, not by host) run on a flat gloo
// context over the whole set.
//
// Creation is collective. If shared memory fails on any host, creation fails
// on every rank with the same error (each rank publishes its outcome in the
// store and reads everyone's), so that the runtime's fallback to flat gloo
// is taken by all ranks alike.
#ifndef KOLO_OPS_HIERARCHICAL_HIERARCHICAL_BACKEND_H_
#define KOLO_OPS_HIERARCHICAL_HIERARCHICAL_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/loop/backend.h"

namespace kolo {
namespace hierarchical {

// Where each set rank sits: its host's index (in order of first
// appearance), its index within the host, and the host leaders.
struct Layout {
  int host = 0;        // my host's index
  int local_rank = 0;  // my index among my host's ranks (by set rank)
  int local_size = 1;
  int num_hosts = 1;
  std::vector<int> host_of;   // set rank -> host index
  std::vector<int> local_of;  // set rank -> index within its host
  std::vector<int> leaders;   // host index -> set rank of its leader
};
// `hosts[r]` is set rank r's host id; `rank` is mine.
Layout MakeLayout(const std::vector<std::string>& hosts, int rank);

// Whether the hierarchy helps: more than one host and some host with more
// than one rank.
bool Worthwhile(const std::vector<std::string>& hosts);

// Collective over the set (context.hosts must name every rank's host).
absl::StatusOr<std::unique_ptr<Backend>> Create(const BackendContext& context);

}  // namespace hierarchical
}  // namespace kolo

#endif  // KOLO_OPS_HIERARCHICAL_HIERARCHICAL_BACKEND_H_
