// CoordinatorExchange: the exchange through the coordinator (Note [The
// exchange] in hit_exchange.h), for any job: a rank's hits travel as cache
// ids in its request list, and the coordinator ANDs them. Every rank uses
// it except on the board and a host's leader: rank 0 (which is its
// coordinator), a host's other ranks where hosts have leaders (the control
// plane carries their lists to their leader: Note [Host relay]), every
// rank of a job over TCP without leaders, a job of one rank.
#ifndef KOLO_RUNTIME_LOOP_COORDINATOR_EXCHANGE_H_
#define KOLO_RUNTIME_LOOP_COORDINATOR_EXCHANGE_H_

#include "runtime/loop/hit_exchange.h"

namespace kolo {

class CoordinatorExchange final : public HitExchange {
 public:
  // `control`: null in a job of one rank.
  CoordinatorExchange(ControlLink* control, Runner* runner)
      : HitExchange(runner), control_(control) {}

  absl::StatusOr<bool> Send(wire::RequestList list, std::vector<int64_t>* hits,
                            Coordinator* coordinator, int set_rank,
                            absl::Time now) override;

 private:
  ControlLink* const control_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_COORDINATOR_EXCHANGE_H_
