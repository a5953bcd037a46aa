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
    : optimizer_(std::move(optimizer)), options_(std::move(options)) {
  if (!optimizer_) throw Invalid("the optimizer is null");
  std::unordered_map<const void*, std::string> names;
  for (const auto& item : named_parameters) {
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  const bool positional = named_parameters.is_empty();
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (NamedParameter& p : OptimizerParameters(*optimizer_, names, positional)) {
    params.emplace_back(std::move(p.name), std::move(p.param));
  }
  reducer_ = std::make_unique<GradientReducer>(std::move(params), options_);
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

void DistributedOptimizer::step() {
  reducer_->BeforeStep();
  optimizer_->step();
  reducer_->AfterStep();
}

void DistributedOptimizer::zero_grad() {
  reducer_->BeforeZeroGrad();
  optimizer_->zero_grad();
}

}  // namespace torch
}  // namespace kolo
