// Making every rank start from the same state: broadcast of parameters,
// buffers, optimizer state and small objects from one root rank.
//
//   kolo::torch::broadcast_parameters(*model, /*root=*/0);
//   kolo::torch::broadcast_optimizer_state(optimizer, /*root=*/0);
//   int start_epoch = kolo::torch::broadcast_value(resumed_epoch, 0);
//
// Every function is collective (every rank of the context calls it with the
// same root), blocks until done and throws Error on failure. `context`
// nullptr means the default context (kolo::torch::init()).
#ifndef KOLO_TORCH_BROADCAST_H_
#define KOLO_TORCH_BROADCAST_H_

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "kolo/torch/context.h"
#include "kolo/torch/distributed_optimizer.h"

namespace kolo {
namespace torch {

// Overwrites every tensor with root's values, in place (names and shapes
// must agree across ranks; the error of a mismatch names the tensor).
void broadcast_parameters(
    const ::torch::OrderedDict<std::string, at::Tensor>& named_tensors,
    int root = 0, const std::shared_ptr<Context>& context = nullptr);

// A module's parameters and buffers (e.g. BatchNorm running statistics),
// recursively.
void broadcast_parameters(const ::torch::nn::Module& module, int root = 0,
                          const std::shared_ptr<Context>& context = nullptr);

// Gives every rank root's optimizer state: the per-parameter state (also
// where root has created it lazily in its first step() and others have
// not, or the reverse: state root lacks is cleared) and every param group's
// options (learning rate, betas, ...). Works for every optimizer that
// implements save()/load() (SGD, Adam, AdamW, RMSprop, Adagrad, LBFGS): root
// serialises its state, broadcasts the bytes, the others load them. The
// optimizers must have the same parameter groups of the same shapes.
void broadcast_optimizer_state(
    ::torch::optim::Optimizer& optimizer, int root = 0,
    const std::shared_ptr<Context>& context = nullptr);
void broadcast_optimizer_state(
    DistributedOptimizer& optimizer, int root = 0,
    const std::shared_ptr<Context>& context = nullptr);

// An optimizer's state and param-group options as bytes, and back (what
// broadcast_optimizer_state sends; elastic::TorchState keeps its commits
// so). load_optimizer_state throws Error for bytes of an optimizer with
// other param groups.
std::string serialize_optimizer_state(::torch::optim::Optimizer& optimizer);
void load_optimizer_state(const std::string& bytes,
                          ::torch::optim::Optimizer& optimizer);

// Root's bytes on every rank.
std::string broadcast_bytes(const std::string& bytes, int root = 0,
                            const std::shared_ptr<Context>& context = nullptr);

// Root's value on every rank, for anything torch::pickle_save accepts
// (numbers, strings, tensors, lists and dicts of them).
c10::IValue broadcast_object(const c10::IValue& value, int root = 0,
                             const std::shared_ptr<Context>& context = nullptr);

// Root's value of a trivially copyable type (int, double, a plain struct).
template <typename T>
T broadcast_value(const T& value, int root = 0,
                  const std::shared_ptr<Context>& context = nullptr) {
  static_assert(std::is_trivially_copyable<T>::value,
                "broadcast_value needs a trivially copyable type; use "
                "broadcast_object or broadcast_bytes for others");
  std::string bytes(reinterpret_cast<const char*>(&value), sizeof(T));
  bytes = broadcast_bytes(bytes, root, context);
  if (bytes.size() != sizeof(T)) {
    throw Error(absl::StatusCode::kInvalidArgument,
                "broadcast_value: root sent " + std::to_string(bytes.size()) +
                    " bytes for a value of " + std::to_string(sizeof(T)));
  }
  T out;
  std::memcpy(&out, bytes.data(), sizeof(T));
  return out;
}

}  // namespace torch
}  // namespace kolo

#endif  // KOLO_TORCH_BROADCAST_H_
