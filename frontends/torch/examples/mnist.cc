// Data-parallel training of the classic CNN on Fashion-MNIST with kolo.
//
//   kolorun -np 2 bazel-bin/frontends/torch/examples/mnist --epochs 2
//
// Each rank reads the real IDX .gz files, trains on its own shard of the
// training set (DistributedRandomSampler, reshuffled every epoch) with batch
// 64 and Adam; gradients are averaged by kolo's DistributedOptimizer. Rank 0
// prints the loss (averaged over ranks); at the end the test accuracy
// (counts summed over ranks) is printed, and every rank prints
// "OK rank R of N: ...".
//
// Flags: --epochs N (2), --data-dir DIR (/usr/share/datasets/fashion-mnist),
// --limit-train N / --limit-test N (use the first N images; 0 = all),
// --batch-size N (64), --lr X (0.001), --log-interval STEPS (100),
// --seed N (42), --min-accuracy PERCENT (exit 1 below it; 0 = no check),
// --device cpu|cuda (cpu; cuda: each rank trains on GPU local_rank, its
// gradients go over NCCL while the loss and accuracy sums stay CPU tensors).
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "frontends/torch/examples/idx_file.h"
#include "frontends/torch/examples/mnist_model.h"
#include "kolo/torch/torch.h"

namespace {

struct Flags {
  int epochs = 2;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t limit_train = 0;
  int64_t limit_test = 0;
  int64_t batch_size = 64;
  double lr = 1e-3;
  int log_interval = 100;
  uint64_t seed = 42;
  double min_accuracy = 0;
  std::string device = "cpu";
};

const char kUsage[] =
    "usage: %s [--epochs N] [--data-dir DIR] [--limit-train N] "
    "[--limit-test N]\n"
    "          [--batch-size N] [--lr X] [--log-interval STEPS] [--seed N]\n"
    "          [--min-accuracy PERCENT] [--device cpu|cuda]\n";

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::printf(kUsage, argv[0]);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, kUsage, argv[0]);
      std::fprintf(stderr, "(missing value or unknown argument: %s)\n",
                   arg.c_str());
      return false;
    }
    const char* value = argv[++i];
    char* end = nullptr;
    bool ok = true;
    auto integer = [&](int64_t min) {
      long long v = std::strtoll(value, &end, 10);
      ok = *end == '\0' && v >= min;
      return v;
    };
    if (arg == "--epochs")
      f->epochs = static_cast<int>(integer(1));
    else if (arg == "--data-dir")
      f->data_dir = value;
    else if (arg == "--limit-train")
      f->limit_train = integer(0);
    else if (arg == "--limit-test")
      f->limit_test = integer(0);
    else if (arg == "--batch-size")
      f->batch_size = integer(1);
    else if (arg == "--log-interval")
      f->log_interval = static_cast<int>(integer(1));
    else if (arg == "--seed")
      f->seed = static_cast<uint64_t>(integer(0));
    else if (arg == "--lr") {
      f->lr = std::strtod(value, &end);
      ok = *end == '\0' && f->lr > 0;
    } else if (arg == "--device") {
      f->device = value;
      ok = f->device == "cpu" || f->device == "cuda";
    } else if (arg == "--min-accuracy") {
      f->min_accuracy = std::strtod(value, &end);
      ok = *end == '\0' && f->min_accuracy >= 0 && f->min_accuracy <= 100;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, kUsage, argv[0]);
      std::fprintf(stderr, "(bad or unknown argument: %s %s)\n", arg.c_str(),
                   value);
      return false;
    }
  }
  return true;
}

struct Split {
  at::Tensor images;  // [N, 1, 28, 28] float, normalised
  at::Tensor labels;  // [N] int64
};

// Reads one split ("train" or "t10k"); exits with a clear message when the
// files are missing or broken.
Split LoadSplit(const Flags& flags, const std::string& prefix, int64_t limit) {
  const std::string images_path =
      flags.data_dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path =
      flags.data_dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  auto images = kolo::examples::ReadIdx(images_path, limit);
  auto labels = images.ok() ? kolo::examples::ReadIdx(labels_path, limit)
                            : images.status();
  if (!images.ok() || !labels.ok()) {
    const absl::Status& s = images.ok() ? labels.status() : images.status();
    std::fprintf(stderr,
                 "mnist: cannot read the Fashion-MNIST data: %s\n"
                 "  --data-dir (%s) must hold train-images-idx3-ubyte.gz, "
                 "train-labels-idx1-ubyte.gz,\n  t10k-images-idx3-ubyte.gz and "
                 "t10k-labels-idx1-ubyte.gz (Debian: apt-get install "
                 "dataset-fashion-mnist).\n",
                 std::string(s.message()).c_str(), flags.data_dir.c_str());
    std::exit(2);
  }
  if (images->dims.size() != 3 || labels->dims.size() != 1 ||
      images->dims[0] != labels->dims[0]) {
    std::fprintf(stderr, "mnist: %s and %s do not match\n", images_path.c_str(),
                 labels_path.c_str());
    std::exit(2);
  }
  Split split;
  split.images =
      torch::from_blob(images->data.data(),
                       {images->dims[0], 1, images->dims[1], images->dims[2]},
                       torch::kUInt8)
          .to(torch::kFloat)
          .div_(255)
          .sub_(0.2860)   // Fashion-MNIST's mean and standard
          .div_(0.3530);  // deviation of the training pixels
  split.labels =
      torch::from_blob(labels->data.data(), {labels->dims[0]}, torch::kUInt8)
          .to(torch::kLong);
  return split;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  // kolorun gives each of N local workers cores/N threads through
  // OMP_NUM_THREADS, which LibTorch's OpenMP pool reads by itself.
  const auto start = std::chrono::steady_clock::now();
  // Before joining the job: a missing file is reported at once, not as a
  // lost rank.
  Split train = LoadSplit(flags, "train", flags.limit_train);
  Split test = LoadSplit(flags, "t10k", flags.limit_test);

  try {
    kolo::torch::init();
    const int rank = kolo::torch::rank(), size = kolo::torch::size();
    torch::Device device(torch::kCPU);
    if (flags.device == "cuda") {
      if (!torch::cuda::is_available()) {
        std::fprintf(stderr,
                     "mnist: --device cuda, but this LibTorch has no CUDA or "
                     "no GPU is visible\n");
        kolo::torch::shutdown();
        return 2;
      }
      device = torch::Device(
          torch::kCUDA, static_cast<c10::DeviceIndex>(
                            kolo::torch::local_rank() %
                            static_cast<int>(torch::cuda::device_count())));
      train.images = train.images.to(device);
      train.labels = train.labels.to(device);
      test.images = test.images.to(device);
      test.labels = test.labels.to(device);
    }
    const int64_t n_train = train.images.size(0);
    torch::manual_seed(flags.seed + rank);  // different inits on purpose:
    kolo::examples::MnistNet model;         // broadcast_parameters fixes them
    model->to(device);
    kolo::torch::DistributedOptimizer optimizer(
        std::make_unique<torch::optim::Adam>(
            model->parameters(), torch::optim::AdamOptions(flags.lr)),
        model->named_parameters());
    kolo::torch::broadcast_parameters(*model, /*root=*/0);
    kolo::torch::broadcast_optimizer_state(optimizer, /*root=*/0);

    // Every rank gets ceil(n / size) indices (padded with duplicates), so
    // every rank takes the same number of steps.
    torch::data::samplers::DistributedRandomSampler sampler(n_train, size,
                                                            rank);
    const int64_t per_rank = (n_train + size - 1) / size;
    const int64_t steps = (per_rank + flags.batch_size - 1) / flags.batch_size;
    if (rank == 0) {
      std::printf(
          "mnist: %d ranks x %d threads, %lld training images (%lld per rank, "
          "%lld steps of %lld per epoch), %lld test images\n",
          size, torch::get_num_threads(), static_cast<long long>(n_train),
          static_cast<long long>(per_rank), static_cast<long long>(steps),
          static_cast<long long>(flags.batch_size),
          static_cast<long long>(test.images.size(0)));
      std::fflush(stdout);
    }

    for (int epoch = 1; epoch <= flags.epochs; ++epoch) {
      const auto epoch_start = std::chrono::steady_clock::now();
      model->train();
      sampler.set_epoch(epoch);
      sampler.reset();  // reshuffles with the epoch as the seed
      double loss_sum = 0;
      int64_t loss_count = 0, step = 0;
      while (auto indices = sampler.next(flags.batch_size)) {
        at::Tensor idx = torch::tensor(std::vector<int64_t>(indices->begin(),
                                                            indices->end()))
                             .to(device);
        optimizer.zero_grad();
        at::Tensor loss = torch::nn::functional::cross_entropy(
            model->forward(train.images.index_select(0, idx)),
            train.labels.index_select(0, idx));
        loss.backward();
        optimizer.step();
        loss_sum += loss.item<double>();
        ++loss_count;
        if (++step % flags.log_interval == 0 || step == steps) {
          // Collective: every rank reaches the same steps.
          at::Tensor mean = kolo::torch::allreduce(
              torch::tensor({loss_sum / loss_count}, torch::kDouble),
              kolo::torch::AllreduceOptions().name("train_loss"));
          if (rank == 0) {
            std::printf("epoch %d/%d step %lld/%lld loss %.4f\n", epoch,
                        flags.epochs, static_cast<long long>(step),
                        static_cast<long long>(steps), mean.item<double>());
            std::fflush(stdout);
          }
          loss_sum = 0;
          loss_count = 0;
        }
      }
      if (rank == 0) {
        std::printf("epoch %d/%d done in %.1f s\n", epoch, flags.epochs,
                    Seconds(epoch_start));
        std::fflush(stdout);
      }
    }

    // Each rank scores every size-th test image; the counts are summed.
    model->eval();
    torch::NoGradGuard no_grad;
    at::Tensor mine = torch::arange(rank, test.images.size(0), size).to(device);
    int64_t correct = 0;
    for (int64_t begin = 0; begin < mine.size(0); begin += 1000) {
      at::Tensor idx = mine.slice(0, begin, begin + 1000);
      at::Tensor predicted =
          model->forward(test.images.index_select(0, idx)).argmax(1);
      correct +=
          predicted.eq(test.labels.index_select(0, idx)).sum().item<int64_t>();
    }
    at::Tensor counts = kolo::torch::allreduce(
        torch::tensor({correct, mine.size(0)}, torch::kLong),
        kolo::torch::AllreduceOptions()
            .name("test_accuracy")
            .op(kolo::ReduceOp::kSum));
    const int64_t total_correct = counts[0].item<int64_t>();
    const int64_t total = counts[1].item<int64_t>();
    const double accuracy = total ? 100.0 * total_correct / total : 0;
    if (rank == 0) {
      std::printf(
          "test accuracy %.2f%% (%lld of %lld) after %d epochs on %d "
          "ranks, %.1f s\n",
          accuracy, static_cast<long long>(total_correct),
          static_cast<long long>(total), flags.epochs, size, Seconds(start));
    }
    kolo::torch::shutdown();
    if (accuracy < flags.min_accuracy) {
      std::printf(
          "FAILED rank %d of %d: test accuracy %.2f%% is below "
          "--min-accuracy %.2f%%\n",
          rank, size, accuracy, flags.min_accuracy);
      return 1;
    }
    std::printf("OK rank %d of %d: test accuracy %.2f%%\n", rank, size,
                accuracy);
    return 0;
  } catch (const kolo::torch::Error& e) {
    std::fprintf(stderr, "mnist: kolo: %s\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "mnist: torch: %s\n", e.what_without_backtrace());
    return 1;
  }
}
