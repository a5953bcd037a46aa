#include "ops/hierarchical/hierarchical_backend.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "kolo/store.h"
#include "ops/cpu/host_backend.h"
#include "runtime/util/status_macros.h"

namespace kolo {
namespace hierarchical {

Layout MakeLayout(const std::vector<std::string>& hosts, int rank) {
  Layout l;
  std::map<std::string, int> index;
  std::vector<int> count;
  l.host_of.resize(hosts.size());
  l.local_of.resize(hosts.size());
  for (size_t r = 0; r < hosts.size(); ++r) {
    auto [it, fresh] = index.emplace(hosts[r], static_cast<int>(count.size()));
    if (fresh) {
      count.push_back(0);
      l.leaders.push_back(static_cast<int>(r));
    }
    l.host_of[r] = it->second;
    l.local_of[r] = count[it->second]++;
  }
  l.num_hosts = static_cast<int>(count.size());
  l.host = l.host_of[rank];
  l.local_rank = l.local_of[rank];
  l.local_size = count[l.host];
  return l;
}

bool Worthwhile(const std::vector<std::string>& hosts) {
  Layout l = MakeLayout(hosts, 0);
  if (l.num_hosts < 2) return false;
  std::vector<int> count(l.num_hosts, 0);
  for (int h : l.host_of) {
    if (++count[h] > 1) return true;
  }
  return false;
}

namespace {

class HierarchicalBackend : public cpu::HostBackend {
 public:
  HierarchicalBackend(Layout layout, std::unique_ptr<Backend> local,
                      std::unique_ptr<Backend> leaders,
                      std::unique_ptr<Backend> flat)
      : layout_(std::move(layout)),
        local_(std::move(local)),
        leaders_(std::move(leaders)),
        flat_(std::move(flat)) {}

  const char* name() const override { return "shm+gloo"; }

  absl::Status Allreduce(void* data, size_t count, DataType dtype,
                         ReduceOp op) override {
    const size_t bytes = count * DataTypeSize(dtype);
    if (local_) {
      absl::Status s = local_->Allreduce(data, count, dtype, op);
      if (!s.ok()) return Within(s);
    }
    if (leaders_) {
      absl::Status s = leaders_->Allreduce(data, count, dtype, op);
      if (!s.ok()) return Between(s);
    }
    if (local_) {
      absl::Status s = local_->Broadcast(data, bytes, 0);
      if (!s.ok()) return Within(s);
    }
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    const int root_host = layout_.host_of[root];
    if (local_ && layout_.host == root_host) {
      absl::Status s = local_->Broadcast(data, bytes, layout_.local_of[root]);
      if (!s.ok()) return Within(s);
    }
    if (leaders_) {
      absl::Status s = leaders_->Broadcast(data, bytes, root_host);
      if (!s.ok()) return Between(s);
    }
    if (local_ && layout_.host != root_host) {
      absl::Status s = local_->Broadcast(data, bytes, 0);
      if (!s.ok()) return Within(s);
    }
    return absl::OkStatus();
  }

  absl::Status Allgatherv(const void* input, void* output,
                          const std::vector<size_t>& bytes_per_rank) override {
    return flat_->Allgatherv(input, output, bytes_per_rank);
  }

  absl::Status Alltoallv(const void* input, const std::vector<size_t>& send,
                         void* output,
                         const std::vector<size_t>& recv) override {
    return flat_->Alltoallv(input, send, output, recv);
  }

  void Close() override {
    if (local_) local_->Close();
    if (leaders_) leaders_->Close();
    flat_->Close();
  }

 private:
  absl::Status Within(const absl::Status& s) const {
    return absl::Status(s.code(), absl::StrCat("within host ", layout_.host,
                                               " (shm): ", s.message()));
  }
  absl::Status Between(const absl::Status& s) const {
    return absl::Status(
        s.code(), absl::StrCat("between host leaders (gloo): ", s.message()));
  }

  const Layout layout_;
  std::unique_ptr<Backend> local_;    // null when alone on the host
  std::unique_ptr<Backend> leaders_;  // leaders only
  std::unique_ptr<Backend> flat_;     // every rank of the set
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> Create(const BackendContext& context) {
  if (static_cast<int>(context.hosts.size()) != context.size ||
      !context.store) {
    return absl::InvalidArgumentError(
        "the shm+gloo backend needs every rank's host and a store");
  }
  const Layout layout = MakeLayout(context.hosts, context.rank);
  const BackendRegistry& registry = BackendRegistry::Get();

  // 1. Shared memory within the host; then agree on the outcome.
  std::unique_ptr<Backend> local;
  absl::Status local_status;
  if (layout.local_size > 1) {
    BackendContext c = context;
    c.rank = layout.local_rank;
    c.size = layout.local_size;
    c.store = NewPrefixStore(absl::StrCat("host", layout.host), context.store);
    c.all_ranks_on_host = true;
    auto shm = registry.Create(DeviceType::kCpu, "shm", c);
    if (shm.ok()) {
      local = std::move(*shm);
    } else {
      local_status = shm.status();
    }
  }
  KOLO_RETURN_IF_ERROR(context.store->Set(
      absl::StrCat("outcome/", context.rank),
      local_status.ok() ? std::string("ok")
                        : std::string(local_status.message())));
  for (int r = 0; r < context.size; ++r) {
    auto outcome =
        context.store->Get(absl::StrCat("outcome/", r), context.start_timeout);
    if (!outcome.ok()) return outcome.status();
    if (*outcome != "ok") {
      return absl::UnavailableError(
          absl::StrCat("shared memory failed on rank ", r, " (host ",
                       layout.host_of[r], "): ", *outcome));
    }
  }

  // 2. gloo among the host leaders.
  std::unique_ptr<Backend> leaders;
  if (layout.local_rank == 0) {
    BackendContext c = context;
    c.rank = layout.host;
    c.size = layout.num_hosts;
    c.store = NewPrefixStore("leaders", context.store);
    c.all_ranks_on_host = false;
    auto gloo = registry.Create(DeviceType::kCpu, "gloo", c);
    if (!gloo.ok()) return gloo.status();
    leaders = std::move(*gloo);
  }

  // 3. gloo over the whole set, for allgatherv and alltoallv.
  BackendContext c = context;
  c.store = NewPrefixStore("flat", context.store);
  c.all_ranks_on_host = false;
  auto flat = registry.Create(DeviceType::kCpu, "gloo", c);
  if (!flat.ok()) return flat.status();

  return std::unique_ptr<Backend>(new HierarchicalBackend(
      layout, std::move(local), std::move(leaders), std::move(*flat)));
}

namespace {

const BackendRegistrar kRegistrar(
    DeviceType::kCpu, "shm+gloo",
    [](const BackendContext& c) { return Create(c); },
    // The runtime asks for it by name when a set spans hosts with several
    // ranks on some of them and KOLO_SHM is on.
    BackendSelection::kByNameOnly);

}  // namespace
}  // namespace hierarchical
}  // namespace kolo
