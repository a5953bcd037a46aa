#include "kolo/torch/elastic.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kolo/elastic.h"
#include "kolo/runtime.h"
#include "kolo/torch/broadcast.h"
#include "kolo/torch/distributed_optimizer.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace torch {
namespace elastic {
namespace {

struct Module {
  Mutex mu;
  std::unique_ptr<kolo::elastic::Membership> membership KOLO_GUARDED_BY(mu);
  int64_t checks = 0;  // hosts_updated() calls in this generation
};

Module& ModuleState() {
  static auto* module = new Module;
  return *module;
}

// The process's membership, connected on first use from the environment
// of the generation it started in.
kolo::elastic::Membership& GetMembership() {
  Module& m = ModuleState();
  MutexLock lock(&m.mu);
  if (!m.membership) {
    absl::StatusOr<kolo::Options> options =
        kolo::Runtime::OptionsFromEnvironment();
    if (!options.ok()) throw Error(options.status());
    absl::StatusOr<std::unique_ptr<kolo::elastic::Membership>> membership =
        kolo::elastic::Membership::Connect(*options);
    if (!membership.ok()) throw Error(membership.status());
    m.membership = *std::move(membership);
  }
  return *m.membership;
}

std::string FormatValues(const std::map<std::string, int64_t>& values) {
  std::string out;
  for (const auto& [name, value] : values) {
    absl::StrAppend(&out, name, "=", value, "\n");
  }
  return out;
}

std::map<std::string, int64_t> ParseValues(const std::string& text) {
  std::map<std::string, int64_t> values;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const size_t eq = line.rfind('=');
    int64_t value = 0;
    if (eq == absl::string_view::npos ||
        !absl::SimpleAtoi(line.substr(eq + 1), &value)) {
      throw Error(
          absl::StatusCode::kInternal,
          absl::StrCat("elastic state: malformed value \"", line, "\""));
    }
    values[std::string(line.substr(0, eq))] = value;
  }
  return values;
}

}  // namespace

bool enabled() {
  // The environment does not change: read once (runtime/api/config.cc).
  static const bool elastic = [] {
    absl::StatusOr<kolo::Options> options =
        kolo::Runtime::OptionsFromEnvironment();
    return options.ok() && options->elastic_id >= 0;
  }();
  return elastic;
}

int64_t generation() {
  if (!enabled()) return 0;
  return GetMembership().generation();
}

bool hosts_updated() {
  if (!enabled()) return false;
  kolo::elastic::Membership& membership = GetMembership();
  absl::StatusOr<bool> requested = membership.ReformRequested();
  if (!requested.ok()) throw Error(requested.status());
  const int64_t n = ModuleState().checks++;
  at::Tensor flag = at::full({1}, *requested ? 1 : 0, at::kInt);
  at::Tensor agreed = allreduce(
      flag, AllreduceOptions()
                .op(ReduceOp::kMax)
                .name(absl::StrCat("kolo.elastic.hosts_updated.", n)));
  return agreed.item<int>() != 0;
}

bool reset(const std::function<void(kolo::Options*)>& adjust) {
  kolo::elastic::Membership& membership = GetMembership();
  absl::Status why;
  if (is_initialized()) {
    std::shared_ptr<Context> context = default_context();
    why = context->runtime().status();
    // After a failure the others are gone or failing too: nothing to wait
    // for. Otherwise every rank is here (they agreed to re-form).
    if (!why.ok()) context->runtime().Abort();
    context.reset();
    try {
      shutdown();
    } catch (const Error& e) {
      if (why.ok()) why = absl::Status(e.code(), e.what());
    }
  }
  for (;;) {
    absl::StatusOr<kolo::elastic::Assignment> next = membership.Next(why);
    if (!next.ok()) throw Error(next.status());
    ModuleState().checks = 0;
    if (!next->member) return false;
    kolo::Options options = membership.options();
    if (adjust) adjust(&options);
    try {
      init(options);
      return true;
    } catch (const Error& e) {
      // The generation could not form (a member died while it did):
      // leave it too and wait for the one after.
      why = absl::Status(e.code(), e.what());
    }
  }
}

ElasticSampler::ElasticSampler(int64_t size, bool shuffle, uint64_t seed)
    : size_(size),
      shuffle_(shuffle),
      seed_(seed),
      processed_mask_(static_cast<size_t>(size), false) {
  reset();
}

void ElasticSampler::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  processed_.clear();
  processed_mask_.assign(static_cast<size_t>(size_), false);
  recorded_.clear();
  reset();
}

std::vector<int64_t> ElasticSampler::batch(int64_t batch_idx,
                                           int64_t batch_size) const {
  const int64_t n = static_cast<int64_t>(indices_.size());
  const int64_t begin = std::min(n, batch_idx * batch_size);
  const int64_t end = std::min(n, begin + batch_size);
  return std::vector<int64_t>(indices_.begin() + begin, indices_.begin() + end);
}

void ElasticSampler::record_batch(int64_t batch_idx, int64_t batch_size) {
  record_indices(batch(batch_idx, batch_size));
}

void ElasticSampler::record_indices(const std::vector<int64_t>& indices) {
  recorded_.insert(recorded_.end(), indices.begin(), indices.end());
}

void ElasticSampler::reset() {
  const bool joined = is_initialized();
  const int ranks = joined ? size() : 1;
  const int me = joined ? rank() : 0;
  std::vector<int64_t> order(static_cast<size_t>(size_));
  for (int64_t i = 0; i < size_; ++i) order[i] = i;
  if (shuffle_) {
    std::mt19937_64 random(seed_ + static_cast<uint64_t>(epoch_));
    // Fisher-Yates with our own draws: the same order on every rank and
    // every standard library.
    for (int64_t i = size_ - 1; i > 0; --i) {
      const int64_t j =
          static_cast<int64_t>(random() % static_cast<uint64_t>(i + 1));
      std::swap(order[i], order[j]);
    }
  }
  std::vector<int64_t> left;
  for (int64_t i : order) {
    if (!processed_mask_[i]) left.push_back(i);
  }
  indices_.clear();
  if (left.empty()) return;
  const int64_t per_rank =
      (static_cast<int64_t>(left.size()) + ranks - 1) / ranks;
  for (int64_t k = me; k < per_rank * ranks; k += ranks) {
    indices_.push_back(left[k % left.size()]);
  }
}

void ElasticSampler::share_recorded() {
  at::Tensor mine = at::tensor(recorded_, at::kLong);
  at::Tensor all = allgather(mine);
  const int64_t* data = all.data_ptr<int64_t>();
  for (int64_t i = 0; i < all.numel(); ++i) {
    const int64_t index = data[i];
    if (index < 0 || index >= size_ || processed_mask_[index]) continue;
    processed_mask_[index] = true;
    processed_.push_back(index);
  }
  recorded_.clear();
}

std::string ElasticSampler::state() const {
  std::string out = absl::StrCat(epoch_);
  for (int64_t i : processed_) absl::StrAppend(&out, " ", i);
  return out;
}

void ElasticSampler::load_state(const std::string& bytes) {
  std::vector<absl::string_view> fields =
      absl::StrSplit(bytes, ' ', absl::SkipEmpty());
  int64_t epoch = 0;
  if (fields.empty() || !absl::SimpleAtoi(fields[0], &epoch)) {
    throw Error(absl::StatusCode::kInternal, "ElasticSampler: malformed state");
  }
  epoch_ = epoch;
  processed_.clear();
  processed_mask_.assign(static_cast<size_t>(size_), false);
  for (size_t k = 1; k < fields.size(); ++k) {
    int64_t i = -1;
    if (!absl::SimpleAtoi(fields[k], &i) || i < 0 || i >= size_) {
      throw Error(absl::StatusCode::kInternal,
                  "ElasticSampler: malformed state");
    }
    if (!processed_mask_[i]) {
      processed_mask_[i] = true;
      processed_.push_back(i);
    }
  }
  recorded_.clear();
  reset();
}

void State::commit() {
  before_commit();
  save();
  ++commits_;
  check_host_updates();
}

void State::check_host_updates() {
  if (hosts_updated()) throw HostsUpdatedInterrupt();
}

void State::sync() {
  // Who holds the newest state is agreed, never assumed: every rank's
  // commit count, gathered. (Also in a job of one: the broadcast puts the
  // state in the new generation's shape, e.g. re-partitions samplers.)
  at::Tensor mine = at::full({1}, commits_, at::kLong);
  at::Tensor all =
      allgather(mine, AllgatherOptions().name("kolo.elastic.sync.commits"));
  int root = 0;
  int64_t best = -1;
  for (int r = 0; r < all.size(0); ++r) {
    const int64_t c = all[r].item<int64_t>();
    if (c > best) {
      best = c;
      root = r;
    }
  }
  broadcast(root);
  commits_ = best;
  // The state every rank holds now is the one to go back to.
  save();
}

void State::register_reset_callbacks(
    std::vector<std::function<void()>> callbacks) {
  for (auto& callback : callbacks)
    reset_callbacks_.push_back(std::move(callback));
}

void State::on_reset() {
  for (const auto& callback : reset_callbacks_) callback();
}

TorchState::TorchState(::torch::nn::Module& model,
                       ::torch::optim::Optimizer& optimizer,
                       std::map<std::string, int64_t> values)
    : model_(model), optimizer_(optimizer), values_(std::move(values)) {
  // A DistributedOptimizer's allreduces run on the default context, which
  // every reset replaces; its state lives in the optimizer it wraps.
  distributed_ = dynamic_cast<DistributedOptimizer*>(&optimizer_);
  if (distributed_) {
    DistributedOptimizer* distributed = distributed_;
    register_reset_callbacks({[distributed] { distributed->reset(); }});
  }
  save();
}

::torch::optim::Optimizer& TorchState::StateOptimizer() {
  return distributed_ ? distributed_->optimizer() : optimizer_;
}

int64_t TorchState::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    throw Error(absl::StatusCode::kNotFound,
                absl::StrCat("elastic state has no value \"", name, "\""));
  }
  return it->second;
}

void TorchState::set(const std::string& name, int64_t value) {
  values_[name] = value;
}

void TorchState::track(ElasticSampler& sampler) {
  samplers_.push_back(&sampler);
  saved_samplers_.push_back(sampler.state());
}

void TorchState::before_commit() {
  // The samples every rank recorded since the last commit become
  // everyone's: a rank lost later does not take them along.
  for (ElasticSampler* sampler : samplers_) sampler->share_recorded();
}

void TorchState::save() {
  ::torch::NoGradGuard no_grad;
  saved_tensors_.clear();
  for (const at::Tensor& p : model_.parameters(/*recurse=*/true)) {
    saved_tensors_.push_back(p.detach().clone());
  }
  for (const at::Tensor& b : model_.buffers(/*recurse=*/true)) {
    saved_tensors_.push_back(b.detach().clone());
  }
  saved_optimizer_ = serialize_optimizer_state(StateOptimizer());
  saved_values_ = values_;
  saved_samplers_.clear();
  for (ElasticSampler* sampler : samplers_) {
    saved_samplers_.push_back(sampler->state());
  }
}

void TorchState::restore() {
  ::torch::NoGradGuard no_grad;
  size_t i = 0;
  for (const at::Tensor& p : model_.parameters(/*recurse=*/true)) {
    p.copy_(saved_tensors_.at(i++));
  }
  for (const at::Tensor& b : model_.buffers(/*recurse=*/true)) {
    b.copy_(saved_tensors_.at(i++));
  }
  load_optimizer_state(saved_optimizer_, StateOptimizer());
  values_ = saved_values_;
  for (size_t i = 0; i < samplers_.size(); ++i) {
    samplers_[i]->load_state(saved_samplers_.at(i));
  }
}

void TorchState::broadcast(int root) {
  broadcast_parameters(model_, root);
  if (distributed_) {
    broadcast_optimizer_state(*distributed_, root);
  } else {
    broadcast_optimizer_state(optimizer_, root);
  }
  values_ = ParseValues(broadcast_bytes(FormatValues(values_), root));
  for (ElasticSampler* sampler : samplers_) {
    sampler->load_state(broadcast_bytes(sampler->state(), root));
  }
}

bool run(State& state, const std::function<void()>& train) {
  if (!enabled()) {
    train();
    return true;
  }
  bool reset_needed = false;
  for (;;) {
    if (reset_needed) {
      if (!reset()) return false;
      state.on_reset();
    }
    try {
      state.sync();
      train();
      return true;
    } catch (const HostsUpdatedInterrupt&) {
      reset_needed = true;
    } catch (const Error&) {
      // A lost rank (or another failure of the job): back to the last
      // commit, which every survivor holds.
      state.restore();
      reset_needed = true;
    }
  }
}

}  // namespace elastic
}  // namespace torch
}  // namespace kolo
