// A training step of a small model, data-parallel through the installed
// kolo: what a user's CMake project does. Run it under kolorun; every rank
// prints "OK rank R of N" when its checks pass.
#include <torch/torch.h>

#include <cstdio>

#include "kolo/torch/torch.h"

int main() {
  try {
    kolo::torch::init();
    const int rank = kolo::torch::rank(), size = kolo::torch::size();

    // A collective on a tensor.
    at::Tensor t = torch::full({3}, rank + 1.0);
    kolo::torch::allreduce_(
        t, kolo::torch::AllreduceOptions().op(kolo::ReduceOp::kSum));
    const double want = size * (size + 1) / 2.0;
    if (!torch::equal(t, torch::full({3}, want))) {
      std::printf("FAILED rank %d: allreduce gave %f, want %f\n", rank,
                  t[0].item<double>(), want);
      return 1;
    }

    // One data-parallel step: the replicas stay identical.
    torch::manual_seed(rank);
    torch::nn::Linear model(4, 2);
    kolo::torch::broadcast_parameters(*model, 0);
    kolo::torch::DistributedOptimizer optimizer(
        std::make_unique<torch::optim::SGD>(model->parameters(), 0.1),
        model->named_parameters());
    model->forward(torch::full({2, 4}, rank + 1.0)).sum().backward();
    optimizer.step();
    at::Tensor gathered =
        kolo::torch::allgather(model->weight.detach().unsqueeze(0));
    for (int r = 1; r < size; ++r) {
      if (!torch::equal(gathered[r], gathered[0])) {
        std::printf("FAILED rank %d: replicas differ after a step\n", rank);
        return 1;
      }
    }
    kolo::torch::shutdown();
    std::printf("OK rank %d of %d\n", rank, size);
    return 0;
  } catch (const std::exception& e) {  // kolo::torch::Error, c10::Error
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
}
