#include "kolo/elastic.h"

#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "kolo/work.h"
#include "runtime/rendezvous/tcp_store.h"
#include "runtime/util/format.h"

namespace kolo {
namespace elastic {
namespace {

// How long connecting to kolorun's store may take: it listened before the
// worker started.
constexpr absl::Duration kConnectTimeout = absl::Seconds(10);

std::string Key(int64_t generation, absl::string_view what) {
  return absl::StrCat("elastic/", generation, "/", what);
}

}  // namespace

std::string FormatMembers(
    const std::vector<std::pair<int64_t, Assignment>>& members) {
  std::vector<std::string> entries;
  entries.reserve(members.size());
  for (const auto& [id, a] : members) {
    entries.push_back(absl::StrCat(id, " ", a.rank, " ", a.size, " ",
                                   a.local_rank, " ", a.local_size, " ",
                                   a.cross_rank, " ", a.cross_size));
  }
  return absl::StrJoin(entries, ";");
}

absl::StatusOr<Assignment> ParseMembers(const std::string& value,
                                        int64_t generation, int64_t id) {
  Assignment mine;
  mine.generation = generation;
  if (value == "done") return mine;
  for (absl::string_view entry :
       absl::StrSplit(value, ';', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(entry, ' ');
    int64_t fields_id = -1;
    int v[6];
    bool ok = fields.size() == 7 && absl::SimpleAtoi(fields[0], &fields_id);
    for (int i = 0; ok && i < 6; ++i)
      ok = absl::SimpleAtoi(fields[i + 1], &v[i]);
    if (!ok || v[0] < 0 || v[0] >= v[1] || v[2] < 0 || v[2] >= v[3] ||
        v[4] < 0 || v[4] >= v[5]) {
      return absl::InvalidArgumentError(
          absl::StrCat("generation ", generation, ": malformed member entry \"",
                       entry, "\" in the launcher's assignment"));
    }
    if (fields_id != id) continue;
    mine.member = true;
    mine.rank = v[0];
    mine.size = v[1];
    mine.local_rank = v[2];
    mine.local_size = v[3];
    mine.cross_rank = v[4];
    mine.cross_size = v[5];
  }
  return mine;
}

Membership::Membership(std::shared_ptr<Store> store, Options options)
    : store_(std::move(store)), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Membership>> Membership::Connect(
    const Options& options) {
  if (options.elastic_id < 0) {
    return absl::FailedPreconditionError(
        "not an elastic job: KOLO_ELASTIC_ID is unset (start the job with "
        "kolorun --min-np/--max-np/--host-discovery-script)");
  }
  absl::StatusOr<std::shared_ptr<Store>> store = rendezvous::ConnectTcpStore(
      options.rendezvous_addr, options.rendezvous_port, options.secret,
      kConnectTimeout);
  if (!store.ok()) {
    return absl::Status(
        store.status().code(),
        absl::StrCat("elastic worker ", options.elastic_id,
                     ": cannot reach kolorun's store at ",
                     options.rendezvous_addr, ":", options.rendezvous_port,
                     ": ", store.status().message()));
  }
  return ForStore(*std::move(store), options);
}

std::unique_ptr<Membership> Membership::ForStore(std::shared_ptr<Store> store,
                                                 const Options& options) {
  return std::unique_ptr<Membership>(new Membership(std::move(store), options));
}

absl::StatusOr<bool> Membership::ReformRequested() {
  return store_->Check(Key(options_.generation, "closing"));
}

absl::StatusOr<Assignment> Membership::Next(const absl::Status& why) {
  const int64_t current = options_.generation;
  const std::string reason =
      why.ok() ? std::string("re-forming") : std::string(why.message());
  absl::Status left =
      store_->Set(Key(current, absl::StrCat("left/", options_.elastic_id)),
                  absl::StrCat(LostRank(why), " ", reason));
  if (!left.ok()) return left;
  // kolorun publishes generations one after the other; one that was
  // superseded before this worker saw it is skipped.
  int64_t next = current + 1;
  absl::StatusOr<std::string> members =
      store_->Get(Key(next, "members"), options_.elastic_timeout);
  if (!members.ok()) {
    return absl::Status(
        members.status().code(),
        absl::StrCat("elastic worker ", options_.elastic_id, " (rank ",
                     options_.rank, " of generation ", current,
                     "): no generation ", next, " from kolorun within ",
                     FormatSeconds(options_.elastic_timeout),
                     " s: ", members.status().message()));
  }
  // kolorun sets the newest generation's number right after its members.
  absl::StatusOr<bool> numbered = store_->Check("elastic/generation");
  absl::StatusOr<std::string> newest =
      numbered.ok() && *numbered
          ? store_->Get("elastic/generation", absl::Seconds(5))
          : absl::StatusOr<std::string>(absl::NotFoundError("unnumbered"));
  int64_t newest_number = next;
  if (newest.ok() && absl::SimpleAtoi(*newest, &newest_number) &&
      newest_number > next) {
    absl::StatusOr<std::string> latest =
        store_->Get(Key(newest_number, "members"), absl::Seconds(5));
    if (latest.ok()) {
      next = newest_number;
      members = std::move(latest);
    }
  }
  absl::StatusOr<Assignment> mine =
      ParseMembers(*members, next, options_.elastic_id);
  if (!mine.ok()) return mine.status();
  options_.generation = next;
  if (mine->member) {
    options_.rank = mine->rank;
    options_.size = mine->size;
    options_.local_rank = mine->local_rank;
    options_.local_size = mine->local_size;
    options_.cross_rank = mine->cross_rank;
    options_.cross_size = mine->cross_size;
  }
  return mine;
}

}  // namespace elastic
}  // namespace kolo
