// Elastic jobs: a worker's side of kolorun's elastic mode (docs/elastic.md).
//
// kolorun (--min-np/--max-np/--host-discovery-script) numbers the job's
// memberships as generations 0, 1, 2, ... and publishes each in its
// rendezvous store, which outlives every worker. A worker starts in the
// generation its environment names (KOLO_ELASTIC_GENERATION, with its rank
// in KOLO_RANK); when that generation ends (a rank was lost, or hosts were
// added or removed), the worker tears its Runtime down, leaves the
// generation through Membership::Next(), which tells kolorun why and waits
// for the next generation's assignment, and creates a new Runtime from
// options(). Frontends build commit/restore/sync on top (kolo::torch::elastic,
// kolo.torch.elastic).
//
// Store keys (all set by kolorun unless noted):
//   elastic/generation             the newest generation published
//   elastic/<g>/members            "id rank size local_rank local_size
//                                  cross_rank cross_size" per member, ';'
//                                  between them; "done" when the job is
//                                  finishing and no generation g will form
//   elastic/<g>/closing            why generation g is to re-form (hosts
//                                  added or removed, a rank lost)
//   elastic/<g>/left/<id>          set by worker <id> as it leaves g:
//                                  "<lost rank or -1> <why>"
//
// Thread safety: a Membership is used by one thread at a time;
// FormatMembers/ParseMembers are pure functions, callable from any thread.
//
// Errors: FailedPrecondition for options that are not an elastic job's,
// DeadlineExceeded when the next generation is not published in time,
// InvalidArgument for a malformed members value, the store's own errors
// (Unavailable when kolorun's store is gone).
#ifndef KOLO_ELASTIC_H_
#define KOLO_ELASTIC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kolo/options.h"
#include "kolo/store.h"

namespace kolo {
namespace elastic {

// One worker's place in one generation.
struct Assignment {
  int64_t generation = 0;
  // False: the worker is not part of this generation (its host was removed,
  // or the job is finishing) and should exit.
  bool member = false;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
};

// "id rank size ..." entries of elastic/<g>/members, in the format above.
std::string FormatMembers(
    const std::vector<std::pair<int64_t, Assignment>>& members);
// This worker's assignment in `generation` from the members value (member
// false if `id` is not listed, or the value is "done"). InvalidArgument for
// a malformed value.
absl::StatusOr<Assignment> ParseMembers(const std::string& value,
                                        int64_t generation, int64_t id);

class Membership {
 public:
  // In a worker kolorun started in elastic mode (options.elastic_id >= 0):
  // connects to kolorun's store at the options' rendezvous address.
  // FailedPrecondition when the options are not an elastic job's.
  static absl::StatusOr<std::unique_ptr<Membership>> Connect(
      const Options& options);
  // The same over a given store (tests, or a launcher of one's own).
  static std::unique_ptr<Membership> ForStore(std::shared_ptr<Store> store,
                                              const Options& options);

  // The options of the current generation: those given, with the current
  // placement and generation.
  const Options& options() const { return options_; }
  int64_t generation() const { return options_.generation; }
  int64_t id() const { return options_.elastic_id; }

  // Non-blocking, one store round trip: whether kolorun has asked the
  // current generation to re-form (elastic/<g>/closing is set).
  absl::StatusOr<bool> ReformRequested();

  // Leaves the current generation and waits (up to options'
  // elastic_timeout) for the next one. `why`: OK when the generation ended
  // in agreement (hosts changed), else the error that ended it; its
  // LostRank() tells kolorun which worker to remove. On success options()
  // describes the new generation; a result with member == false means this
  // worker has no place in it. DeadlineExceeded if kolorun publishes none in
  // time (naming the generation waited for).
  absl::StatusOr<Assignment> Next(const absl::Status& why);

 private:
  Membership(std::shared_ptr<Store> store, Options options);

  std::shared_ptr<Store> store_;
  Options options_;
};

}  // namespace elastic
}  // namespace kolo

#endif  // KOLO_ELASTIC_H_
