// DistributedOptimizer with ranks as threads: data parallelism gives the
// same parameters as one rank on the whole batch (also with
// backward_passes_per_step, grouped allreduces and process sets),
// parameters without gradients do not hang,
// mismatched models fail naming the parameter, compression, predivision,
// sparse gradients, synchronize()/skip_synchronize() and misuse errors.
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kolo/torch/distributed_optimizer.h"
#include "tests/frontends/torch/torch_job.h"

namespace kolo {
namespace torch {
namespace {

namespace nn = ::torch::nn;
namespace optim = ::torch::optim;
using testing::Contexts;
using ::testing::HasSubstr;
using testing::OnEachRank;
using testing::ShutdownContexts;
using testing::StartContexts;

nn::Sequential MakeNet() {
  nn::Sequential net(nn::Linear(8, 16), nn::Tanh(), nn::Linear(16, 4));
  net->to(at::kDouble);
  return net;
}

nn::Sequential Clone(const nn::Sequential& net) {
  return nn::Sequential(
      std::dynamic_pointer_cast<nn::SequentialImpl>(net->clone()));
}

void ExpectSameParameters(const nn::Module& a, const nn::Module& b,
                          const std::string& what) {
  auto pa = a.named_parameters();
  auto pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) {
    EXPECT_TRUE(at::allclose(item.value(), pb[item.key()], 1e-10, 1e-12))
        << what << ": " << item.key() << " differs by "
        << (item.value() - pb[item.key()]).abs().max().item<double>();
  }
}

DistributedOptimizerOptions On(const std::shared_ptr<Context>& context) {
  return DistributedOptimizerOptions().context(context);
}

// How a data-parallel run is set up: the ranks of the job, those that train
// (all, or a process set of them), and the optimizer's options.
struct Job {
  std::string what;
  int job_size = 2;
  std::vector<int> trainers = {0, 1};
  std::function<DistributedOptimizerOptions()> options = [] {
    return DistributedOptimizerOptions();
  };
};

// k steps on n ranks with batch b each == k steps of one model on batch n*b:
// the loss is a mean, and the average of the ranks' mean gradients is the
// gradient of the mean over all shards. Also with grouped allreduces and
// within a process set.
TEST(DataParallel, RanksEqualOneRankOnTheWholeBatch) {
  std::vector<Job> jobs(5);
  jobs[0].what = "2 ranks";
  jobs[1].what = "2 ranks, num_groups 2";
  jobs[1].options = [] { return DistributedOptimizerOptions().num_groups(2); };
  jobs[2].what = "2 ranks, explicit groups";
  jobs[2].options = [] {
    return DistributedOptimizerOptions().groups({{"0.weight", "2.weight"}});
  };
  jobs[3].what = "3 ranks";
  jobs[3].job_size = 3;
  jobs[3].trainers = {0, 1, 2};
  jobs[4].what = "process set {0, 2} of 3 ranks";
  jobs[4].job_size = 3;
  jobs[4].trainers = {0, 2};
  for (const Job& setup : jobs) {
    SCOPED_TRACE(setup.what);
    constexpr int kSteps = 4, kBatch = 5;
    const int n = static_cast<int>(setup.trainers.size());
    ::torch::manual_seed(7);
    nn::Sequential reference = MakeNet();
    at::Tensor x = at::randn({kSteps, n * kBatch, 8}, at::kDouble);
    at::Tensor y = at::randn({kSteps, n * kBatch, 4}, at::kDouble);
    std::vector<nn::Sequential> replicas;
    for (int i = 0; i < n; ++i) replicas.push_back(Clone(reference));

    auto sgd = [](nn::Sequential& net) {
      return std::make_unique<optim::SGD>(net->parameters(),
                                          optim::SGDOptions(0.1).momentum(0.9));
    };
    auto single_opt = sgd(reference);
    for (int s = 0; s < kSteps; ++s) {
      single_opt->zero_grad();
      ::torch::mse_loss(reference->forward(x[s]), y[s]).backward();
      single_opt->step();
    }

    Contexts ctx = StartContexts(setup.job_size);
    OnEachRank(setup.job_size, [&](int rank) {
      const bool all = n == setup.job_size;
      // Collective over the whole job, members or not.
      const int set = all ? 0 : ctx[rank]->add_process_set(setup.trainers);
      auto me = std::find(setup.trainers.begin(), setup.trainers.end(), rank);
      if (me == setup.trainers.end()) return;
      const int shard = static_cast<int>(me - setup.trainers.begin());
      nn::Sequential& net = replicas[shard];
      DistributedOptimizer opt(
          sgd(net), net->named_parameters(),
          setup.options().context(ctx[rank]).process_set(set));
      for (int s = 0; s < kSteps; ++s) {
        opt.zero_grad();
        at::Tensor xs = x[s].narrow(0, shard * kBatch, kBatch);
        at::Tensor ys = y[s].narrow(0, shard * kBatch, kBatch);
        ::torch::mse_loss(net->forward(xs), ys).backward();
        opt.step();
      }
    });
    ShutdownContexts(ctx);
    ExpectSameParameters(*replicas[0], *reference, "first trainer vs one rank");
    // Replicas must not drift apart: bitwise equal.
    for (int i = 1; i < n; ++i) {
      for (const auto& item : replicas[0]->named_parameters()) {
        EXPECT_TRUE(at::equal(item.value(),
                              replicas[i]->named_parameters()[item.key()]))
            << "trainer " << i << ": " << item.key();
      }
    }
  }
}

// backward_passes_per_step = 2: each rank sums two passes locally, then
// averages over ranks == one rank accumulating the same two passes on the
// whole batch.
TEST(DataParallel, BackwardPassesPerStepEqualsLocalAccumulation) {
  constexpr int kSteps = 3, kPasses = 2, kBatch = 3;
  ::torch::manual_seed(11);
  nn::Sequential reference = MakeNet();
  at::Tensor x = at::randn({kSteps, kPasses, 2 * kBatch, 8}, at::kDouble);
  at::Tensor y = at::randn({kSteps, kPasses, 2 * kBatch, 4}, at::kDouble);
  std::vector<nn::Sequential> replicas = {Clone(reference), Clone(reference)};

  auto adam = [](nn::Sequential& net) {
    return std::make_unique<optim::Adam>(net->parameters(),
                                         optim::AdamOptions(0.01));
  };
  auto single_opt = adam(reference);
  for (int s = 0; s < kSteps; ++s) {
    single_opt->zero_grad();
    for (int p = 0; p < kPasses; ++p) {
      ::torch::mse_loss(reference->forward(x[s][p]), y[s][p]).backward();
    }
    single_opt->step();
  }

  Contexts ctx = StartContexts(2);
  OnEachRank(2, [&](int rank) {
    nn::Sequential& net = replicas[rank];
    DistributedOptimizer opt(adam(net), net->named_parameters(),
                             On(ctx[rank]).backward_passes_per_step(kPasses));
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      for (int p = 0; p < kPasses; ++p) {
        at::Tensor xs = x[s][p].narrow(0, rank * kBatch, kBatch);
        at::Tensor ys = y[s][p].narrow(0, rank * kBatch, kBatch);
        ::torch::mse_loss(net->forward(xs), ys).backward();
      }
      opt.step();
    }
  });
  ShutdownContexts(ctx);
  ExpectSameParameters(*replicas[0], *reference, "rank 0 vs one rank");
  ExpectSameParameters(*replicas[1], *reference, "rank 1 vs one rank");
}

struct Heads : nn::Module {
  Heads(int64_t out_a, int64_t out_b)
      : a(register_module("a", nn::Linear(4, out_a))),
        b(register_module("b", nn::Linear(4, out_b))),
        unused(register_module("unused", nn::Linear(4, 4))) {}
  nn::Linear a, b, unused;
};

// Rank 0 never uses head b; nobody uses head `unused`. The step completes on
// both ranks, b's gradient is the average of rank 1's and a zero, and
// `unused` gets zero gradients on both.
TEST(DataParallel, ParametersWithoutGradientsDoNotHang) {
  ::torch::manual_seed(3);
  auto proto = std::make_shared<Heads>(4, 4);
  at::Tensor x = at::randn({2, 6, 4});
  Contexts ctx = StartContexts(2);
  std::vector<at::Tensor> b_grads(2), unused_grads(2);
  OnEachRank(2, [&](int rank) {
    auto net = std::make_shared<Heads>(4, 4);
    {
      at::NoGradGuard no_grad;
      for (const auto& item : proto->named_parameters()) {
        net->named_parameters()[item.key()].copy_(item.value());
      }
    }
    DistributedOptimizer opt(
        std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions(0)),
        net->named_parameters(), On(ctx[rank]));
    at::Tensor out = net->a->forward(x[rank]);
    if (rank == 1) out = out + net->b->forward(x[rank]);
    out.sum().backward();
    if (rank == 0) EXPECT_FALSE(net->b->weight.grad().defined());
    opt.synchronize();
    b_grads[rank] = net->b->weight.grad().clone();
    unused_grads[rank] = net->unused->weight.grad().clone();
    opt.step();
  });
  ShutdownContexts(ctx);
  ASSERT_TRUE(b_grads[0].defined() && b_grads[1].defined());
  EXPECT_TRUE(at::equal(b_grads[0], b_grads[1]));
  EXPECT_TRUE(at::allclose(b_grads[0],
                           x[1].sum(0).expand({4, 4}) / 2));  // d(sum(xW^T))/dW
  EXPECT_TRUE(at::equal(unused_grads[0], at::zeros({4, 4})));
  EXPECT_TRUE(at::equal(unused_grads[1], at::zeros({4, 4})));
}

TEST(DataParallel, MismatchedModelsFailNamingTheParameter) {
  Contexts ctx = StartContexts(2);
  OnEachRank(2, [&](int rank) {
    // Head b has 3 outputs on rank 0 and 5 on rank 1.
    auto net = std::make_shared<Heads>(4, rank == 0 ? 3 : 5);
    DistributedOptimizer opt(
        std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions(0.1)),
        net->named_parameters(), On(ctx[rank]));
    at::Tensor x = at::ones({2, 4});
    (net->a->forward(x).sum() + net->b->forward(x).sum()).backward();
    try {
      opt.step();
      ADD_FAILURE() << "rank " << rank << ": step() did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(e.what(), HasSubstr("\"grad/b."));
      EXPECT_THAT(e.what(), HasSubstr("shape"));
    }
  });
  ShutdownContexts(ctx);
}

// A parameter that exists on one rank only: that rank's step fails after the
// op timeout with an error naming it, instead of hanging.
TEST(DataParallel, ParameterMissingOnARankTimesOutNamingIt) {
  Contexts ctx = StartContexts(
      2, [](kolo::Options& o) { o.op_timeout = absl::Seconds(3); });
  std::promise<void> rank1_done;
  OnEachRank(2, [&](int rank) {
    auto net = std::make_shared<Heads>(2, 2);
    if (rank == 1) net->register_parameter("extra", at::zeros({3}));
    DistributedOptimizer opt(
        std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions(0.1)),
        net->named_parameters(), On(ctx[rank]));
    net->a->forward(at::ones({1, 4})).sum().backward();
    if (rank == 0) {
      opt.step();  // every name of rank 0 is submitted by rank 1 too
      rank1_done.get_future().wait();  // stay in the job until rank 1 failed
      return;
    }
    try {
      opt.step();
      ADD_FAILURE() << "rank 1: step() did not throw";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("grad/extra"));
    }
    rank1_done.set_value();
  });
  ShutdownContexts(ctx);
}

// Rank r's gradient of a bias-free Linear's weight under loss sum(W * c_r)
// is c_r; returns the synchronized gradient.
at::Tensor SynchronizedGrad(const std::shared_ptr<Context>& ctx, int rank,
                            DistributedOptimizerOptions options,
                            const at::Tensor& c) {
  nn::Linear lin(nn::LinearOptions(3, 2).bias(false));
  DistributedOptimizer opt(
      std::make_unique<optim::SGD>(lin->parameters(), optim::SGDOptions(0)),
      lin->named_parameters(), options.context(ctx));
  (lin->weight * c).sum().backward();
  opt.synchronize();
  return lin->weight.grad().clone();
}

TEST(DataParallel, CompressionAndPredivision) {
  Contexts ctx = StartContexts(2);
  auto c = [](int rank) { return at::full({2, 3}, 1.0 / 3 + rank); };
  const at::Tensor average = (c(0) + c(1)) / 2;
  OnEachRank(2, [&](int rank) {
    at::Tensor plain = SynchronizedGrad(ctx[rank], rank, {}, c(rank));
    EXPECT_TRUE(at::allclose(plain, average, 1e-6, 1e-7));

    at::Tensor fp16 = SynchronizedGrad(
        ctx[rank], rank,
        DistributedOptimizerOptions().compression(Compression::kFp16), c(rank));
    EXPECT_EQ(fp16.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::allclose(fp16, average, 0, 1e-3));
    EXPECT_FALSE(at::equal(fp16, plain)) << "not compressed";

    at::Tensor bf16 = SynchronizedGrad(
        ctx[rank], rank,
        DistributedOptimizerOptions().compression(Compression::kBf16), c(rank));
    EXPECT_TRUE(at::allclose(bf16, average, 0, 1e-2));

    at::Tensor predivided = SynchronizedGrad(
        ctx[rank], rank,
        DistributedOptimizerOptions().gradient_predivide_factor(4), c(rank));
    EXPECT_TRUE(at::allclose(predivided, average, 1e-6, 1e-7));

    at::Tensor sum = SynchronizedGrad(
        ctx[rank], rank, DistributedOptimizerOptions().op(ReduceOp::kSum),
        c(rank));
    EXPECT_TRUE(at::allclose(sum, 2 * average, 1e-6, 1e-7));
  });
  ShutdownContexts(ctx);
}

// Sparse gradients (Note [Sparse gradients] in gradient_reducer.cc): an
// allgather of indices and values, summed into one coalesced sparse
// gradient (averaged), as Horovod does; with sparse_as_dense a dense
// allreduce; in a group of several, an error.
TEST(DataParallel, SparseGradientsAreGatheredOrDensified) {
  Contexts ctx = StartContexts(2);
  OnEachRank(2, [&](int rank) {
    at::Tensor ids = at::tensor({rank, 2}, at::kLong);
    // Rows 0 and 1 were used by one rank each, row 2 by both.
    at::Tensor want = at::zeros({4, 3});
    want[0].fill_(0.5);
    want[1].fill_(0.5);
    want[2].fill_(1.0);
    {
      nn::Embedding emb(nn::EmbeddingOptions(4, 3).sparse(true));
      DistributedOptimizer opt(
          std::make_unique<optim::SGD>(emb->parameters(), optim::SGDOptions(0)),
          emb->named_parameters(), On(ctx[rank]));
      emb->forward(ids).sum().backward();
      opt.synchronize();
      ASSERT_TRUE(emb->weight.grad().is_sparse());
      EXPECT_TRUE(emb->weight.grad().is_coalesced());
      EXPECT_TRUE(at::equal(emb->weight.grad().to_dense(), want));
    }
    {
      nn::Embedding emb(nn::EmbeddingOptions(4, 3).sparse(true));
      DistributedOptimizer opt(
          std::make_unique<optim::SGD>(emb->parameters(), optim::SGDOptions(0)),
          emb->named_parameters(), On(ctx[rank]).sparse_as_dense(true));
      emb->forward(ids).sum().backward();
      opt.synchronize();
      EXPECT_FALSE(emb->weight.grad().is_sparse());
      EXPECT_TRUE(at::equal(emb->weight.grad(), want));
    }
    nn::Embedding a(nn::EmbeddingOptions(4, 3).sparse(true));
    nn::Embedding b(nn::EmbeddingOptions(4, 3).sparse(true));
    std::vector<at::Tensor> params = {a->weight, b->weight};
    DistributedOptimizer opt(
        std::make_unique<optim::SGD>(params, optim::SGDOptions(0)),
        On(ctx[rank]).num_groups(1));
    (a->forward(ids).sum() + b->forward(ids).sum()).backward();
    try {
      opt.step();
      ADD_FAILURE() << "a sparse gradient in a group was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("has a sparse gradient in a group"));
      EXPECT_THAT(e.what(), HasSubstr("sparse_as_dense"));
    }
  });
  ShutdownContexts(ctx);
}

// synchronize(); clip; step() must not allreduce again: with op Sum a second
// round would double the gradient.
// zero_grad(set_to_none) as torch defines it: undefined gradients, or
// zeros; the default is torch's own (true from 2.x, false on 1.13).
TEST(DataParallel, ZeroGradSetsToNoneAsTorchDoes) {
  Contexts ctx = StartContexts(1);
  nn::Linear lin(nn::LinearOptions(2, 1));
  DistributedOptimizer opt(
      std::make_unique<optim::SGD>(lin->parameters(), optim::SGDOptions(0.1)),
      lin->named_parameters(), On(ctx[0]));
  auto backward_and_step = [&] {
    lin->forward(at::ones({1, 2})).sum().backward();
    opt.step();
  };
  backward_and_step();
  opt.zero_grad(false);
  EXPECT_TRUE(lin->weight.grad().defined());
  EXPECT_TRUE(at::equal(lin->weight.grad(), at::zeros({1, 2})));
  backward_and_step();
  opt.zero_grad(true);
  EXPECT_FALSE(lin->weight.grad().defined());
  backward_and_step();
  opt.zero_grad();
  EXPECT_EQ(lin->weight.grad().defined(), TORCH_VERSION_MAJOR < 2);
  // Through the base class, as a scheduler or a training loop may call it.
  backward_and_step();
  static_cast<::torch::optim::Optimizer&>(opt).zero_grad();
  EXPECT_EQ(lin->weight.grad().defined(), TORCH_VERSION_MAJOR < 2);
  ShutdownContexts(ctx);
}

TEST(DataParallel, StepAfterSynchronizeDoesNotCommunicateAgain) {
  Contexts ctx = StartContexts(2);
  OnEachRank(2, [&](int rank) {
    for (bool explicit_skip : {false, true}) {
      nn::Linear lin(nn::LinearOptions(3, 2).bias(false));
      at::Tensor w0 = lin->weight.detach().clone();
      DistributedOptimizer opt(
          std::make_unique<optim::SGD>(lin->parameters(), optim::SGDOptions(1)),
          lin->named_parameters(), On(ctx[rank]).op(ReduceOp::kSum));
      (lin->weight * (rank + 1.0)).sum().backward();
      opt.synchronize();
      EXPECT_TRUE(at::equal(lin->weight.grad(), at::full({2, 3}, 3.0)));
      lin->weight.grad().mul_(0.5);  // "clipping"
      if (explicit_skip) opt.skip_synchronize();
      opt.step();
      EXPECT_TRUE(at::allclose(lin->weight.detach(), w0 - 1.5));
    }
  });
  ShutdownContexts(ctx);
}

TEST(DataParallel, MisuseIsReportedClearly) {
  Contexts ctx = StartContexts(1);
  nn::Linear lin(3, 2);
  DistributedOptimizer opt(
      std::make_unique<optim::SGD>(lin->parameters(), optim::SGDOptions(0.1)),
      lin->named_parameters(), On(ctx[0]));
  lin->forward(at::ones({1, 3})).sum().backward();  // allreduces in flight
  EXPECT_THROW(opt.zero_grad(), Error);
  opt.skip_synchronize();
  try {
    opt.step();
    ADD_FAILURE() << "step() after skip_synchronize() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr("synchronize()"));
  }
  opt.synchronize();
  opt.zero_grad();
  // backward_passes_per_step is 1: a second pass before step() is an error,
  // raised by step() (Note [No error leaves a hook]), never by the hook.
  lin->forward(at::ones({1, 3})).sum().backward();
  lin->forward(at::ones({1, 3})).sum().backward();
  try {
    opt.step();
    ADD_FAILURE() << "a second backward pass before step() was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr("backward_passes_per_step"));
    EXPECT_THAT(e.what(), HasSubstr("wrapped optimizer's own step()"));
  }
  // Kept once: the next step goes on.
  opt.zero_grad();
  lin->forward(at::ones({1, 3})).sum().backward();
  opt.step();

  // Invalid options and unnamed parameters fail at construction.
  auto make = [&](DistributedOptimizerOptions o) {
    DistributedOptimizer d(
        std::make_unique<optim::SGD>(lin->parameters(), optim::SGDOptions(0.1)),
        lin->named_parameters(), o.context(ctx[0]));
  };
  EXPECT_THROW(make(DistributedOptimizerOptions().backward_passes_per_step(0)),
               Error);
  EXPECT_THROW(make(DistributedOptimizerOptions().op(ReduceOp::kMax)), Error);
  EXPECT_THROW(make(DistributedOptimizerOptions().groups({{"bias", "nope"}})),
               Error);
  EXPECT_THROW(
      make(DistributedOptimizerOptions().num_groups(1).groups({{"bias"}})),
      Error);
  EXPECT_THROW(make(DistributedOptimizerOptions()
                        .op(ReduceOp::kSum)
                        .gradient_predivide_factor(2)),
               Error);
  nn::Linear other(3, 2);
  try {
    DistributedOptimizer d(std::make_unique<optim::SGD>(other->parameters(),
                                                        optim::SGDOptions(0.1)),
                           lin->named_parameters(), On(ctx[0]));
    ADD_FAILURE() << "unnamed parameters were accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not in named_parameters"));
  }
  ShutdownContexts(ctx);
}

// What a plain LibTorch program does with an optimizer: a helper taking
// torch::optim::Optimizer&.
void TrainStep(optim::Optimizer& optimizer, nn::Linear& lin,
               const at::Tensor& x) {
  optimizer.zero_grad();
  lin->forward(x).sum().backward();
  optimizer.step();
}

// Note [One set of param groups]: the DistributedOptimizer is an Optimizer;
// a scheduler on it sets the lr the wrapped optimizer steps with; state and
// checkpoints are the wrapped optimizer's.
TEST(DataParallel, IsAnOptimizerWithTheWrappedOnesGroupsAndState) {
  Contexts ctx = StartContexts(2);
  OnEachRank(2, [&](int rank) {
    nn::Linear lin(nn::LinearOptions(3, 1).bias(false));
    lin->to(at::kDouble);
    {
      at::NoGradGuard no_grad;
      lin->weight.fill_(1.0);
    }
    DistributedOptimizer opt(
        std::make_unique<optim::SGD>(lin->parameters(), optim::SGDOptions(1.0)),
        lin->named_parameters(), On(ctx[rank]));
    optim::Optimizer& base = opt;
    optim::StepLR scheduler(base, /*step_size=*/1, /*gamma=*/0.5);
    const at::Tensor x = at::full({1, 3}, rank + 1.0, at::kDouble);
    // Step 1 at lr 1: the averaged gradient is (1 + 2) / 2 = 1.5 per weight.
    TrainStep(base, lin, x);
    EXPECT_TRUE(
        at::allclose(lin->weight, at::full({1, 3}, 1.0 - 1.5, at::kDouble)));
    // LibTorch's StepLR changes the lr from its second step() on.
    scheduler.step();
    scheduler.step();
    EXPECT_DOUBLE_EQ(base.param_groups()[0].options().get_lr(), 0.5);
    // Step 2 at the scheduler's lr 0.5: the wrapped SGD used it.
    TrainStep(base, lin, x);
    EXPECT_TRUE(at::allclose(lin->weight,
                             at::full({1, 3}, 1.0 - 1.5 - 0.75, at::kDouble)));
    // Between steps the groups are the DistributedOptimizer's alone.
    EXPECT_EQ(base.param_groups().size(), 1u);
    EXPECT_TRUE(opt.optimizer().param_groups().empty());
    EXPECT_TRUE(base.parameters()[0].is_same(lin->weight));
  });
  ShutdownContexts(ctx);
}

TEST(DataParallel, AdamStateAndCheckpointRoundTrip) {
  Contexts ctx = StartContexts(1);
  nn::Linear lin(3, 2);
  DistributedOptimizer opt(std::make_unique<optim::Adam>(lin->parameters()),
                           lin->named_parameters(), On(ctx[0]));
  TrainStep(opt, lin, at::ones({2, 3}));
  // Adam's per-parameter state lives where state() says.
  EXPECT_EQ(opt.state().size(), 2u);
  std::stringstream checkpoint;
  ::torch::save(opt, checkpoint);

  nn::Linear other(3, 2);
  DistributedOptimizer restored(
      std::make_unique<optim::Adam>(other->parameters()),
      other->named_parameters(), On(ctx[0]));
  ::torch::load(restored, checkpoint);
  ASSERT_EQ(restored.state().size(), 2u);
  // State is keyed by each parameter's TensorImpl (its address as a string
  // in torch 1.13).
  auto key = [](const at::Tensor& p) {
#if TORCH_VERSION_MAJOR >= 2
    return static_cast<void*>(p.unsafeGetTensorImpl());
#else
    return c10::guts::to_string(p.unsafeGetTensorImpl());
#endif
  };
  const auto mine = lin->parameters(), theirs = other->parameters();
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto& a = static_cast<const optim::AdamParamState&>(
        *opt.state().at(key(mine[i])));
    const auto& b = static_cast<const optim::AdamParamState&>(
        *restored.state().at(key(theirs[i])));
    EXPECT_EQ(a.step(), b.step());
    EXPECT_TRUE(at::equal(a.exp_avg(), b.exp_avg()));
  }
  ShutdownContexts(ctx);
}

// The workaround users tried before the DistributedOptimizer was an
// Optimizer: stepping the wrapped optimizer itself. It is caught with an
// error that says so, from step(), never from inside backward().
TEST(DataParallel, SteppingTheWrappedOptimizerIsExplained) {
  Contexts ctx = StartContexts(1);
  nn::Linear lin(3, 2);
  DistributedOptimizer opt(
      std::make_unique<optim::SGD>(lin->parameters(), optim::SGDOptions(0.1)),
      lin->named_parameters(), On(ctx[0]));
  lin->forward(at::ones({1, 3})).sum().backward();
  opt.optimizer().step();  // bypasses the DistributedOptimizer
  ::testing::internal::CaptureStderr();
  lin->forward(at::ones({1, 3})).sum().backward();  // no exception here
  // Said at once on stderr, for a program that never steps kolo again.
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(warning, HasSubstr("[kolo rank 0] WARNING: DistributedOptimizer: "
                                 "the gradient of \""));
  EXPECT_THAT(warning, HasSubstr("wrapped optimizer's own step()"));
  EXPECT_THAT(warning,
              HasSubstr("(raised by the next step() or synchronize())"));
  try {
    opt.step();
    ADD_FAILURE() << "stepping the wrapped optimizer went unnoticed";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("wrapped optimizer's own step()"));
    EXPECT_THAT(e.what(), HasSubstr("call the DistributedOptimizer's instead"));
  }
  ShutdownContexts(ctx);
}

}  // namespace
}  // namespace torch
}  // namespace kolo
