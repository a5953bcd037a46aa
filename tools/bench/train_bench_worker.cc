// One rank of the training benchmark (tools/bench/train_bench.sh runs it
// under kolorun): the mnist example's CNN, Adam, batch 64 per rank on
// synthetic data (throughput does not depend on the values), gradients
// averaged by kolo's DistributedOptimizer. Rank 0 prints
//   RESULT ranks=N threads=T samples_per_s=X step_ms=Y
// where the time is the slowest rank's, over --steps steps after --warmup.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "frontends/torch/examples/mnist_model.h"
#include "kolo/torch/torch.h"

int main(int argc, char** argv) {
  int steps = 30, warmup = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--steps" && value > 0) {
      steps = value;
    } else if (flag == "--warmup" && value >= 0) {
      warmup = value;
    } else {
      std::fprintf(stderr, "usage: %s [--steps N] [--warmup N]\n", argv[0]);
      return 2;
    }
  }
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) {
    if (int n = std::atoi(omp); n > 0) torch::set_num_threads(n);
  }
  constexpr int64_t kBatch = 64;
  try {
    kolo::torch::init();
    const int rank = kolo::torch::rank(), size = kolo::torch::size();
    torch::manual_seed(rank);
    kolo::examples::MnistNet model;
    kolo::torch::DistributedOptimizer optimizer(
        std::make_unique<torch::optim::Adam>(model->parameters(), 1e-3),
        model->named_parameters());
    kolo::torch::broadcast_parameters(*model, 0);
    at::Tensor x = torch::randn({kBatch, 1, 28, 28});
    at::Tensor y = torch::randint(10, {kBatch}, torch::kLong);
    auto step = [&] {
      optimizer.zero_grad();
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
      optimizer.step();
    };
    for (int i = 0; i < warmup; ++i) step();
    kolo::torch::barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) step();
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    seconds =
        kolo::torch::allreduce(torch::tensor({seconds}, torch::kDouble),
                               kolo::torch::AllreduceOptions().name("time").op(
                                   kolo::ReduceOp::kMax))
            .item<double>();
    if (rank == 0) {
      std::printf(
          "RESULT ranks=%d threads=%d samples_per_s=%.1f step_ms=%.1f\n", size,
          torch::get_num_threads(), size * kBatch * steps / seconds,
          1000 * seconds / steps);
    }
    kolo::torch::shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_bench_worker: %s\n", e.what());
    return 1;
  }
}
