// Broadcast of parameters and buffers, of the state of every built-in
// optimizer (including state created lazily by the first step, on either
// side), and of bytes, objects and values.
#include "kolo/torch/broadcast.h"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/frontends/torch/torch_job.h"

namespace kolo {
namespace torch {
namespace {

namespace nn = ::torch::nn;
namespace optim = ::torch::optim;
using testing::Contexts;
using testing::OnEachRank;
using testing::ShutdownContexts;
using testing::StartContexts;

std::vector<std::pair<std::string, at::Tensor>> Snapshot(const nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : m.named_parameters()) {
    out.emplace_back(item.key(), item.value().detach().clone());
  }
  for (const auto& item : m.named_buffers()) {
    out.emplace_back(item.key(), item.value().clone());
  }
  return out;
}

// Three ranks whose parameters and BatchNorm statistics all differ end up
// with root's, buffers (running mean/var, num_batches_tracked) included.
TEST(BroadcastParameters, ModuleParametersAndBuffers) {
  constexpr int kSize = 3, kRoot = 1;
  Contexts ctx = StartContexts(kSize);
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> before(kSize),
      after(kSize);
  OnEachRank(kSize, [&](int rank) {
    nn::Sequential net(nn::Linear(4, 4), nn::BatchNorm1d(4));
    {
      at::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.fill_(rank + 0.5);
    }
    for (int i = 0; i <= rank; ++i) {  // rank-dependent running statistics
      net->forward(at::full({8, 4}, rank) + at::arange(32.).reshape({8, 4}));
    }
    before[rank] = Snapshot(*net);
    broadcast_parameters(*net, kRoot, ctx[rank]);
    after[rank] = Snapshot(*net);
  });
  ShutdownContexts(ctx);
  ASSERT_EQ(before[kRoot].size(),
            7u);  // weight, bias, BN weight/bias + 3 buffers
  for (int rank = 0; rank < kSize; ++rank) {
    ASSERT_EQ(after[rank].size(), before[kRoot].size());
    for (size_t i = 0; i < after[rank].size(); ++i) {
      EXPECT_TRUE(at::equal(after[rank][i].second, before[kRoot][i].second))
          << "rank " << rank << ": " << after[rank][i].first;
    }
  }
  // The test means something: the ranks did differ.
  EXPECT_FALSE(at::equal(before[0][0].second, before[kRoot][0].second));
  EXPECT_FALSE(at::equal(before[0][4].second, before[kRoot][4].second));
}

TEST(BroadcastParameters, NamedTensors) {
  Contexts ctx = StartContexts(2);
  OnEachRank(2, [&](int rank) {
    nn::Linear lin(3, 3);
    {
      at::NoGradGuard no_grad;
      lin->weight.fill_(rank);
    }
    broadcast_parameters(lin->named_parameters(), 0, ctx[rank]);
    EXPECT_TRUE(at::equal(lin->weight, at::zeros({3, 3})));
  });
  ShutdownContexts(ctx);
}

struct OptimizerCase {
  std::string name;
  std::function<std::unique_ptr<optim::Optimizer>(std::vector<at::Tensor>,
                                                  double lr)>
      make;
};

void PrintTo(const OptimizerCase& c, std::ostream* os) { *os << c.name; }

std::vector<OptimizerCase> Optimizers() {
  using P = std::vector<at::Tensor>;
  return {
      {"SGD",
       [](P p, double lr) {
         return std::make_unique<optim::SGD>(
             p, optim::SGDOptions(lr).momentum(0.9).nesterov(true));
       }},
      {"Adam",
       [](P p, double lr) {
         return std::make_unique<optim::Adam>(
             p, optim::AdamOptions(lr).amsgrad(true));
       }},
      {"AdamW",
       [](P p, double lr) {
         return std::make_unique<optim::AdamW>(p, optim::AdamWOptions(lr));
       }},
      {"RMSprop",
       [](P p, double lr) {
         return std::make_unique<optim::RMSprop>(
             p, optim::RMSpropOptions(lr).momentum(0.5).centered(true));
       }},
      {"Adagrad",
       [](P p, double lr) {
         return std::make_unique<optim::Adagrad>(p, optim::AdagradOptions(lr));
       }},
  };
}

class BroadcastOptimizerState
    : public ::testing::TestWithParam<std::tuple<OptimizerCase, bool>> {};

// Root (rank 0, lr 0.01) and rank 1 (lr 0.5) start from the same weights;
// one of them takes a step first, creating its state lazily, the other has
// none. After broadcast_optimizer_state and broadcast_parameters, one more
// step on identical gradients must give identical weights: the state and the
// learning rate arrived.
TEST_P(BroadcastOptimizerState, LazilyCreatedStateAndOptionsArrive) {
  const OptimizerCase& c = std::get<0>(GetParam());
  const bool root_stepped_first = std::get<1>(GetParam());
  constexpr int kRoot = 0;
  Contexts ctx = StartContexts(2);
  std::vector<at::Tensor> weights(2);
  std::vector<double> lrs(2);
  OnEachRank(2, [&](int rank) {
    at::Tensor w = at::linspace(-1, 1, 6).reshape({2, 3}).requires_grad_();
    auto opt = c.make({w}, rank == kRoot ? 0.01 : 0.5);
    const int first = root_stepped_first ? kRoot : 1 - kRoot;
    if (rank == first) {
      w.mutable_grad() = at::full({2, 3}, 0.3 + rank);
      opt->step();
    }
    broadcast_parameters(
        ::torch::OrderedDict<std::string, at::Tensor>({{"w", w}}), kRoot,
        ctx[rank]);
    broadcast_optimizer_state(*opt, kRoot, ctx[rank]);
    lrs[rank] = opt->param_groups()[0].options().get_lr();
    w.mutable_grad() = at::arange(6.).reshape({2, 3}) - 2;
    opt->step();
    weights[rank] = w.detach().clone();
  });
  ShutdownContexts(ctx);
  EXPECT_EQ(lrs[1], 0.01);
  ASSERT_TRUE(weights[0].defined() && weights[1].defined());
  EXPECT_TRUE(at::equal(weights[0], weights[1])) << weights[0] << "\nvs\n"
                                                 << weights[1];
}

INSTANTIATE_TEST_SUITE_P(EveryOptimizer, BroadcastOptimizerState,
                         ::testing::Combine(::testing::ValuesIn(Optimizers()),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param).name +
                                  (std::get<1>(info.param)
                                       ? "_RootSteppedFirst"
                                       : "_OtherSteppedFirst");
                         });

// Without the state broadcast the same scenario diverges: the test above
// can fail.
TEST(BroadcastOptimizerStateControl, WithoutBroadcastTheReplicasDiverge) {
  Contexts ctx = StartContexts(2);
  std::vector<at::Tensor> weights(2);
  OnEachRank(2, [&](int rank) {
    at::Tensor w = at::linspace(-1, 1, 6).reshape({2, 3}).requires_grad_();
    optim::Adam opt({w}, optim::AdamOptions(0.01));
    if (rank == 0) {
      w.mutable_grad() = at::full({2, 3}, 0.3);
      opt.step();
    }
    broadcast_parameters(
        ::torch::OrderedDict<std::string, at::Tensor>({{"w", w}}), 0,
        ctx[rank]);
    w.mutable_grad() = at::arange(6.).reshape({2, 3}) - 2;
    opt.step();
    weights[rank] = w.detach().clone();
  });
  ShutdownContexts(ctx);
  EXPECT_FALSE(at::equal(weights[0], weights[1]));
}

TEST(BroadcastObjects, BytesObjectsAndValues) {
  constexpr int kSize = 3, kRoot = 2;
  Contexts ctx = StartContexts(kSize);
  OnEachRank(kSize, [&](int rank) {
    // Root's length wins; the others' lengths differ (and one is empty).
    std::string mine(rank * 5, static_cast<char>('a' + rank));
    EXPECT_EQ(broadcast_bytes(mine, kRoot, ctx[rank]), std::string(10, 'c'));
    EXPECT_EQ(broadcast_bytes(rank == kRoot ? "" : "x", kRoot, ctx[rank]), "");

    c10::IValue epoch =
        broadcast_object(c10::IValue(int64_t{40 + rank}), kRoot, ctx[rank]);
    EXPECT_EQ(epoch.toInt(), 42);
    c10::IValue text = broadcast_object(
        c10::IValue(std::string("from ") + std::to_string(rank)), kRoot,
        ctx[rank]);
    EXPECT_EQ(text.toStringRef(), "from 2");

    struct Resume {
      int epoch;
      double lr;
    };
    Resume r = broadcast_value(Resume{rank, rank * 0.5}, kRoot, ctx[rank]);
    EXPECT_EQ(r.epoch, 2);
    EXPECT_EQ(r.lr, 1.0);
  });
  ShutdownContexts(ctx);
}

}  // namespace
}  // namespace torch
}  // namespace kolo
