// An elastic training job in C++ (kolo::torch::elastic) for the launch test
// test_elastic.py::test_the_cpp_api_survives_a_killed_worker: a linear
// model on a fixed dataset, one commit per step, under kolorun's elastic
// mode. The worker started as rank KILL_RANK SIGKILLs itself at step
// KILL_STEP of generation 0. One epoch of SAMPLES (default 96) samples
// through an ElasticSampler, batches of 4 per rank, STEP_DELAY_MS between
// steps (for the multi-host test, which adds and removes a host
// meanwhile); rank 0 prints "STEP <s> size <n>" and at the end "COVERAGE
// <committed samples> <samples>". Every worker prints "FINAL pid <pid> rank <r>
// of <n> gen <g> params <values>"; rank 0 also "REPLAY <max abs
// difference>" against a replay of the committed steps in one process.
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kolo/torch/torch.h"

namespace {

const int64_t kSamples =
    std::getenv("SAMPLES") ? std::atoll(std::getenv("SAMPLES")) : 96;
constexpr int64_t kBatch = 4;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

torch::nn::Linear MakeModel() {
  torch::manual_seed(7);
  torch::nn::Linear model(6, 1);
  model->to(torch::kDouble);
  return model;
}

std::string Params(torch::nn::Linear& model) {
  std::string out;
  for (const auto& p : model->parameters()) {
    auto flat = p.detach().flatten();
    for (int64_t i = 0; i < flat.numel(); ++i) {
      char buf[40];
      std::snprintf(buf, sizeof(buf), "%s%.17g", out.empty() ? "" : ",",
                    flat[i].item<double>());
      out += buf;
    }
  }
  return out;
}

}  // namespace

int main() {
  kolo::torch::init();
  const int first_rank = EnvInt("KOLO_RANK", 0);
  const int kill_rank = EnvInt("KILL_RANK", -1);
  const int kill_step = EnvInt("KILL_STEP", -1);
  const int step_delay_ms = EnvInt("STEP_DELAY_MS", 0);
  torch::manual_seed(1234);
  const auto x = torch::randn({kSamples, 6}, torch::kDouble);
  const auto y = torch::randn({kSamples, 1}, torch::kDouble);

  torch::nn::Linear model = MakeModel();
  kolo::torch::DistributedOptimizer optimizer(
      std::make_unique<torch::optim::SGD>(model->parameters(),
                                          torch::optim::SGDOptions(0.05)),
      model->named_parameters());
  kolo::torch::elastic::TorchState state(*model, optimizer, {{"step", 0}});
  const bool started_in_generation_0 = kolo::torch::elastic::generation() == 0;

  // One epoch of the dataset through an ElasticSampler; each step's global
  // batch is kept in the state for the replay ("b.<step>.<rank>.<i>").
  kolo::torch::elastic::ElasticSampler sampler(kSamples, /*shuffle=*/true, 3);
  state.track(sampler);
  const bool member = kolo::torch::elastic::run(state, [&] {
    for (int64_t b = 0;
         b * kBatch < static_cast<int64_t>(sampler.indices().size()); ++b) {
      const int64_t step = state.value("step");
      if (step_delay_ms > 0) usleep(step_delay_ms * 1000);
      if (kolo::torch::rank() == 0) {
        std::printf("STEP %lld size %d\n", static_cast<long long>(step),
                    kolo::torch::size());
        std::fflush(stdout);
      }
      if (started_in_generation_0 && kolo::torch::elastic::generation() == 0 &&
          first_rank == kill_rank && step == kill_step) {
        kill(getpid(), SIGKILL);
      }
      const std::vector<int64_t> mine = sampler.batch(b, kBatch);
      const auto idx = torch::tensor(mine, torch::kLong);
      optimizer.zero_grad();
      torch::mse_loss(model->forward(x.index({idx})), y.index({idx}))
          .backward();
      optimizer.step();
      sampler.record_batch(b, kBatch);
      const auto all = kolo::torch::allgather(idx);
      for (int64_t k = 0; k < all.numel(); ++k) {
        state.set("b." + std::to_string(step) + "." + std::to_string(k),
                  all[k].item<int64_t>());
      }
      state.set("n." + std::to_string(step), static_cast<int64_t>(mine.size()));
      state.set("step", step + 1);
      state.set("size." + std::to_string(step), kolo::torch::size());
      state.commit();
    }
  });
  if (!member) return 0;

  std::printf("FINAL pid %d rank %d of %d gen %lld params %s\n", getpid(),
              kolo::torch::rank(), kolo::torch::size(),
              static_cast<long long>(kolo::torch::elastic::generation()),
              Params(model).c_str());
  if (kolo::torch::rank() == 0) {
    torch::nn::Linear ref = MakeModel();
    torch::optim::SGD ref_opt(ref->parameters(),
                              torch::optim::SGDOptions(0.05));
    const int64_t steps = state.value("step");
    for (int64_t step = 0; step < steps; ++step) {
      const int size =
          static_cast<int>(state.value("size." + std::to_string(step)));
      std::vector<std::vector<torch::Tensor>> grads;
      for (int r = 0; r < size; ++r) {
        ref_opt.zero_grad();
        const int64_t n = state.value("n." + std::to_string(step));
        std::vector<int64_t> part;
        for (int64_t i = 0; i < n; ++i) {
          part.push_back(state.value("b." + std::to_string(step) + "." +
                                     std::to_string(r * n + i)));
        }
        const auto idx = torch::tensor(part, torch::kLong);
        torch::mse_loss(ref->forward(x.index({idx})), y.index({idx}))
            .backward();
        std::vector<torch::Tensor> g;
        for (const auto& p : ref->parameters()) g.push_back(p.grad().clone());
        grads.push_back(g);
      }
      size_t i = 0;
      for (auto& p : ref->parameters()) {
        auto sum = torch::zeros_like(p);
        for (const auto& g : grads) sum += g[i];
        p.mutable_grad() = sum / size;
        ++i;
      }
      ref_opt.step();
    }
    double diff = 0;
    auto a = model->parameters();
    auto b = ref->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
    }
    std::printf("REPLAY %.3g\n", diff);
    std::printf("COVERAGE %zu %lld\n", sampler.processed(),
                static_cast<long long>(kSamples));
  }
  std::fflush(stdout);
  kolo::torch::shutdown();
  return 0;
}
