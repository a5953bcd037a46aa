// DistributedOptimizer: a wrapped optimizer and a GradientReducer over its
// parameters.
#include "kolo/torch/distributed_optimizer.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kolo {
namespace torch {
namespace {

Error Invalid(const std::string& message) {
  return Error(absl::StatusCode::kInvalidArgument,
               "DistributedOptimizer: " + message);
}

struct NamedParameter {
  std::string name;
  at::Tensor param;
};

// The optimizer's parameters that need gradients, in param-group order,
// each once (tied weights appear in several places), with their names.
// `names` maps TensorImpl* to name; empty = name by position.
std::vector<NamedParameter> OptimizerParameters(
    const ::torch::optim::Optimizer& optimizer,
    const std::unordered_map<const void*, std::string>& names,
    bool positional) {
  std::vector<NamedParameter> out;
  std::unordered_set<const void*> seen;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) {
        continue;
      }
      if (positional) {
        out.push_back({absl::StrCat(g, ".", i), p});
        continue;
      }
      auto it = names.find(p.unsafeGetTensorImpl());
      if (it == names.end()) {
        throw Invalid(absl::StrCat(
            "parameter ", i, " of param group ", g, " (shape ",
            absl::StrJoin(p.sizes().vec(), "x"),
            ") is not in named_parameters: pass the named_parameters() of "
            "every module the optimizer trains"));
      }
      out.push_back({it->second, p});
    }
  }
  return out;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(
    std::unique_ptr<::torch::optim::Optimizer> optimizer,
    const ::torch::OrderedDict<std::string, at::Tensor>& named_parameters,
    DistributedOptimizerOptions options)
    : ::torch::optim::Optimizer(
          std::vector<::torch::optim::OptimizerParamGroup>{},
          optimizer ? optimizer->defaults().clone() : nullptr),
      optimizer_(std::move(optimizer)),
      options_(std::move(options)) {
  if (!optimizer_) throw Invalid("the optimizer is null");
  std::unordered_map<const void*, std::string> names;
  for (const auto& item : named_parameters) {
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  const bool positional = named_parameters.is_empty();
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (NamedParameter& p :
       OptimizerParameters(*optimizer_, names, positional)) {
    params.emplace_back(std::move(p.name), std::move(p.param));
  }
  reducer_ = std::make_unique<GradientReducer>(std::move(params), options_);
  // Note [One set of param groups]: from here on they are ours.
  std::swap(param_groups_, optimizer_->param_groups());
  std::swap(state_, optimizer_->state());
}

DistributedOptimizer::DistributedOptimizer(
    std::unique_ptr<::torch::optim::Optimizer> optimizer,
    DistributedOptimizerOptions options)
    : DistributedOptimizer(std::move(optimizer),
                           ::torch::OrderedDict<std::string, at::Tensor>(),
                           std::move(options)) {}

DistributedOptimizer::~DistributedOptimizer() = default;

void DistributedOptimizer::synchronize() { reducer_->synchronize(); }

void DistributedOptimizer::skip_synchronize() { reducer_->skip_synchronize(); }

void DistributedOptimizer::reset() { reducer_->reset(); }

// Note [One set of param groups]: the wrapped optimizer holds them while a
// Lent lives, also if its step() throws.
class DistributedOptimizer::Lent {
 public:
  explicit Lent(const DistributedOptimizer& owner)
      : owner_(const_cast<DistributedOptimizer&>(owner)) {
    Swap();
  }
  ~Lent() { Swap(); }
  Lent(const Lent&) = delete;
  Lent& operator=(const Lent&) = delete;

 private:
  void Swap() {
    std::swap(owner_.param_groups_, owner_.optimizer_->param_groups());
    std::swap(owner_.state_, owner_.optimizer_->state());
  }
  DistributedOptimizer& owner_;
};

at::Tensor DistributedOptimizer::step(LossClosure closure) {
  reducer_->BeforeStep();
  at::Tensor loss;
  {
    Lent lent(*this);
    loss = optimizer_->step(std::move(closure));
  }
  reducer_->AfterStep();
  return loss;
}

void DistributedOptimizer::save(
    ::torch::serialize::OutputArchive& archive) const {
  Lent lent(*this);
  optimizer_->save(archive);
}

void DistributedOptimizer::load(::torch::serialize::InputArchive& archive) {
  Lent lent(*this);
  optimizer_->load(archive);
}

void DistributedOptimizer::zero_grad(bool set_to_none) {
  reducer_->BeforeZeroGrad();
#if TORCH_VERSION_MAJOR >= 2
  ::torch::optim::Optimizer::zero_grad(set_to_none);
#else
  if (!set_to_none) {
    ::torch::optim::Optimizer::zero_grad();
    return;
  }
  for (auto& group : param_groups()) {
    for (auto& p : group.params()) {
      if (p.mutable_grad().defined()) p.mutable_grad().reset();
    }
  }
#endif
}

}  // namespace torch
}  // namespace kolo
