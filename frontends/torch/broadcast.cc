// Broadcast of parameters, buffers, optimizer state and objects.
#include "kolo/torch/broadcast.h"

#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kolo {
namespace torch {
namespace {

std::shared_ptr<Context> Resolve(const std::shared_ptr<Context>& context) {
  return context ? context : default_context();
}

// Broadcasts every tensor in place, all in flight at once (the runtime fuses
// them), and waits for all before reporting the first failure.
void BroadcastInPlace(
    const std::vector<std::pair<std::string, at::Tensor>>& named, int root,
    Context& context) {
  std::vector<Handle> handles;
  handles.reserve(named.size());
  for (const auto& [name, tensor] : named) {
    handles.push_back(context.broadcast_async_(
        tensor, BroadcastOptions().name(name).root(root)));
  }
  std::optional<Error> first_error;
  for (const Handle& handle : handles) {
    try {
      handle.wait();
    } catch (const Error& e) {
      if (!first_error) first_error = e;
    }
  }
  if (first_error) throw *first_error;
}

}  // namespace

namespace {
constexpr char kStateKey[] = "state";
constexpr char kGroupsKey[] = "groups";
constexpr char kOptionsKey[] = "options/";
}  // namespace

// Root's optimizer state and param-group options, serialised. Optimizer::load
// restores the state but (in LibTorch 1.13) drops the saved options, so they
// travel separately.
std::string serialize_optimizer_state(::torch::optim::Optimizer& optimizer) {
  ::torch::serialize::OutputArchive archive;
  ::torch::serialize::OutputArchive state(archive.compilation_unit());
  optimizer.save(state);
  archive.write(kStateKey, state);
  auto& groups = optimizer.param_groups();
  archive.write(kGroupsKey,
                at::tensor(static_cast<int64_t>(groups.size()), at::kLong));
  for (size_t i = 0; i < groups.size(); ++i) {
    ::torch::serialize::OutputArchive options(archive.compilation_unit());
    groups[i].options().serialize(options);
    archive.write(absl::StrCat(kOptionsKey, i), options);
  }
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_optimizer_state(const std::string& bytes,
                          ::torch::optim::Optimizer& optimizer) {
  ::torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  at::Tensor num_groups;
  archive.read(kGroupsKey, num_groups);
  auto& groups = optimizer.param_groups();
  if (num_groups.item<int64_t>() != static_cast<int64_t>(groups.size())) {
    throw Error(absl::StatusCode::kInvalidArgument,
                absl::StrCat("broadcast_optimizer_state: root's optimizer has ",
                             num_groups.item<int64_t>(),
                             " param groups, this rank's has ", groups.size()));
  }
  // load() only adds the entries root has: clear ours first, so that state
  // root has not created yet does not survive here.
  optimizer.state().clear();
  ::torch::serialize::InputArchive state;
  archive.read(kStateKey, state);
  optimizer.load(state);
  for (size_t i = 0; i < groups.size(); ++i) {
    ::torch::serialize::InputArchive options;
    archive.read(absl::StrCat(kOptionsKey, i), options);
    groups[i].options().serialize(options);
  }
}

void broadcast_parameters(
    const ::torch::OrderedDict<std::string, at::Tensor>& named_tensors,
    int root, const std::shared_ptr<Context>& context) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : named_tensors) {
    named.emplace_back("bcast.param/" + item.key(), item.value());
  }
  BroadcastInPlace(named, root, *Resolve(context));
}

void broadcast_parameters(const ::torch::nn::Module& module, int root,
                          const std::shared_ptr<Context>& context) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    named.emplace_back("bcast.param/" + item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    named.emplace_back("bcast.buffer/" + item.key(), item.value());
  }
  BroadcastInPlace(named, root, *Resolve(context));
}

void broadcast_optimizer_state(::torch::optim::Optimizer& optimizer, int root,
                               const std::shared_ptr<Context>& context) {
  std::shared_ptr<Context> ctx = Resolve(context);
  std::string bytes;
  const bool is_root = ctx->rank() == root;
  try {
    if (is_root) bytes = serialize_optimizer_state(optimizer);
  } catch (const c10::Error& e) {
    throw Error(absl::StatusCode::kInvalidArgument,
                absl::StrCat("broadcast_optimizer_state: cannot serialise the "
                             "optimizer: ",
                             e.what_without_backtrace()));
  }
  bytes = ctx->broadcast_bytes(
      bytes, BroadcastOptions().name("bcast.optimizer_state").root(root));
  if (is_root) return;
  try {
    load_optimizer_state(bytes, optimizer);
  } catch (const c10::Error& e) {
    throw Error(absl::StatusCode::kInvalidArgument,
                absl::StrCat("broadcast_optimizer_state: root's state does not "
                             "fit this rank's optimizer: ",
                             e.what_without_backtrace()));
  }
}

void broadcast_optimizer_state(DistributedOptimizer& optimizer, int root,
                               const std::shared_ptr<Context>& context) {
  // save()/load() lend the one set of param groups and state to the wrapped
  // optimizer (Note [One set of param groups]).
  broadcast_optimizer_state(static_cast<::torch::optim::Optimizer&>(optimizer),
                            root,
                            context ? context : optimizer.options().context());
}

std::string broadcast_bytes(const std::string& bytes, int root,
                            const std::shared_ptr<Context>& context) {
  return Resolve(context)->broadcast_bytes(bytes,
                                           BroadcastOptions().root(root));
}

c10::IValue broadcast_object(const c10::IValue& value, int root,
                             const std::shared_ptr<Context>& context) {
  std::shared_ptr<Context> ctx = Resolve(context);
  std::string bytes;
  if (ctx->rank() == root) {
    std::vector<char> pickled = ::torch::pickle_save(value);
    bytes.assign(pickled.begin(), pickled.end());
  }
  bytes = ctx->broadcast_bytes(bytes, BroadcastOptions().root(root));
  return ::torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
}

}  // namespace torch
}  // namespace kolo
