// Launcher's elastic mode (Note [Elastic launcher] below): methods of
// Launcher (launcher.h) that form the generations of an elastic job; the
// decisions without processes are in elastic.h.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/kolorun/elastic.h"
#include "tools/kolorun/launcher.h"

namespace kolo {
namespace kolorun {

// Note [Elastic launcher]
// In elastic mode kolorun keeps the job going through the loss and arrival
// of workers (Note [Generations of a job] in elastic.h): a worker that fails
// (exits non-zero, dies of a signal, or is reported lost by a survivor: then
// kolorun kills it, since it may be hung) is removed, counted against its
// host (HostBook), and the current generation is asked to re-form
// (elastic/<g>/closing). The discovery script runs every
// --discovery-interval; free slots on hosts not blacklisted, up to
// --max-np, and hosts that disappeared also ask for a re-form. The next
// generation is formed (TryForm) once every member of the current one has
// left or is gone: its assignment is published in the store, survivors read
// it from there, newcomers are started with it in their environment.
// Workers exiting 0 mean the job is finishing: no generation forms after
// that ("done" is published for the next one, so that workers waiting for
// it exit). kolorun fails the job when fewer than --min-np workers remain
// (after --elastic-timeout with a discovery script, at once without one),
// or when the job would re-form more than --reset-limit times. Nothing here
// blocks but the discovery script (bounded by kDiscoveryTimeout).

namespace {

std::string MembersKey(int64_t generation) {
  return absl::StrCat("elastic/", generation, "/members");
}

}  // namespace

void Launcher::ElasticStart() {
  discovered_ = options_.hosts;
  if (discovered_.empty()) {
    discovered_.push_back({"localhost", options_.num_proc});
  }
  for (const HostSlots& host : discovered_) host_order_.push_back(host.name);
  std::vector<std::pair<int64_t, elastic::Assignment>> members;
  for (const RankPlacement& p : plan_.ranks) {
    elastic::Assignment a;
    a.member = true;
    a.rank = p.rank;
    a.size = static_cast<int>(plan_.ranks.size());
    a.local_rank = p.local_rank;
    a.local_size = p.local_size;
    a.cross_rank = p.cross_rank;
    a.cross_size = p.cross_size;
    members.emplace_back(p.rank, a);
  }
  next_id_ = static_cast<int64_t>(plan_.ranks.size());
  absl::Status s = store_->Set(MembersKey(0), elastic::FormatMembers(members));
  if (s.ok()) s = store_->Set("elastic/generation", "0");
  if (!s.ok()) {
    Fail(absl::StrCat("kolorun: cannot publish generation 0: ", s.message()),
         1);
    return;
  }
  if (!options_.host_discovery_script.empty()) {
    discovery_deadline_ = absl::Now() + options_.discovery_interval;
  }
  for (const RankPlacement& placement : plan_.ranks) {
    RankEndpoint endpoint = EndpointFor(placement);
    endpoint.world_size = static_cast<int>(plan_.ranks.size());
    endpoint.elastic_id = placement.rank;
    endpoint.generation = 0;
    if (!Spawn(endpoint)) break;
    workers_.back().elastic_id = placement.rank;
  }
  if (options_.verbose) {
    Log(absl::StrCat("kolorun: elastic job, generation 0: ", plan_.ranks.size(),
                     " workers (--min-np ", options_.min_np, ", --max-np ",
                     options_.max_np, ")"));
  }
}

bool Launcher::ElasticWaiting() const {
  return options_.elastic && phase_ == Phase::kRunning &&
         min_np_deadline_ != absl::InfiniteFuture();
}

void Launcher::RecordHostFailure(const std::string& host) {
  if (!host_book_.RecordFailure(host, absl::Now())) return;
  Log(absl::StrCat(
      "kolorun: host ", host, " is blacklisted ",
      options_.blacklist_cooldown == absl::ZeroDuration()
          ? std::string("for good")
          : absl::StrCat("for ", FormatSeconds(options_.blacklist_cooldown),
                         " s"),
      " after ", kBlacklistFailures,
      " failures of its workers: it gets no new workers until then"));
}

void Launcher::RequestReform(const std::string& reason) {
  if (reform_ || finishing_) return;
  reform_ = true;
  reform_reason_ = reason;
  if (options_.verbose) {
    Log(absl::StrCat("kolorun: generation ", generation_,
                     " re-forms: ", reason));
  }
  store_->Set(absl::StrCat("elastic/", generation_, "/closing"), reason)
      .IgnoreError();  // The local store cannot fail.
}

void Launcher::OnElasticEnd(Worker& worker, bool success,
                            const std::string& what) {
  const bool member = worker.generation == generation_;
  if (success) {
    if (options_.verbose) Log(what);
    if (member && !worker.removed && !finishing_ && !worker.left) {
      // A member finished its training: the job is ending; nobody waits
      // for a generation that will not come.
      finishing_ = true;
      store_->Set(MembersKey(generation_ + 1), "done").IgnoreError();
    }
    TryForm();
    return;
  }
  if (worker.killed) {
    TryForm();
    return;
  }
  if (finishing_) {
    Log(what);
    return;
  }
  const std::string host = worker.placement.host;
  Log(absl::StrCat(what, "; the job goes on without it (elastic)"));
  RecordHostFailure(host);
  RequestReform(what.substr(std::string("kolorun: ").size()));
  TryForm();  // `worker` may move: not used after this.
}

void Launcher::OnElasticStoreChange() {
  // Exits already signalled come first: a worker the others report lost
  // has usually died, and says so itself.
  ReapChildren();
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& worker = workers_[i];
    if (worker.generation != generation_ || worker.left) continue;
    const std::string key =
        absl::StrCat("elastic/", generation_, "/left/", worker.elastic_id);
    absl::StatusOr<bool> set = store_->Check(key);
    if (!set.ok() || !*set) continue;
    absl::StatusOr<std::string> value = store_->Get(key, absl::ZeroDuration());
    if (!value.ok()) continue;
    worker.left = true;
    int lost = -1;
    const size_t space = value->find(' ');
    const std::string reason =
        space == std::string::npos ? *value : value->substr(space + 1);
    if (!absl::SimpleAtoi(value->substr(0, space), &lost)) lost = -1;
    if (options_.verbose) {
      Log(absl::StrCat("kolorun: ", Name(worker, worker.pid),
                       " left generation ", generation_, ": ", reason));
    }
    for (Worker& other : workers_) {
      if (lost < 0 || other.generation != generation_ ||
          other.placement.rank != lost || !other.running || other.left ||
          other.killed || other.reported_lost != absl::InfiniteFuture()) {
        continue;
      }
      other.reported_lost = absl::Now();
      other.lost_report =
          absl::StrCat("was reported lost by rank ", worker.placement.rank,
                       " (", reason, ")");
    }
    RequestReform(reason);
  }
  TryForm();
}

void Launcher::KillLostWorkers() {
  const absl::Time due = absl::Now() - kLostGrace;
  for (Worker& other : workers_) {
    if (other.reported_lost > due) continue;
    other.reported_lost = absl::InfiniteFuture();
    if (!other.running || other.killed) continue;
    // Still running but lost to the others: stopped, hung or cut off.
    Log(absl::StrCat("kolorun: ", Name(other, other.pid), " ",
                     other.lost_report,
                     "; killing it, the job goes on without it (elastic)"));
    other.killed = true;
    if (other.placement.remote) {
      other.stdin_fd.reset();
    } else {
      SignalWorker(other.pid, other.running, SIGKILL);
    }
    RecordHostFailure(other.placement.host);
  }
}

std::vector<std::pair<std::string, int>> Launcher::FreeSlots() const {
  std::vector<std::pair<std::string, int>> free;
  if (options_.host_discovery_script.empty()) return free;  // Static hosts.
  const absl::Time now = absl::Now();
  for (const HostSlots& host : discovered_) {
    if (host_book_.Blacklisted(host.name, now)) continue;
    int used = 0;
    for (const Worker& w : workers_) {
      if (w.running && !w.removed && !w.killed && w.placement.host == host.name)
        ++used;
    }
    if (host.slots > used) free.emplace_back(host.name, host.slots - used);
  }
  return free;
}

void Launcher::OnDiscovery() {
  discovery_deadline_ = absl::Now() + options_.discovery_interval;
  absl::StatusOr<std::string> output =
      RunDiscoveryScript(options_.host_discovery_script, kDiscoveryTimeout);
  absl::StatusOr<std::vector<HostSlots>> hosts =
      output.ok() ? ParseDiscoveryOutput(*output, options_.slots_per_host)
                  : absl::StatusOr<std::vector<HostSlots>>(output.status());
  if (!hosts.ok()) {
    // The hosts stay as they were; said once per kind of trouble.
    const std::string message =
        absl::StrCat("kolorun: ", hosts.status().message(),
                     "; keeping the hosts it printed last");
    if (message != last_discovery_error_) Log(message);
    last_discovery_error_ = message;
    return;
  }
  last_discovery_error_.clear();
  std::vector<std::string> changes;
  for (const HostSlots& host : *hosts) {
    if (std::find(host_order_.begin(), host_order_.end(), host.name) ==
        host_order_.end()) {
      host_order_.push_back(host.name);
    }
  }
  // Workers beyond what a host now offers (all of them for a host no longer
  // printed) leave: the newest first.
  for (const HostSlots& old : discovered_) {
    auto now_host =
        std::find_if(hosts->begin(), hosts->end(),
                     [&](const HostSlots& h) { return h.name == old.name; });
    const int slots = now_host == hosts->end() ? 0 : now_host->slots;
    std::vector<Worker*> on_host;
    for (Worker& w : workers_) {
      if (w.running && !w.removed && !w.killed && w.placement.host == old.name)
        on_host.push_back(&w);
    }
    for (int i = static_cast<int>(on_host.size()) - 1; i >= slots; --i) {
      on_host[i]->removed = true;
      changes.push_back(absl::StrCat(
          Name(*on_host[i], on_host[i]->pid), " leaves (host ", old.name,
          slots == 0 ? " removed" : " has fewer slots", ")"));
    }
  }
  discovered_ = *std::move(hosts);
  int running = 0;
  for (const Worker& w : workers_) {
    if (w.running && !w.removed && !w.killed) ++running;
  }
  int free = 0;
  for (const auto& [host, slots] : FreeSlots()) free += slots;
  if (free > 0 && running < options_.max_np) {
    changes.push_back(absl::StrCat(std::min(free, options_.max_np - running),
                                   " new slot", free == 1 ? "" : "s"));
  }
  if (!changes.empty()) {
    if (!reform_ && options_.verbose) {
      Log(absl::StrCat("kolorun: hosts changed: ",
                       absl::StrJoin(changes, ", ")));
    }
    RequestReform(
        absl::StrCat("hosts changed: ", absl::StrJoin(changes, ", ")));
  }
  TryForm();
}

void Launcher::TryForm() {
  if (!reform_ || finishing_ || phase_ != Phase::kRunning) return;
  for (const Worker& w : workers_) {
    if (w.generation == generation_ && w.running && !w.left) return;
  }
  std::vector<Candidate> candidates;
  std::vector<size_t> survivors;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = workers_[i];
    if (w.generation != generation_ || !w.running || w.removed || w.killed)
      continue;
    candidates.push_back({w.elastic_id, w.placement.host, w.placement.rank});
    survivors.push_back(i);
  }
  std::vector<int64_t> newcomer_ids;
  for (const auto& [host, slots] : FreeSlots()) {
    for (int k = 0; k < slots; ++k) {
      if (static_cast<int>(candidates.size()) >= options_.max_np) break;
      const int64_t id = next_id_ + static_cast<int64_t>(newcomer_ids.size());
      candidates.push_back({id, host, -1});
      newcomer_ids.push_back(id);
    }
  }
  const int count = static_cast<int>(candidates.size());
  if (count < options_.min_np) {
    const absl::Time now = absl::Now();
    if (!options_.host_discovery_script.empty() &&
        min_np_deadline_ == absl::InfiniteFuture()) {
      min_np_deadline_ = now + options_.elastic_timeout;
      Log(absl::StrCat("kolorun: ", count, " worker", count == 1 ? "" : "s",
                       " left, fewer than --min-np ", options_.min_np,
                       "; waiting up to ",
                       FormatSeconds(options_.elastic_timeout),
                       " s (--elastic-timeout) for the discovery script to "
                       "offer more slots"));
      return;
    }
    if (now < min_np_deadline_ && min_np_deadline_ != absl::InfiniteFuture())
      return;
    min_np_deadline_ = absl::InfiniteFuture();
    Fail(
        absl::StrCat("kolorun: only ", count, " worker", count == 1 ? "" : "s",
                     " left, fewer than --min-np ", options_.min_np,
                     options_.host_discovery_script.empty()
                         ? ""
                         : absl::StrCat(", and no slots were added within ",
                                        FormatSeconds(options_.elastic_timeout),
                                        " s (--elastic-timeout)"),
                     "; the job ends after: ", reform_reason_),
        1);
    return;
  }
  min_np_deadline_ = absl::InfiniteFuture();
  if (options_.reset_limit >= 0 && resets_ >= options_.reset_limit) {
    Fail(absl::StrCat("kolorun: the job re-formed ", resets_, " time",
                      resets_ == 1 ? "" : "s", " already (--reset-limit ",
                      options_.reset_limit,
                      "); it ends after: ", reform_reason_),
         1);
    return;
  }
  ++resets_;
  const int64_t generation = generation_ + 1;
  const std::vector<std::pair<int64_t, elastic::Assignment>> assignments =
      AssignRanks(candidates, host_order_, generation);
  // The store keeps the old generation's keys: a worker that has not read
  // them yet still finds them.
  store_->Set(MembersKey(generation), elastic::FormatMembers(assignments))
      .IgnoreError();
  store_->Set("elastic/generation", absl::StrCat(generation)).IgnoreError();
  generation_ = generation;
  reform_ = false;
  const std::string why = reform_reason_;
  reform_reason_.clear();
  next_id_ += static_cast<int64_t>(newcomer_ids.size());

  auto placement_of = [&](int64_t id, const std::string& host) {
    RankPlacement p;
    for (const auto& [member, a] : assignments) {
      if (member != id) continue;
      p.rank = a.rank;
      p.local_rank = a.local_rank;
      p.local_size = a.local_size;
      p.cross_rank = a.cross_rank;
      p.cross_size = a.cross_size;
    }
    p.host = host;
    p.remote = !IsLocalHost(host);
    return p;
  };
  for (size_t i : survivors) {
    Worker& w = workers_[i];
    w.placement = placement_of(w.elastic_id, w.placement.host);
    w.generation = generation;
    w.left = false;
    w.out->set_rank(w.placement.rank);
    w.err->set_rank(w.placement.rank);
  }
  Log(absl::StrCat("kolorun: generation ", generation, ": ", count, " worker",
                   count == 1 ? "" : "s",
                   newcomer_ids.empty()
                       ? std::string()
                       : absl::StrCat(" (", newcomer_ids.size(), " new)"),
                   ", after: ", why));
  for (int64_t id : newcomer_ids) {
    std::string host;
    for (const Candidate& c : candidates) {
      if (c.id == id) host = c.host;
    }
    RankEndpoint endpoint = EndpointFor(placement_of(id, host));
    endpoint.world_size = count;
    endpoint.elastic_id = id;
    endpoint.generation = generation;
    if (endpoint.placement.remote &&
        absl::StartsWith(plan_.store_addr, "127.")) {
      Fail(absl::StrCat("kolorun: cannot start a worker on ", host,
                        ": kolorun's store listens on ", plan_.store_addr,
                        ", which ", host,
                        " cannot reach; start elastic jobs "
                        "whose discovery script may add other hosts with "
                        "--network-interface NAME"),
           1);
      return;
    }
    if (endpoint.placement.remote && plan_.guard_path.empty()) {
      Fail(absl::StrCat("kolorun: cannot start a worker on ", host,
                        ": kolo_rank_guard was not found next to kolorun"),
           1);
      return;
    }
    // Messages name hosts from now on.
    if (endpoint.placement.remote) grew_beyond_host_ = true;
    if (!Spawn(endpoint)) return;
    workers_.back().elastic_id = id;
    workers_.back().generation = generation;
  }
}

}  // namespace kolorun
}  // namespace kolo
