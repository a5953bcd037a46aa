// kolo::torch::elastic: training that survives the loss and arrival of
// workers, in a job kolorun runs in elastic mode (docs/elastic.md), with
// Horovod's elastic concepts.
//
//   kolo::torch::init();
//   kolo::torch::elastic::TorchState state(model, optimizer);
//   kolo::torch::elastic::run(state, [&] {
//     for (; state.value("epoch") < epochs; state.set("epoch", ...)) {
//       ... one step ...; state.commit();
//     }
//   });
//
// commit() keeps a copy of the state (in memory) and checks, collectively,
// whether kolorun asked the job to re-form (hosts added or removed). When a
// rank is lost, every survivor's pending collective fails (Error naming the
// rank); run() then restores the last commit, leaves the generation
// (reset()), joins the next one and syncs: the rank with the most commits
// (the lowest such rank) broadcasts its state to all, newcomers included.
// What is lost: the steps since the last commit.
//
// Threads: call these from the training thread; the default context is
// replaced by reset(), so nothing else may use it meanwhile.
#ifndef KOLO_TORCH_ELASTIC_H_
#define KOLO_TORCH_ELASTIC_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kolo/options.h"
#include "kolo/torch/context.h"
#include "kolo/torch/distributed_optimizer.h"

namespace kolo {
namespace torch {
namespace elastic {

// Thrown by State::commit() / check_host_updates() on every rank when
// kolorun asked the job to re-form; run() catches it.
class HostsUpdatedInterrupt : public std::runtime_error {
 public:
  HostsUpdatedInterrupt()
      : std::runtime_error("hosts were added or removed: the job re-forms") {}
};

// Whether this process is a worker of an elastic job (kolorun set
// KOLO_ELASTIC_ID).
bool enabled();
// The generation the default context belongs to (0 outside elastic jobs).
int64_t generation();
// Collective over the current generation (every rank calls it): whether
// kolorun asked it to re-form, agreed by all ranks (the maximum of each
// rank's view, so that all raise together).
bool hosts_updated();
// Leaves the current generation and joins the next. The default context is
// shut down (aborted after a failure, whose lost rank kolorun learns), this
// worker waits for kolorun's next generation and init()s the default context
// there, with `adjust` applied to its options. Returns false when this
// worker has no place in it (its host was removed, or the job is
// finishing): the default context is then left uninitialised and the
// worker should exit 0. Throws Error (e.g. no generation within the
// elastic timeout).
bool reset(const std::function<void(kolo::Options*)>& adjust = nullptr);

// Partitions the sample indices [0, size) among the ranks of the current
// generation and resumes an epoch where it stopped (as
// kolo.torch.elastic.ElasticSampler): indices recorded as processed
// before the last commit are not given out again after a reset, the rest
// is split among the new ranks, ceil(left / ranks) each (the first few
// repeat when they do not divide evenly, so that every rank runs the same
// number of steps). Track it in a TorchState (TorchState::track) so that
// its progress is committed, shared by every rank and synced.
class ElasticSampler {
 public:
  explicit ElasticSampler(int64_t size, bool shuffle = true, uint64_t seed = 0);

  // Starts epoch `epoch` afresh (its own shuffle).
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // This rank's indices of what is left of the epoch, in order.
  const std::vector<int64_t>& indices() const { return indices_; }
  // The `batch_idx`-th batch of `batch_size` of indices() (the last may be
  // shorter).
  std::vector<int64_t> batch(int64_t batch_idx, int64_t batch_size) const;
  // Marks that batch (or these indices) as processed.
  void record_batch(int64_t batch_idx, int64_t batch_size);
  void record_indices(const std::vector<int64_t>& indices);
  // Committed processed indices of every rank, this epoch.
  size_t processed() const { return processed_.size(); }
  // Re-partitions what is left among the current ranks.
  void reset();

  // For TorchState: shares every rank's recorded indices (collective), and
  // the committed progress as bytes.
  void share_recorded();
  std::string state() const;
  void load_state(const std::string& bytes);

 private:
  const int64_t size_;
  const bool shuffle_;
  const uint64_t seed_;
  int64_t epoch_ = 0;
  std::vector<bool> processed_mask_;
  std::vector<int64_t> processed_;
  std::vector<int64_t> recorded_;  // this rank's, since the last commit
  std::vector<int64_t> indices_;
};

// What survives a reset. Subclasses say how to save, restore and broadcast.
class State {
 public:
  virtual ~State() = default;
  // before_commit(), save(), then check_host_updates(): collective.
  void commit();
  // Throws HostsUpdatedInterrupt on every rank when hosts_updated().
  void check_host_updates();
  // Every rank takes the state of the rank with the most commits (the
  // lowest such rank): collective.
  void sync();
  // Called after every reset, before sync().
  void register_reset_callbacks(std::vector<std::function<void()>> callbacks);
  void on_reset();
  int64_t commits() const { return commits_; }

  virtual void save() = 0;
  virtual void restore() = 0;

 protected:
  // Collective work of a commit before save() (TorchState: samplers).
  virtual void before_commit() {}
  // Overwrites this rank's state with `root`'s (every rank calls it).
  virtual void broadcast(int root) = 0;

 private:
  int64_t commits_ = 0;
  std::vector<std::function<void()>> reset_callbacks_;
};

// A module's parameters and buffers, an optimizer's state, and named
// integers (epoch, batch, ...).
class TorchState : public State {
 public:
  TorchState(::torch::nn::Module& model, ::torch::optim::Optimizer& optimizer,
             std::map<std::string, int64_t> values = {});
  int64_t value(const std::string& name) const;
  void set(const std::string& name, int64_t value);
  // Keeps `sampler`'s progress with the state (it must outlive the state).
  void track(ElasticSampler& sampler);

  void save() override;
  void restore() override;

 protected:
  void before_commit() override;
  void broadcast(int root) override;

 private:
  // The optimizer whose state is kept: a DistributedOptimizer's wrapped one.
  ::torch::optim::Optimizer& StateOptimizer();

  ::torch::nn::Module& model_;
  ::torch::optim::Optimizer& optimizer_;
  DistributedOptimizer* distributed_ = nullptr;
  std::map<std::string, int64_t> values_;
  // The last commit.
  std::vector<at::Tensor> saved_tensors_;
  std::string saved_optimizer_;
  std::map<std::string, int64_t> saved_values_;
  std::vector<ElasticSampler*> samplers_;
  std::vector<std::string> saved_samplers_;
};

// Runs `train` until it returns (true) on a reset-surviving loop: state is
// synced first; a kolo Error (a lost rank) restores the last commit, a
// HostsUpdatedInterrupt keeps the state; either way the job re-forms
// (reset()) and `train` runs again. Returns false when this worker has no
// place in the next generation. Outside elastic jobs `train` just runs.
bool run(State& state, const std::function<void()>& train);

}  // namespace elastic
}  // namespace torch
}  // namespace kolo

#endif  // KOLO_TORCH_ELASTIC_H_
