// DistributedOptimizer: data-parallel training by wrapping any
// torch::optim::Optimizer.
//
//   kolo::torch::DistributedOptimizer optimizer(
//       std::make_unique<torch::optim::Adam>(model->parameters(), 1e-3),
//       model->named_parameters());
//   loss.backward();      // each gradient's allreduce starts as soon as
//                         // autograd has accumulated it
//   optimizer.step();     // waits for them, then steps the wrapped optimizer
//
// The gradients' hooks and allreduces are a GradientReducer's
// (gradient_reducer.h: Note [Gradient hooks], Note [No error leaves a
// hook]), shared with the Python frontend.
//
// Threads: the hooks run on autograd's threads; step(), synchronize() and
// zero_grad() are meant for the training loop's thread, between backward
// passes. The object must outlive every backward pass through its
// parameters and must not be destroyed during one (its destructor removes
// the hooks).
#ifndef KOLO_TORCH_DISTRIBUTED_OPTIMIZER_H_
#define KOLO_TORCH_DISTRIBUTED_OPTIMIZER_H_

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <memory>
#include <string>

#include "kolo/torch/context.h"
#include "kolo/torch/gradient_reducer.h"

namespace kolo {
namespace torch {

class DistributedOptimizer {
 public:
  // `named_parameters` names every parameter of `optimizer`'s param groups
  // (as Module::named_parameters() does); parameters in it that the
  // optimizer does not own are ignored, and parameters that do not require
  // grad get no hook. Throws Error for invalid options or a parameter of the
  // optimizer that is not named.
  DistributedOptimizer(
      std::unique_ptr<::torch::optim::Optimizer> optimizer,
      const ::torch::OrderedDict<std::string, at::Tensor>& named_parameters,
      DistributedOptimizerOptions options = {});
  // Without names: parameters are named by position ("<group>.<index>"),
  // which makes mismatch errors less telling.
  explicit DistributedOptimizer(
      std::unique_ptr<::torch::optim::Optimizer> optimizer,
      DistributedOptimizerOptions options = {});
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Waits for every gradient's allreduce (submitting those whose hook has
  // not fired, zero-filled where no gradient exists) and writes the results
  // into the parameters' gradients. Throws Error with the runtime's message
  // if any allreduce failed (after all have finished). The next step() does
  // not synchronize again, so gradients may be modified in between
  // (clipping).
  void synchronize();

  // The next step() does not synchronize. For code that synchronizes
  // itself; that step() throws Error if allreduces are still pending.
  void skip_synchronize();

  // synchronize() unless done since the last backward pass (or skipped),
  // then the wrapped optimizer's step().
  void step();

  // The wrapped optimizer's zero_grad(). Throws Error while allreduces are
  // in flight (they write into the gradients).
  void zero_grad();

  ::torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const DistributedOptimizerOptions& options() const { return options_; }

 private:
  std::unique_ptr<::torch::optim::Optimizer> optimizer_;
  DistributedOptimizerOptions options_;
  std::unique_ptr<GradientReducer> reducer_;
};

}  // namespace torch
}  // namespace kolo

#endif  // KOLO_TORCH_DISTRIBUTED_OPTIMIZER_H_
