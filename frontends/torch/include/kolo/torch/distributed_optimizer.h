// DistributedOptimizer: data-parallel training by wrapping any
// torch::optim::Optimizer. It is a torch::optim::Optimizer itself, so it
// goes wherever one is expected: a training function taking
// `torch::optim::Optimizer&`, LibTorch's LR schedulers, checkpoint code.
//
//   kolo::torch::DistributedOptimizer optimizer(
//       std::make_unique<torch::optim::Adam>(model->parameters(), 1e-3),
//       model->named_parameters());
//   loss.backward();      // each gradient's allreduce starts as soon as
//                         // autograd has accumulated it
//   optimizer.step();     // waits for them, then steps the wrapped optimizer
//
// Note [One set of param groups]
// LibTorch 1.13 makes step(), save() and load() virtual and nothing else:
// param_groups(), state(), zero_grad() and the LR schedulers work on the
// Optimizer base's own members. So the DistributedOptimizer holds the
// wrapped optimizer's param groups and state itself (moved out of the
// wrapped one at construction, not copied) and lends them back for the
// length of each step(), save() and load(): there is one set of options and
// state, and a scheduler's lr, a zero_grad(), a state() lookup on the
// DistributedOptimizer reach exactly what the wrapped optimizer steps with.
// In between, the wrapped optimizer (optimizer()) holds none: use the
// DistributedOptimizer.
//
// The gradients' hooks and allreduces are a GradientReducer's
// (gradient_reducer.h: Note [Gradient hooks], Note [No error leaves a
// hook]), shared with the Python frontend. zero_grad() is not virtual: when
// called through an Optimizer& it cannot check that no allreduce is in
// flight (call step() or synchronize() first, as a training loop does).
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
#include <torch/version.h>

#include <memory>
#include <string>

#include "kolo/torch/context.h"
#include "kolo/torch/gradient_reducer.h"

namespace kolo {
namespace torch {

class DistributedOptimizer : public ::torch::optim::Optimizer {
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
  ~DistributedOptimizer() override;
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

  // After an elastic reset: GradientReducer::reset().
  void reset();

  // synchronize() unless done since the last backward pass (or skipped),
  // then the wrapped optimizer's step() (with `closure`, if given).
  at::Tensor step(LossClosure closure = nullptr) override;

  // The wrapped optimizer's save()/load() of the one set of param groups
  // and state (Note [One set of param groups]).
  void save(::torch::serialize::OutputArchive& archive) const override;
  void load(::torch::serialize::InputArchive& archive) override;

  // The wrapped optimizer's zero_grad(), with torch's own default: gradients
  // set to undefined (torch 2.x; set_to_none = true) or zeroed (1.13, whose
  // zero_grad() takes no argument; set_to_none = true undefines them here
  // too). Throws Error while allreduces are in flight (they write into the
  // gradients).
#if TORCH_VERSION_MAJOR >= 2
  void zero_grad(bool set_to_none = true);
#else
  void zero_grad(bool set_to_none = false);
#endif

  // The wrapped optimizer. Between steps it holds no param groups (Note
  // [One set of param groups]).
  ::torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const DistributedOptimizerOptions& options() const { return options_; }

 private:
  // Lends the param groups and state to the wrapped optimizer while alive.
  class Lent;

  std::unique_ptr<::torch::optim::Optimizer> optimizer_;
  DistributedOptimizerOptions options_;
  std::unique_ptr<GradientReducer> reducer_;
};

}  // namespace torch
}  // namespace kolo

#endif  // KOLO_TORCH_DISTRIBUTED_OPTIMIZER_H_
