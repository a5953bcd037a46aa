// RuntimeImpl, part two: process sets — registering them, and connecting
// each set's backends (the CPU path when the set is created, the CUDA path
// on its first CUDA response). See runtime_impl.cc for the rest.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/api/work_state.h"
#include "runtime/loop/runtime_impl.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/status_macros.h"

namespace kolo {

void RuntimeImpl::RegisterProcessSet(int id, std::vector<int> ranks) {
  auto set = std::make_shared<ProcessSetState>();
  set->id = id;
  set->ranks = std::move(ranks);
  auto me = std::find(set->ranks.begin(), set->ranks.end(), options_.rank);
  if (me != set->ranks.end())
    set->rank = static_cast<int>(me - set->ranks.begin());
  if (options_.rank == 0) {
    Coordinator::Config config;
    config.process_set = id;
    config.global_ranks = set->ranks;
    config.fusion_threshold_bytes = options_.fusion_threshold_bytes;
    config.cache_capacity = options_.cache_capacity;
    config.timeline = &timeline_;
    set->coordinator = std::make_unique<Coordinator>(std::move(config));
    set->cache = &set->coordinator->cache();
  } else if (set->member()) {
    set->own_cache = std::make_unique<ResponseCache>(options_.cache_capacity);
    set->cache = set->own_cache.get();
  }
  MutexLock lock(&sets_mu_);
  sets_[id] = std::move(set);
}

namespace {

// Whether some host runs more than one of the set's ranks (`hosts`: each
// rank's host identity as published in Start(), "<cross rank>@<hostname>";
// the launcher's cross rank keeps apart "hosts" that share a hostname, as
// network namespaces in tests do).
bool HostsShareRanks(const std::vector<std::string>& hosts) {
  std::set<std::string> seen;
  for (const std::string& h : hosts) {
    if (!seen.insert(h).second) return true;
  }
  return false;
}

}  // namespace

BackendContext RuntimeImpl::SetContext(const ProcessSetState& set,
                                       const std::string& prefix) const {
  BackendContext context;
  context.rank = set.rank;
  context.size = set.size();
  context.store = NewPrefixStore(absl::StrCat(prefix, "/set", set.id), store_);
  context.bind_addr = options_.bind_addr;
  context.start_timeout = options_.start_timeout;
  context.op_timeout = options_.op_timeout;
  context.hierarchical_allreduce = options_.hierarchical_allreduce;
  context.spin_time = options_.spin_time;
  return context;
}

absl::StatusOr<std::vector<std::string>> RuntimeImpl::SetHosts(
    const ProcessSetState& set) const {
  std::vector<std::string> hosts;
  hosts.reserve(set.ranks.size());
  for (int r : set.ranks) {
    auto host = store_->Get(absl::StrCat("host/", r), options_.start_timeout);
    if (!host.ok()) return host.status();
    hosts.push_back(*host);
  }
  return hosts;
}

// CPU backend, with KOLO_SHM on: shm when every rank of the set is on this
// host; shm within hosts and gloo between them ("shm+gloo") when the set
// spans hosts and some host runs several of its ranks; gloo otherwise, and
// also when shared memory cannot start (both factories fail on every rank
// alike, so every rank falls back together).
absl::Status RuntimeImpl::ConnectProcessSet(ProcessSetState& set) {
  if (!set.member()) return absl::OkStatus();
  BackendContext context = SetContext(set, "gloo");
  std::unique_ptr<Backend> chosen;
  const BackendRegistry& registry = BackendRegistry::Get();
  if (options_.shm && registry.Has(DeviceType::kCpu, "shm")) {
    auto hosts = SetHosts(set);
    if (!hosts.ok()) return hosts.status();
    context.hosts = *hosts;
    context.all_ranks_on_host = true;
    for (const std::string& h : *hosts) {
      if (h != hosts->front()) context.all_ranks_on_host = false;
    }
    const char* name = nullptr;
    const char* prefix = nullptr;
    if (context.all_ranks_on_host) {
      name = "shm";
      prefix = "shm";
    } else if (registry.Has(DeviceType::kCpu, "shm+gloo") &&
               HostsShareRanks(*hosts)) {
      name = "shm+gloo";
      prefix = "hier";
    }
    if (name != nullptr) {
      BackendContext shm_context = SetContext(set, prefix);
      shm_context.hosts = context.hosts;
      shm_context.all_ranks_on_host = context.all_ranks_on_host;
      auto shm = registry.Create(DeviceType::kCpu, name, shm_context);
      if (shm.ok()) {
        chosen = std::move(*shm);
      } else if (set.rank == 0) {
        logger_.Warning(absl::StrCat("process set ", set.id,
                                     ": shared memory unavailable (",
                                     shm.status().message(), "); using gloo"));
      }
    }
  }
  if (!chosen) {
    auto backend = BackendRegistry::Get().Create(DeviceType::kCpu, context);
    if (!backend.ok()) return backend.status();
    chosen = std::move(*backend);
  }
  logger_.Info(absl::StrCat("process set ", set.id, ": ", set.size(),
                            " ranks over ", chosen->name()));
  set.backend = std::move(chosen);
  set.executor = std::make_unique<Executor>(
      set.backend.get(), set.rank, set.size(),
      options_.join_average_over_set_size,
      options_.rank == 0 ? &timeline_ : nullptr, nullptr,
      [this](const absl::Status& s) { return ExplainCollectiveFailure(s); });
  set.executor->set_phase_times(options_.phase_times);
  return absl::OkStatus();
}

absl::Status RuntimeImpl::ConnectDevicePath(ProcessSetState& set,
                                            const Device& device) {
  if (set.cuda_executor) return absl::OkStatus();
  BackendContext context = SetContext(set, "cuda");
  context.device = device;
  auto hosts = SetHosts(set);
  if (!hosts.ok()) return hosts.status();
  context.hosts = std::move(*hosts);
  auto backend = BackendRegistry::Get().Create(DeviceType::kCuda, context);
  if (!backend.ok()) {
    return absl::Status(
        backend.status().code(),
        absl::StrCat("process set ", set.id, ": rank ", options_.rank,
                     " cannot start its CUDA backend on ", device.ToString(),
                     ": ", backend.status().message()));
  }
  logger_.Info(absl::StrCat("process set ", set.id, ": CUDA tensors over ",
                            (*backend)->name(), " on ", device.ToString()));
  // The executor reports only while it exists, and ~RuntimeImpl destroys
  // it first (see there): `this` outlives every report.
  auto executor = std::make_unique<Executor>(
      backend->get(), set.rank, set.size(), options_.join_average_over_set_size,
      options_.rank == 0 ? &timeline_ : nullptr,
      [this](const absl::Status& status) { Fatal(status); });
  executor->set_phase_times(options_.phase_times);
  // Fatal() reads them from other threads.
  MutexLock lock(&sets_mu_);
  set.cuda_backend = std::move(*backend);
  set.cuda_executor = std::move(executor);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ProcessSetState>> RuntimeImpl::MemberSet(
    int process_set, const char* op, const std::string& name) const {
  {
    MutexLock lock(&sets_mu_);
    auto it = sets_.find(process_set);
    if (it != sets_.end() && it->second->member()) return it->second;
  }
  return MemberSet(process_set, absl::StrCat(op, " \"", name, "\""));
}

absl::StatusOr<std::shared_ptr<ProcessSetState>> RuntimeImpl::MemberSet(
    int process_set, const std::string& what) const {
  MutexLock lock(&sets_mu_);
  auto it = sets_.find(process_set);
  if (it == sets_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown process set ", process_set));
  }
  if (!it->second->member()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": rank ", options_.rank, " is not a member of process set ",
        process_set, " (ranks ", absl::StrJoin(it->second->ranks, ", "), ")"));
  }
  return it->second;
}

absl::StatusOr<std::vector<int>> RuntimeImpl::SetRanks(int process_set) const {
  MutexLock lock(&sets_mu_);
  auto it = sets_.find(process_set);
  if (it == sets_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown process set ", process_set));
  }
  return it->second->ranks;
}

absl::Status RuntimeImpl::ForgetProcessSet(int id) {
  if (id == kGlobalProcessSet) {
    return absl::InvalidArgumentError(
        "remove_process_set: the global process set (0) cannot be removed");
  }
  std::shared_ptr<ProcessSetState> set;
  {
    MutexLock lock(&sets_mu_);
    auto it = sets_.find(id);
    if (it == sets_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("remove_process_set: unknown process set ", id));
    }
    set = std::move(it->second);
    sets_.erase(it);
  }
  queue_.FailSet(
      id, absl::AbortedError(absl::StrCat("process set ", id, " was removed")));
  if (set->backend) set->backend->Close();
  return absl::OkStatus();
}

absl::Status RuntimeImpl::RemoveProcessSet(int process_set) {
  if (process_set == kGlobalProcessSet) {
    return absl::InvalidArgumentError(
        "remove_process_set: the global process set (0) cannot be removed");
  }
  {
    MutexLock lock(&sets_mu_);
    if (!sets_.count(process_set)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "remove_process_set: unknown process set ", process_set));
    }
  }
  TensorEntry entry;
  entry.request.set_type(wire::REMOVE_PROCESS_SET);
  entry.request.set_name(
      absl::StrCat("__kolo_remove_process_set_", process_set_calls_++));
  entry.request.set_target_process_set(process_set);
  auto work = Submit(std::move(entry));
  if (!work.ok()) return work.status();
  return work->Wait();
}

absl::StatusOr<int> RuntimeImpl::SubmitForValue(TensorEntry entry) {
  auto work = Submit(std::move(entry));
  if (!work.ok()) return work.status();
  KOLO_RETURN_IF_ERROR(work->Wait());
  return static_cast<int>(internal::WorkAccess::State(*work)->value());
}

absl::StatusOr<int> RuntimeImpl::AddProcessSet(const std::vector<int>& ranks) {
  const std::string name =
      absl::StrCat("__kolo_process_set_", process_set_calls_++);
  if (ranks.empty()) {
    return absl::InvalidArgumentError("a process set needs at least one rank");
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= options_.size ||
        (i > 0 && ranks[i] <= ranks[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("process set ranks [", absl::StrJoin(ranks, ", "),
                       "] must be distinct ranks of the job (0 to ",
                       options_.size - 1, "), sorted"));
    }
  }
  TensorEntry entry;
  entry.request.set_type(wire::ADD_PROCESS_SET);
  entry.request.set_name(name);
  for (int r : ranks) entry.request.add_member_ranks(r);
  return SubmitForValue(std::move(entry));
}

// Note [Sets created by their members] in runtime/negotiation/coordinator.cc.
absl::StatusOr<int> RuntimeImpl::AddMemberProcessSet(
    const std::vector<int>& ranks, const std::string& key) {
  if (key.empty()) {
    return absl::InvalidArgumentError(
        "a process set created by its members needs a key that names it");
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= options_.size ||
        (i > 0 && ranks[i] <= ranks[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "process set \"", key, "\": ranks [", absl::StrJoin(ranks, ", "),
          "] must be distinct ranks of the job (0 to ", options_.size - 1,
          "), sorted"));
    }
  }
  if (!std::binary_search(ranks.begin(), ranks.end(), options_.rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("process set \"", key, "\": rank ", options_.rank,
                     " is not one of its ranks [", absl::StrJoin(ranks, ", "),
                     "]; only members create it"));
  }
  TensorEntry entry;
  entry.request.set_type(wire::ADD_MEMBER_PROCESS_SET);
  entry.request.set_name(absl::StrCat("__kolo_member_set_", key));
  for (int r : ranks) entry.request.add_member_ranks(r);
  return SubmitForValue(std::move(entry));
}

}  // namespace kolo
