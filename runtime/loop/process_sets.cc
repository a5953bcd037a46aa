#include "runtime/loop/process_sets.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kolo {

absl::Status ProcessSets::Start(std::shared_ptr<Store> store) {
  store_ = std::move(store);
  std::vector<int> all(context_.options->size);
  for (int r = 0; r < context_.options->size; ++r) all[r] = r;
  auto global = Create(kGlobalProcessSet, std::move(all));
  if (!global.ok()) return global.status();
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ProcessSetState>> ProcessSets::Create(
    int id, std::vector<int> ranks) {
  const Options& options = *context_.options;
  auto set = std::make_shared<ProcessSetState>();
  set->id = id;
  set->ranks = std::move(ranks);
  auto me = std::find(set->ranks.begin(), set->ranks.end(), options.rank);
  if (me != set->ranks.end())
    set->rank = static_cast<int>(me - set->ranks.begin());
  if (options.rank == 0) {
    Coordinator::Config config;
    config.process_set = id;
    config.global_ranks = set->ranks;
    config.fusion_threshold_bytes = options.fusion_threshold_bytes;
    config.cache_capacity = options.cache_capacity;
    config.timeline = context_.timeline;
    set->coordinator = std::make_unique<Coordinator>(std::move(config));
    set->cache = &set->coordinator->cache();
  } else if (set->member()) {
    set->own_cache = std::make_unique<ResponseCache>(options.cache_capacity);
    set->cache = set->own_cache.get();
  }
  {
    MutexLock lock(&mu_);
    sets_[id] = set;
  }
  if (id == kGlobalProcessSet) global_ = set.get();
  absl::Status connected = Connect(*set);
  if (!connected.ok()) return connected;
  return set;
}

absl::StatusOr<std::shared_ptr<ProcessSetState>> ProcessSets::Remove(int id) {
  if (id == kGlobalProcessSet) {
    return absl::InvalidArgumentError(
        "remove_process_set: the global process set (0) cannot be removed");
  }
  MutexLock lock(&mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("remove_process_set: unknown process set ", id));
  }
  std::shared_ptr<ProcessSetState> set = std::move(it->second);
  sets_.erase(it);
  return set;
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

BackendContext ProcessSets::BackendContextOf(const ProcessSetState& set,
                                             const std::string& prefix) const {
  const Options& options = *context_.options;
  BackendContext context;
  context.rank = set.rank;
  context.size = set.size();
  context.store = NewPrefixStore(absl::StrCat(prefix, "/set", set.id), store_);
  context.bind_addr = options.bind_addr;
  context.start_timeout = options.start_timeout;
  context.op_timeout = options.op_timeout;
  context.hierarchical_allreduce = options.hierarchical_allreduce;
  context.spin_time = options.spin_time;
  return context;
}

absl::StatusOr<std::vector<std::string>> ProcessSets::Hosts(
    const ProcessSetState& set) const {
  std::vector<std::string> hosts;
  hosts.reserve(set.ranks.size());
  for (int r : set.ranks) {
    auto host =
        store_->Get(absl::StrCat("host/", r), context_.options->start_timeout);
    if (!host.ok()) return host.status();
    hosts.push_back(*host);
  }
  return hosts;
}

// Note [The CPU path of a set]
// With KOLO_SHM on: shm when every rank of the set is on this host; shm
// within hosts and gloo between them ("shm+gloo") when the set spans hosts
// and some host runs several of its ranks; gloo otherwise, and also when
// shared memory cannot start (both factories fail on every rank alike, so
// every rank falls back together).
absl::Status ProcessSets::Connect(ProcessSetState& set) {
  if (!set.member()) return absl::OkStatus();
  const Options& options = *context_.options;
  BackendContext context = BackendContextOf(set, "gloo");
  std::unique_ptr<Backend> chosen;
  const BackendRegistry& registry = BackendRegistry::Get();
  if (options.shm && registry.Has(DeviceType::kCpu, "shm")) {
    auto hosts = Hosts(set);
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
      BackendContext shm_context = BackendContextOf(set, prefix);
      shm_context.hosts = context.hosts;
      shm_context.all_ranks_on_host = context.all_ranks_on_host;
      auto shm = registry.Create(DeviceType::kCpu, name, shm_context);
      if (shm.ok()) {
        chosen = std::move(*shm);
      } else if (set.rank == 0) {
        context_.logger->Warning(absl::StrCat(
            "process set ", set.id, ": shared memory unavailable (",
            shm.status().message(), "); using gloo"));
      }
    }
  }
  if (!chosen) {
    auto backend = BackendRegistry::Get().Create(DeviceType::kCpu, context);
    if (!backend.ok()) return backend.status();
    chosen = std::move(*backend);
  }
  context_.logger->Info(absl::StrCat("process set ", set.id, ": ", set.size(),
                                     " ranks over ", chosen->name()));
  set.backend = std::move(chosen);
  set.executor = std::make_unique<Executor>(
      set.backend.get(), set.rank, set.size(),
      options.join_average_over_set_size,
      options.rank == 0 ? context_.timeline : nullptr, nullptr,
      context_.explain_failure);
  set.executor->set_phase_times(options.phase_times);
  return absl::OkStatus();
}

absl::Status ProcessSets::ConnectDevicePath(ProcessSetState& set,
                                            const Device& device) {
  if (set.cuda_executor) return absl::OkStatus();
  const Options& options = *context_.options;
  BackendContext context = BackendContextOf(set, "cuda");
  context.device = device;
  auto hosts = Hosts(set);
  if (!hosts.ok()) return hosts.status();
  context.hosts = std::move(*hosts);
  auto backend = BackendRegistry::Get().Create(DeviceType::kCuda, context);
  if (!backend.ok()) {
    return absl::Status(
        backend.status().code(),
        absl::StrCat("process set ", set.id, ": rank ", options.rank,
                     " cannot start its CUDA backend on ", device.ToString(),
                     ": ", backend.status().message()));
  }
  context_.logger->Info(absl::StrCat("process set ", set.id,
                                     ": CUDA tensors over ", (*backend)->name(),
                                     " on ", device.ToString()));
  // The executor reports only while it exists, and DestroyDevicePaths
  // destroys it before what the report reaches.
  auto executor = std::make_unique<Executor>(
      backend->get(), set.rank, set.size(), options.join_average_over_set_size,
      options.rank == 0 ? context_.timeline : nullptr, context_.fatal);
  executor->set_phase_times(options.phase_times);
  // Close() reads them from other threads.
  MutexLock lock(&mu_);
  set.cuda_backend = std::move(*backend);
  set.cuda_executor = std::move(executor);
  return absl::OkStatus();
}

std::shared_ptr<ProcessSetState> ProcessSets::Find(int id) const {
  MutexLock lock(&mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

std::map<int, std::shared_ptr<ProcessSetState>> ProcessSets::All() const {
  MutexLock lock(&mu_);
  return sets_;
}

absl::StatusOr<std::shared_ptr<ProcessSetState>> ProcessSets::Member(
    int id, const char* op, const std::string& name) const {
  {
    MutexLock lock(&mu_);
    auto it = sets_.find(id);
    if (it != sets_.end() && it->second->member()) return it->second;
  }
  return Member(id, absl::StrCat(op, " \"", name, "\""));
}

absl::StatusOr<std::shared_ptr<ProcessSetState>> ProcessSets::Member(
    int id, const std::string& what) const {
  MutexLock lock(&mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown process set ", id));
  }
  if (!it->second->member()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", context_.options->rank,
                     " is not a member of process set ", id, " (ranks ",
                     absl::StrJoin(it->second->ranks, ", "), ")"));
  }
  return it->second;
}

absl::StatusOr<std::vector<int>> ProcessSets::Ranks(int id) const {
  MutexLock lock(&mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown process set ", id));
  }
  return it->second->ranks;
}

void ProcessSets::Close(const absl::Status& status) {
  std::vector<std::shared_ptr<ProcessSetState>> sets;
  std::vector<std::pair<Executor*, Backend*>> device_paths;
  {
    MutexLock lock(&mu_);
    for (auto& [id, set] : sets_) {
      sets.push_back(set);
      if (set->cuda_executor) {
        device_paths.emplace_back(set->cuda_executor.get(),
                                  set->cuda_backend.get());
      }
    }
  }
  for (auto& set : sets) {
    if (set->backend) set->backend->Close();
  }
  // Collectives already queued on a device fail now; the backend aborts
  // its communicators so that nothing waits on them any more.
  for (auto& [executor, backend] : device_paths) {
    executor->FailPending(status);
    backend->Close();
  }
}

void ProcessSets::DestroyDevicePaths() {
  std::vector<std::pair<std::unique_ptr<Executor>, std::unique_ptr<Backend>>>
      device_paths;
  {
    MutexLock lock(&mu_);
    for (auto& [id, set] : sets_) {
      if (set->cuda_executor) {
        device_paths.emplace_back(std::move(set->cuda_executor),
                                  std::move(set->cuda_backend));
      }
    }
  }
  for (auto& [executor, backend] : device_paths) {
    executor.reset();
    backend.reset();
  }
}

int64_t ProcessSets::buffer_bytes() const {
  int64_t bytes = 0;
  MutexLock lock(&mu_);
  for (const auto& [id, set] : sets_) {
    if (set->executor) bytes += set->executor->buffer_bytes();
  }
  return bytes;
}

void ProcessSets::AddCounters(std::map<std::string, int64_t>* counters) const {
  int64_t requests_received = 0, cache_hits_received = 0;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, set] : sets_) {
      if (set->coordinator) {
        requests_received += set->coordinator->requests_received();
        cache_hits_received += set->coordinator->cache_hits_received();
      }
    }
  }
  (*counters)["coordinator.requests_received"] = requests_received;
  (*counters)["coordinator.cache_hits_received"] = cache_hits_received;
}

}  // namespace kolo
