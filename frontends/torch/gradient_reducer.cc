// GradientReducer: gradient hooks and their allreduces. See Note [Gradient
// hooks] and Note [No error leaves a hook] in gradient_reducer.h.
#include "kolo/torch/gradient_reducer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace torch {
namespace {

Error Invalid(const std::string& message) {
  return Error(absl::StatusCode::kInvalidArgument,
               "DistributedOptimizer: " + message);
}

Error Misuse(const std::string& message) {
  return Error(absl::StatusCode::kFailedPrecondition,
               "DistributedOptimizer: " + message);
}

}  // namespace

struct GradientReducer::State {
  // One parameter and its gradient.
  struct Slot {
    std::string name;  // name_prefix + parameter name
    at::Tensor param;
    // Kept alive: the parameter references its accumulator only weakly, and
    // a new accumulator (without our hook) would replace a freed one. (A
    // std::shared_ptr in torch 1.13, a c10::intrusive_ptr in 2.x.)
    decltype(::torch::autograd::impl::grad_accumulator(
        std::declval<const at::Tensor&>())) accumulator;
    uintptr_t hook_key = 0;
    int passes = 0;    // backward passes since the last synchronize
    at::Tensor wire;   // the compressed gradient in flight (compression only)
    size_t group = 0;  // index into groups
    // A sparse gradient in flight (Note [Sparse gradients]): its shape; the
    // group's handle gathers the indices, `values` the values.
    std::vector<int64_t> sparse_shape;
    Handle values;
  };
  // Gradients submitted together: one allreduce for a group of one, one
  // grouped allreduce otherwise.
  struct Group {
    std::string name;
    std::vector<size_t> members;  // indices into slots
    size_t ready = 0;             // members whose last pass has run
    bool submitted = false;       // in flight
    Handle handle;
  };

  std::shared_ptr<Context> context;
  DistributedOptimizerOptions options;

  Mutex mu;
  // Their sizes are fixed after construction; their elements change under
  // mu (the hooks, synchronize()).
  std::vector<Slot> slots KOLO_GUARDED_BY(mu);
  std::vector<Group> groups KOLO_GUARDED_BY(mu);
  bool synchronized KOLO_GUARDED_BY(mu) = false;  // since the last backward
  bool skip_next KOLO_GUARDED_BY(mu) = false;
  // The first error a hook kept (Note [No error leaves a hook]).
  std::optional<Error> hook_error KOLO_GUARDED_BY(mu);

  // The hook of slot `i`: a backward pass has accumulated its gradient.
  // Never throws.
  void OnAccumulated(size_t i) noexcept {
    MutexLock lock(&mu);
    Slot& slot = slots[i];
    synchronized = false;
    if (++slot.passes > options.backward_passes_per_step()) {
      KeepLocked(Misuse(absl::StrCat(
          "the gradient of \"", slot.name, "\" was computed ", slot.passes,
          " times before the DistributedOptimizer's step() or synchronize(), "
          "more than backward_passes_per_step (",
          options.backward_passes_per_step(),
          "). If you call the wrapped optimizer's own step(), call the "
          "DistributedOptimizer's instead (it waits for the gradients' "
          "allreduces first); to accumulate the gradients of several "
          "backward passes, raise backward_passes_per_step")));
      return;
    }
    if (slot.passes < options.backward_passes_per_step()) return;
    Group& group = groups[slot.group];
    if (++group.ready < group.members.size()) return;
    try {
      SubmitLocked(group);
    } catch (const Error& e) {
      KeepLocked(e);
    } catch (const std::exception& e) {
      KeepLocked(Error(absl::StatusCode::kInternal,
                       absl::StrCat("DistributedOptimizer: submitting \"",
                                    group.name, "\": ", e.what())));
    }
  }

  void KeepLocked(const Error& error) KOLO_REQUIRES(mu) {
    if (hook_error) return;
    hook_error = error;
    // Said at once too: a program that never calls step() or synchronize()
    // again (e.g. one that steps the wrapped optimizer itself) would not
    // hear of it otherwise.
    int rank = -1;
    try {
      rank = context->rank();
    } catch (...) {
    }
    const std::string line =
        absl::StrCat("[kolo rank ", rank, "] WARNING: ", error.what(),
                     " (raised by the next step() or synchronize())\n");
    std::fputs(line.c_str(), stderr);
  }

  // The tensor to allreduce for `slot`: its gradient (zero-filled if no pass
  // reached the parameter, densified if sparse and allowed), or a compressed
  // copy of it.
  at::Tensor WireTensorLocked(Slot& slot) KOLO_REQUIRES(mu) {
    at::Tensor grad = slot.param.grad();
    if (!grad.defined()) {
      grad = at::zeros_like(slot.param, at::MemoryFormat::Contiguous);
      slot.param.mutable_grad() = grad;
    } else if (grad.is_sparse()) {
      if (!options.sparse_as_dense()) {
        throw Invalid(absl::StrCat(
            "\"", slot.name,
            "\" has a sparse gradient in a group of several, which are "
            "allreduced as dense tensors: give it a group of its own or set "
            "sparse_as_dense (DistributedOptimizerOptions().sparse_as_dense("
            "true) in C++, sparse_as_dense=True in Python)"));
      }
      grad = grad.to_dense();
      slot.param.mutable_grad() = grad;
    }
    const at::ScalarType wire_type =
        options.compression() == Compression::kFp16   ? at::kHalf
        : options.compression() == Compression::kBf16 ? at::kBFloat16
                                                      : grad.scalar_type();
    if (at::isFloatingType(grad.scalar_type()) &&
        c10::elementSize(grad.scalar_type()) > c10::elementSize(wire_type)) {
      slot.wire = grad.to(wire_type);
      return slot.wire;
    }
    return grad;
  }

  void SubmitLocked(Group& group) KOLO_REQUIRES(mu) {
    const double f = options.gradient_predivide_factor();
    // Average(x / f) * f == Average(x); the sum itself runs on x / f.
    const double prescale = 1.0 / f, postscale = f;
    if (group.members.size() == 1) {
      Slot& slot = slots[group.members[0]];
      const at::Tensor& grad = slot.param.grad();
      if (grad.defined() && grad.is_sparse() && !options.sparse_as_dense()) {
        SubmitSparseLocked(slot, group);
        return;
      }
      group.handle = context->allreduce_async_(
          WireTensorLocked(slot), AllreduceOptions()
                                      .name(slot.name)
                                      .op(options.op())
                                      .prescale(prescale)
                                      .postscale(postscale)
                                      .process_set(options.process_set()));
    } else {
      std::vector<at::Tensor> tensors;
      std::vector<std::string> names;
      for (size_t i : group.members) {
        tensors.push_back(WireTensorLocked(slots[i]));
        names.push_back(slots[i].name);
      }
      group.handle = context->grouped_allreduce_async_(
          tensors, GroupedAllreduceOptions()
                       .name(group.name)
                       .names(names)
                       .op(options.op())
                       .prescale(prescale)
                       .postscale(postscale)
                       .process_set(options.process_set()));
    }
    group.submitted = true;
  }

  // Note [Sparse gradients]
  // As Horovod's sparse_allreduce_async: the coalesced gradient's indices
  // (transposed, so that rows are entries) and values are allgathered from
  // every rank of the set; FinishSparseLocked concatenates them into one
  // sparse gradient and coalesces it (duplicates summed). Every rank
  // gathers the same entries in the same order, so every rank's coalesced
  // sum is the same bits.
  void SubmitSparseLocked(Slot& slot, Group& group) KOLO_REQUIRES(mu) {
    at::Tensor grad = slot.param.grad().coalesce();
    slot.sparse_shape = grad.sizes().vec();
    group.handle =
        context->allgather_async(grad.indices().t().contiguous(),
                                 AllgatherOptions()
                                     .name(slot.name + ".indices")
                                     .process_set(options.process_set()));
    group.submitted = true;
    slot.values = context->allgather_async(
        grad.values().contiguous(), AllgatherOptions()
                                        .name(slot.name + ".values")
                                        .process_set(options.process_set()));
  }

  void FinishSparseLocked(Slot& slot, Group& group) KOLO_REQUIRES(mu) {
    at::Tensor indices = group.handle.wait().t();
    at::Tensor values = slot.values.wait();
    if (options.op() == ReduceOp::kAverage) {
      const int64_t n = static_cast<int64_t>(
          context->process_set_ranks(options.process_set()).size());
      values = values / n;
    }
    slot.param.mutable_grad() =
        at::sparse_coo_tensor(indices, values, slot.sparse_shape).coalesce();
  }

  bool AnySubmittedLocked() const KOLO_REQUIRES(mu) {
    for (const Group& group : groups) {
      if (group.submitted) return true;
    }
    return false;
  }

  void ResetPassesLocked() KOLO_REQUIRES(mu) {
    for (Slot& slot : slots) slot.passes = 0;
    for (Group& group : groups) group.ready = 0;
  }

  // Partitions the slots into groups (see DistributedOptimizerOptions).
  // `param_names` holds each slot's parameter name (without the prefix).
  void MakeGroups(const std::vector<std::string>& param_names)
      KOLO_REQUIRES(mu) {
    const auto& lists = options.groups();
    const int n = options.num_groups();
    if (n < 0) throw Invalid(absl::StrCat("num_groups must be >= 0, not ", n));
    if (n > 0 && !lists.empty()) {
      throw Invalid("set num_groups or groups, not both");
    }
    std::vector<int> group_of(slots.size(), -1);
    if (n > 0) {
      const size_t count = std::min(slots.size(), static_cast<size_t>(n));
      for (size_t g = 0; g < count; ++g) {
        for (size_t i = g * slots.size() / count;
             i < (g + 1) * slots.size() / count; ++i) {
          group_of[i] = static_cast<int>(g);
        }
      }
    }
    std::unordered_map<std::string, size_t> index;
    for (size_t i = 0; i < param_names.size(); ++i) index[param_names[i]] = i;
    for (size_t g = 0; g < lists.size(); ++g) {
      for (const std::string& name : lists[g]) {
        auto it = index.find(name);
        if (it == index.end()) {
          throw Invalid(absl::StrCat(
              "groups names \"", name,
              "\", which is not a trained parameter of the optimizer"));
        }
        if (group_of[it->second] != -1) {
          throw Invalid(absl::StrCat("groups names \"", name, "\" twice"));
        }
        group_of[it->second] = static_cast<int>(g);
      }
    }
    int next = n > 0 ? std::min(static_cast<int>(slots.size()), n)
                     : static_cast<int>(lists.size());
    for (int& g : group_of) {
      if (g == -1) g = next++;  // a group of its own
    }
    groups.resize(next);
    for (size_t i = 0; i < slots.size(); ++i) {
      slots[i].group = group_of[i];
      groups[group_of[i]].members.push_back(i);
    }
    groups.erase(
        std::remove_if(groups.begin(), groups.end(),
                       [](const Group& g) { return g.members.empty(); }),
        groups.end());
    for (size_t g = 0; g < groups.size(); ++g) {
      groups[g].name = absl::StrCat(options.name_prefix(), "group.", g);
      for (size_t i : groups[g].members) slots[i].group = g;
    }
  }

  // synchronize() with mu held.
  void SynchronizeLocked() KOLO_REQUIRES(mu) {
    // Submit what the hooks have not: gradients of fewer than
    // backward_passes_per_step passes, parameters no pass reached, and
    // groups not complete.
    std::optional<Error> first_error = std::move(hook_error);
    hook_error.reset();
    for (Group& group : groups) {
      if (group.submitted) continue;
      try {
        SubmitLocked(group);
      } catch (const Error& e) {
        if (!first_error) first_error = e;
      }
    }
    // Wait for all of them, even after a failure, so that no allreduce is
    // left writing into a gradient.
    for (Group& group : groups) {
      if (group.submitted) {
        Slot& first = slots[group.members[0]];
        try {
          if (!first.sparse_shape.empty()) {
            FinishSparseLocked(first, group);
          } else {
            group.handle.wait();
          }
          for (size_t i : group.members) {
            Slot& slot = slots[i];
            if (slot.wire.defined()) slot.param.grad().copy_(slot.wire);
          }
        } catch (const Error& e) {
          if (!first_error) first_error = e;
          // The values' allgather too is over before we go on.
          if (!first.sparse_shape.empty()) first.values.block();
        }
      }
      group.submitted = false;
      group.handle = Handle();
      for (size_t i : group.members) {
        slots[i].wire = at::Tensor();
        slots[i].sparse_shape.clear();
        slots[i].values = Handle();
      }
    }
    ResetPassesLocked();
    synchronized = true;
    if (first_error) throw *first_error;
  }
};

GradientReducer::GradientReducer(
    std::vector<std::pair<std::string, at::Tensor>> parameters,
    DistributedOptimizerOptions options)
    : options_(std::move(options)), state_(std::make_shared<State>()) {
  const int k = options_.backward_passes_per_step();
  if (k < 1) {
    throw Invalid(
        absl::StrCat("backward_passes_per_step must be >= 1, not ", k));
  }
  const ReduceOp op = options_.op();
  if (op != ReduceOp::kAverage && op != ReduceOp::kSum) {
    throw Invalid(absl::StrCat("op must be Average or Sum, not ",
                               kolo::ReduceOpName(op)));
  }
  const double f = options_.gradient_predivide_factor();
  if (!(f > 0) || !std::isfinite(f)) {
    throw Invalid(absl::StrCat(
        "gradient_predivide_factor must be positive and finite, not ", f));
  }
  if (f != 1.0 && op != ReduceOp::kAverage) {
    throw Invalid("gradient_predivide_factor applies to op Average only");
  }
  state_->context = options_.context() ? options_.context() : default_context();
  state_->options = options_;

  std::unordered_set<std::string> seen;
  std::vector<std::string> param_names;
  // Nothing shares the state yet (no hook is installed): the lock is for
  // the analysis (Note [Annotated locks]).
  MutexLock lock(&state_->mu);
  state_->slots.resize(parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto& [name, param] = parameters[i];
    if (!seen.insert(name).second) {
      throw Invalid(absl::StrCat("two parameters are named \"", name, "\""));
    }
    state_->slots[i].name = options_.name_prefix() + name;
    state_->slots[i].param = param;
    param_names.push_back(name);
  }
  state_->MakeGroups(param_names);

  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < parameters.size(); ++i) {
    State::Slot& slot = state_->slots[i];
    slot.accumulator = ::torch::autograd::impl::grad_accumulator(slot.param);
    if (!slot.accumulator) {
      throw Invalid(absl::StrCat("\"", param_names[i],
                                 "\" is not a leaf tensor that requires grad: "
                                 "optimizers train leaves (parameters) only"));
    }
    slot.hook_key = slot.accumulator->add_post_hook(
        std::make_unique<::torch::autograd::utils::LambdaPostHook>(
            [weak, i](const ::torch::autograd::variable_list& outputs,
                      const ::torch::autograd::variable_list& /*inputs*/) {
              if (auto state = weak.lock()) state->OnAccumulated(i);
              return outputs;
            }));
  }
}

GradientReducer::~GradientReducer() {
  MutexLock lock(&state_->mu);
  for (State::Slot& slot : state_->slots) {
    if (slot.accumulator && slot.hook_key) {
      slot.accumulator->del_post_hook(slot.hook_key);
    }
  }
}

std::vector<std::string> GradientReducer::names() const {
  std::vector<std::string> out;
  MutexLock lock(&state_->mu);
  for (const State::Slot& slot : state_->slots) out.push_back(slot.name);
  return out;
}

void GradientReducer::synchronize() {
  MutexLock lock(&state_->mu);
  state_->SynchronizeLocked();
}

void GradientReducer::skip_synchronize() {
  MutexLock lock(&state_->mu);
  state_->skip_next = true;
}

void GradientReducer::BeforeStep() {
  MutexLock lock(&state_->mu);
  if (state_->skip_next) {
    state_->skip_next = false;
    if (state_->AnySubmittedLocked()) {
      throw Misuse(
          "step() after skip_synchronize() while gradient allreduces are "
          "in flight: call synchronize() before step()");
    }
    if (state_->hook_error) {
      Error error = *state_->hook_error;
      state_->hook_error.reset();
      throw error;
    }
    state_->ResetPassesLocked();
    return;
  }
  if (!state_->synchronized || state_->hook_error) state_->SynchronizeLocked();
}

void GradientReducer::AfterStep() {
  MutexLock lock(&state_->mu);
  state_->synchronized = false;
}

void GradientReducer::BeforeZeroGrad() {
  MutexLock lock(&state_->mu);
  if (state_->AnySubmittedLocked()) {
    throw Misuse(
        "zero_grad() while gradient allreduces are in flight (after "
        "backward, before step() or synchronize()): they would overwrite "
        "the zeroed gradients");
  }
  state_->ResetPassesLocked();
}

void GradientReducer::reset() {
  MutexLock lock(&state_->mu);
  for (State::Group& group : state_->groups) {
    if (group.submitted) group.handle.block();
    group.submitted = false;
    group.handle = Handle();
    for (size_t i : group.members) {
      State::Slot& slot = state_->slots[i];
      if (!slot.sparse_shape.empty()) slot.values.block();
      slot.values = Handle();
      slot.sparse_shape.clear();
    }
  }
  state_->hook_error.reset();
  state_->ResetPassesLocked();
  state_->synchronized = false;
  state_->skip_next = false;
  state_->context = options_.context() ? options_.context() : default_context();
}

}  // namespace torch
}  // namespace kolo
