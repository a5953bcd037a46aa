// Point-to-point (send, recv, recv from any source) of a ProcessGroupKolo.
//
// Note [Point-to-point of a process group]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// kolo negotiates collectives: every rank of a set submits the same named
// collective. A point-to-point message has no counterpart on the other
// ranks, so it does not go through the negotiation. Each group connects a
// gloo context of its own when it is created (a full mesh over gloo's TCP
// transport, through the store torch hands the group, its listener on
// kolo's bind address), and a send or recv is one gloo unbound-buffer
// operation on it: torch's tag is gloo's slot, a recv from any source is a
// recv from every other rank, and messages between two ranks with one tag
// arrive in the order they were sent (gloo's pairs are ordered).
//
// kolo's promises hold:
//   * a dead peer: gloo's loop thread sees its connection close and fails
//     the operations pending on that pair at once; the error names the
//     operation, the peer and the tag;
//   * a peer that never answers: a wait is bounded by the group's timeout
//     (KOLO_OP_TIMEOUT unless init_process_group or new_group set one), and
//     its error names the operation, the peer and the tag. gloo then fails
//     every pending operation of the group's context, as ProcessGroupGloo
//     does: the group's point-to-point ends with its first timeout;
//   * idle ranks take no CPU: a wait blocks on gloo's condition variable.
// Within a host the bytes go through loopback TCP, not shared memory.
// gloo's traffic is not authenticated (docs/security.md).
#ifndef KOLO_FRONTENDS_PYTHON_SRC_POINT_TO_POINT_H_
#define KOLO_FRONTENDS_PYTHON_SRC_POINT_TO_POINT_H_

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

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
  // through `store`; gloo's listener binds to `bind_addr`. Blocks up to
  // `start_timeout`; an error names the group.
  static std::shared_ptr<PointToPoint> Connect(
      const std::string& group, int rank, int size,
      const c10::intrusive_ptr<c10d::Store>& store,
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

 private:
  PointToPoint(std::string group, std::shared_ptr<::gloo::Context> context);

  const std::string group_;
  const std::shared_ptr<::gloo::Context> context_;
};

}  // namespace torch
}  // namespace kolo

#endif  // KOLO_FRONTENDS_PYTHON_SRC_POINT_TO_POINT_H_
