// Point-to-point (send, recv, recv from any source) of a ProcessGroupKolo.
//
// Note [Point-to-point of a process group]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// kolo negotiates collectives: every rank of a set submits the same named
// collective. A point-to-point message has no counterpart on the other
// ranks, so it does not go through the negotiation. Each group connects a
// transport of its own when it is created, through the store torch hands
// the group, and keeps it for its life; one per group, so that a recv from
// any source matches over one engine:
//   * every rank on one host: shared memory (Note [Point-to-point over
//     shared memory], shm_point_to_point.h), unless KOLO_SHM=0 or the
//     segment cannot be made;
//   * otherwise a gloo context (a full mesh over gloo's TCP transport, its
//     listener on kolo's bind address), and a send or recv is one gloo
//     unbound-buffer operation on it: torch's tag is gloo's slot, a recv
//     from any source is a recv from every other rank, and messages
//     between two ranks with one tag arrive in the order they were sent
//     (gloo's pairs are ordered). A group that spans hosts uses it for its
//     pairs within a host too.
// transport() says which, and why.
//
// kolo's promises hold on both:
//   * a dead peer: gloo's loop thread sees its connection close (shared
//     memory: the peer's pidfd) and fails the operations pending with it at
//     once; the error names the operation, the peer and the tag;
//   * a peer that never answers: a wait is bounded by the group's timeout
//     (KOLO_OP_TIMEOUT unless init_process_group or new_group set one), and
//     its error names the operation, the peer and the tag. The group's
//     point-to-point then fails every pending and later operation on this
//     rank, as ProcessGroupGloo's context does;
//   * idle ranks take no CPU: a wait blocks on a condition variable.
// gloo's traffic is not authenticated (docs/security.md); the shared
// segment is mode 0600 and its name is gone once every rank mapped it.
#ifndef KOLO_FRONTENDS_PYTHON_SRC_POINT_TO_POINT_H_
#define KOLO_FRONTENDS_PYTHON_SRC_POINT_TO_POINT_H_

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "frontends/python/src/shm_point_to_point.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace kolo {
namespace torch {

class PointToPoint {
 public:
  // Connects `rank` (of `size`) of group `group` to every other rank of it
  // through `store`: over shared memory if `shm` and the group allows it,
  // else gloo's listener binds to `bind_addr`. Blocks up to
  // `start_timeout`; an error names the group.
  static std::shared_ptr<PointToPoint> Connect(
      const std::string& group, int rank, int size,
      const c10::intrusive_ptr<c10d::Store>& store, bool shm,
      const std::string& bind_addr, std::chrono::milliseconds start_timeout);

  // Posts a send of `tensor` to `peer` / a recv into it from `peer` (-1:
  // any other rank) with `tag`, and returns its Work. `timeout` bounds the
  // wait.
  c10::intrusive_ptr<c10d::Work> Send(const at::Tensor& tensor, int peer,
                                      int tag,
                                      std::chrono::milliseconds timeout);
  c10::intrusive_ptr<c10d::Work> Recv(const at::Tensor& tensor, int peer,
                                      int tag,
                                      std::chrono::milliseconds timeout);

  // "shared memory", or "gloo (TCP): <why not shared memory>".
  const std::string& transport() const { return transport_; }

 private:
  PointToPoint(std::string group, int rank, int size, std::string transport,
               std::shared_ptr<ShmPointToPoint> shm,
               std::shared_ptr<::gloo::Context> context);

  const std::string group_;
  const int rank_, size_;
  const std::string transport_;
  const std::shared_ptr<ShmPointToPoint> shm_;      // or
  const std::shared_ptr<::gloo::Context> context_;  // null with shm_
};

}  // namespace torch
}  // namespace kolo

#endif  // KOLO_FRONTENDS_PYTHON_SRC_POINT_TO_POINT_H_
