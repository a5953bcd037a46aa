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
// Note [Gradient hooks]: LibTorch 1.13 has no public post-accumulation hook.
// Like DDP's C++ reducer, we add a post hook to each parameter's
// AccumulateGrad node (torch::autograd::impl::grad_accumulator(param)); it
// runs right after param.grad() has been updated by a backward pass. The
// parameter holds its accumulator only weakly, so we keep a reference.
//
// Every gradient is allreduced in place under the name
// `name_prefix + parameter name` ("grad/fc1.weight"), so a model that differs
// between ranks fails with the runtime's mismatch error naming the parameter.
// A parameter whose hook did not fire in a step (unused in the graph on this
// rank) gets a zero gradient at synchronize(), so every rank submits the same
// names and the job never waits for a gradient that will not come; as in
// Horovod, the optimizer then sees a zero (not an undefined) gradient.
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

namespace kolo {
namespace torch {

enum class Compression {
  kNone,
  // Floating-point gradients travel as float16 / bfloat16 (half the bytes of
  // float32); the runtime accumulates them in float. The result is cast back
  // into the gradient's own dtype.
  kFp16,
  kBf16,
};

struct DistributedOptimizerOptions {
  // Average (the default) or Sum over ranks.
  TORCH_ARG(ReduceOp, op) = ReduceOp::kAverage;
  // Gradients of k backward passes are summed locally (autograd's own
  // accumulation) and allreduced once, after the k-th pass; step() after k
  // passes. More than k passes before step() is an error.
  TORCH_ARG(int, backward_passes_per_step) = 1;
  TORCH_ARG(Compression, compression) = Compression::kNone;
  // Average only: gradients are multiplied by 1/f before the sum and by
  // f/size after it (f > 1 guards low-precision sums against overflow).
  TORCH_ARG(double, gradient_predivide_factor) = 1.0;
  // Sparse gradients (e.g. torch::nn::Embedding with sparse(true)) are an
  // error unless true: then they are converted to dense before the
  // allreduce (and stay dense).
  TORCH_ARG(bool, sparse_as_dense) = false;
  // Grouped allreduce: the gradients of a group are submitted together once
  // all of them are ready, and negotiated and fused as one unit. num_groups
  // > 0 splits the parameters, in order, into that many groups of nearly
  // equal count; `groups` lists groups of parameter names (as in
  // named_parameters) explicitly, and parameters in no list are each a group
  // of their own. Set at most one of the two. Default: no grouping, each
  // gradient is submitted as soon as it is ready.
  TORCH_ARG(int, num_groups) = 0;
  TORCH_ARG(std::vector<std::vector<std::string>>, groups);
  // Average/sum over this process set only (Context::add_process_set);
  // only its members may construct the optimizer.
  TORCH_ARG(int, process_set) = kGlobalProcessSet;
  // Gradient names are name_prefix + parameter name. Two
  // DistributedOptimizers used at once on one Context need different
  // prefixes.
  TORCH_ARG(std::string, name_prefix) = "grad/";
  // nullptr: the default context (kolo::torch::init()).
  TORCH_ARG(std::shared_ptr<Context>, context);
};

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
  struct State;

  std::unique_ptr<::torch::optim::Optimizer> optimizer_;
  DistributedOptimizerOptions options_;
  // Shared with the hooks, which may run on autograd's threads.
  std::shared_ptr<State> state_;
};

}  // namespace torch
}  // namespace kolo

#endif  // KOLO_TORCH_DISTRIBUTED_OPTIMIZER_H_
