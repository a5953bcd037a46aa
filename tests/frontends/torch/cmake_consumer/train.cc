// train.cc: a plain LibTorch training program (the classic MNIST CNN, a
// train_epoch() helper that takes torch::optim::Optimizer&, an LR scheduler,
// checkpoints it resumes from), made data-parallel with kolo. The lines
// marked "kolo" are the port; no function signature changed. docs/torch.md
// shows this program; the install test builds it with CMake against the
// installed kolo and runs it under kolorun.
//
//   kolorun -np 2 train DATA_DIR [EPOCHS [CHECKPOINT_DIR [MAX_BATCHES]]]
//
// MAX_BATCHES: stop each epoch after that many batches per rank (0, the
// default: the whole shard).
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "kolo/torch/torch.h"  // kolo

struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv(register_module("conv", torch::nn::Conv2d(
                                         torch::nn::Conv2dOptions(1, 16, 3)
                                             .padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(16 * 14 * 14, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv(x)), 2);
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
  torch::nn::Conv2d conv;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

// One pass over `loader` (at most `max_batches` if not 0); returns the last
// batch's loss.
template <typename Loader>
float train_epoch(Net& model, torch::optim::Optimizer& optimizer,
                  Loader& loader, size_t max_batches) {
  model->train();
  float loss_value = 0;
  size_t batches = 0;
  for (auto& batch : loader) {
    if (max_batches != 0 && batches++ == max_batches) break;
    optimizer.zero_grad();
    torch::Tensor loss = torch::nll_loss(
        torch::log_softmax(model->forward(batch.data), 1), batch.target);
    loss.backward();   // kolo allreduces the gradients as they become ready
    optimizer.step();  // waits for them, then Adam steps
    loss_value = loss.item<float>();
  }
  return loss_value;
}

int main(int argc, char** argv) {
  const std::string data = argc > 1 ? argv[1] : "data";
  const int64_t epochs = argc > 2 ? std::stoll(argv[2]) : 2;
  const std::string checkpoint = argc > 3 ? argv[3] : "checkpoint";
  const size_t max_batches = argc > 4 ? std::stoul(argv[4]) : 0;
  kolo::torch::init();                                         // kolo
  const int rank = kolo::torch::rank(), size = kolo::torch::size();  // kolo

  torch::manual_seed(1);
  Net model;
  kolo::torch::DistributedOptimizer optimizer(                 // kolo
      std::make_unique<torch::optim::Adam>(model->parameters(),
                                           torch::optim::AdamOptions(1e-3)),
      model->named_parameters());                              // kolo
  torch::optim::StepLR scheduler(optimizer, /*step_size=*/1, /*gamma=*/0.5);

  int64_t first_epoch = 1;
  if (rank == 0 &&  // kolo: rank 0 reads the checkpoint, then broadcasts it
      std::filesystem::exists(checkpoint + "/model.pt")) {
    torch::load(model, checkpoint + "/model.pt");
    torch::load(optimizer, checkpoint + "/optimizer.pt");  // Adam's state
    torch::Tensor epoch;
    torch::load(epoch, checkpoint + "/epoch.pt");
    first_epoch = epoch.item<int64_t>() + 1;
  }
  kolo::torch::broadcast_parameters(*model, 0);               // kolo
  kolo::torch::broadcast_optimizer_state(optimizer, 0);       // kolo
  first_epoch = kolo::torch::broadcast(                       // kolo
                    torch::tensor(first_epoch),
                    kolo::torch::BroadcastOptions().name("first_epoch"))
                    .item<int64_t>();
  // LibTorch's load() restores the optimizer's state, not its options:
  // replay the scheduler to the epoch's lr.
  for (int64_t epoch = 1; epoch < first_epoch; ++epoch) scheduler.step();
  if (rank == 0 && first_epoch > 1) {
    std::printf("resumed at epoch %ld\n", static_cast<long>(first_epoch));
  }

  auto train = torch::data::datasets::MNIST(data)
                   .map(torch::data::transforms::Normalize<>(0.2860, 0.3530))
                   .map(torch::data::transforms::Stack<>());
  // kolo: each rank reads its own shard (was RandomSampler(n)).
  torch::data::samplers::DistributedRandomSampler sampler(train.size().value(),
                                                          size, rank);
  auto loader = torch::data::make_data_loader(
      train, sampler, torch::data::DataLoaderOptions().batch_size(64));
  for (int64_t epoch = first_epoch; epoch <= epochs; ++epoch) {
    sampler.set_epoch(epoch);  // kolo: a new shuffle of the shards
    const double lr = static_cast<torch::optim::AdamOptions&>(
                          optimizer.param_groups()[0].options())
                          .lr();
    const float loss = train_epoch(model, optimizer, *loader, max_batches);
    scheduler.step();
    if (rank == 0) {  // kolo: one rank prints and writes the checkpoint
      std::printf("epoch %ld lr %g loss %.4f\n", static_cast<long>(epoch), lr,
                  loss);
      std::filesystem::create_directories(checkpoint);
      torch::save(model, checkpoint + "/model.pt");
      torch::save(optimizer, checkpoint + "/optimizer.pt");
      torch::save(torch::tensor(epoch), checkpoint + "/epoch.pt");
    }
  }

  auto test = torch::data::datasets::MNIST(
                  data, torch::data::datasets::MNIST::Mode::kTest)
                  .map(torch::data::transforms::Normalize<>(0.2860, 0.3530))
                  .map(torch::data::transforms::Stack<>());
  // kolo: each rank scores a shard (was SequentialSampler(n)).
  torch::data::samplers::DistributedSequentialSampler test_sampler(
      test.size().value(), size, rank);
  auto test_loader = torch::data::make_data_loader(
      test, test_sampler, torch::data::DataLoaderOptions().batch_size(500));
  torch::NoGradGuard no_grad;
  model->eval();
  auto counts = torch::zeros({2}, torch::kLong);  // correct, total
  for (auto& batch : *test_loader) {
    counts[0] += model->forward(batch.data).argmax(1).eq(batch.target).sum();
    counts[1] += batch.target.size(0);
  }
  kolo::torch::allreduce_(counts, kolo::torch::AllreduceOptions()  // kolo
                                      .name("accuracy")
                                      .op(kolo::ReduceOp::kSum));
  if (rank == 0) {
    std::printf("test accuracy %.2f%% of %ld\n",
                100.0 * counts[0].item<int64_t>() / counts[1].item<int64_t>(),
                static_cast<long>(counts[1].item<int64_t>()));
  }
  // Every replica holds the same parameters (printed to show it).
  double total = 0;
  for (const auto& p : model->parameters()) total += p.sum().item<double>();
  std::printf("rank %d parameters %.17g\n", rank, total);
  kolo::torch::shutdown();                                     // kolo
}
