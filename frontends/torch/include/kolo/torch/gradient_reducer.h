// GradientReducer: the gradient side of data-parallel training, shared by
// DistributedOptimizer (C++) and kolo.torch.DistributedOptimizer (Python):
// hooks that allreduce each parameter's gradient as soon as autograd has
// accumulated it, and the synchronization before an optimizer steps.
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
// Note [No error leaves a hook]: a hook runs inside autograd's engine, which
// may call it on a thread of its own, where an exception ends the process
// (std::terminate). So a hook never throws: an error (a gradient computed
// more often than backward_passes_per_step allows, a sparse gradient in a
// group, a failed submission) is kept, and the next synchronize() (step())
// throws it after every allreduce in flight has finished. The first kept error
// is also written to stderr at once, as a warning: a program that never calls
// step() or synchronize() again would not hear of it otherwise.
//
// Threads: the hooks run on autograd's threads; the other methods are meant
// for the training loop's thread, between backward passes. The object must
// not be destroyed during a backward pass through its parameters (its
// destructor removes the hooks).
#ifndef KOLO_TORCH_GRADIENT_REDUCER_H_
#define KOLO_TORCH_GRADIENT_REDUCER_H_

#include <torch/arg.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/torch/context.h"

namespace kolo {
namespace torch {

enum class Compression {
  kNone,
  // Floating-point gradients travel as float16 / bfloat16 (half the bytes of
  // float32); the runtime combines them in float (rounded to 16 bits once
  // within a host, at each step across hosts: docs/guide.md). The result is
  // cast back into the gradient's own dtype.
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
  // Sparse gradients (e.g. torch::nn::Embedding with sparse(true)) are
  // reduced as Horovod reduces them: every rank's indices and values are
  // allgathered (the gradient's name plus ".indices" and ".values") and
  // summed into one coalesced sparse gradient (divided by the set size for
  // Average; the predivide factor and compression do not apply). A sparse
  // gradient in a group of several is an error. With sparse_as_dense they
  // are converted to dense before the allreduce instead (and stay dense).
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

class GradientReducer {
 public:
  // `parameters`: the trained parameters (leaf tensors that require grad),
  // each once, with their names, in the same order on every rank. Throws
  // Error for invalid options, a duplicate name or a non-leaf tensor.
  GradientReducer(std::vector<std::pair<std::string, at::Tensor>> parameters,
                  DistributedOptimizerOptions options);
  ~GradientReducer();  // Removes the hooks.
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Submits what the hooks have not (gradients of fewer passes, parameters
  // no pass reached: zero-filled, groups not complete), waits for every
  // allreduce and writes the results into the gradients. Throws Error with
  // the first error kept by a hook (Note [No error leaves a hook]) or of an
  // allreduce, after all have finished.
  void synchronize();
  // The next BeforeStep() does not synchronize (for code that called
  // synchronize() itself, e.g. to clip gradients).
  void skip_synchronize();
  // Before the optimizer steps: synchronize() unless done since the last
  // backward pass or skipped. Throws Error (a step after
  // skip_synchronize() with allreduces in flight; synchronize()'s errors).
  void BeforeStep();
  // After the optimizer stepped.
  void AfterStep();
  // Before the optimizer zeroes the gradients: throws Error while
  // allreduces are in flight (they write into the gradients).
  void BeforeZeroGrad();
  // After an elastic reset (kolo::torch::elastic): waits for the
  // allreduces still in flight on the old context (failed or aborted by
  // now), forgets them, the kept error and the passes counted, and uses
  // the new default context (or options.context()).
  void reset();

  const DistributedOptimizerOptions& options() const { return options_; }
  // The gradient names, in order ("grad/fc1.weight", ...).
  std::vector<std::string> names() const;

 private:
  struct State;
  DistributedOptimizerOptions options_;
  // Shared with the hooks, which may run on autograd's threads.
  std::shared_ptr<State> state_;
};

}  // namespace torch
}  // namespace kolo

#endif  // KOLO_TORCH_GRADIENT_REDUCER_H_
