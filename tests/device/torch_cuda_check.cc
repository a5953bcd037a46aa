// kolo::torch on CUDA tensors, for the GPU machine (tools/device_check.sh
// builds it there with CMake against that machine's CUDA LibTorch; the
// Bazel target builds it here against the CPU LibTorch, where it skips).
//
// A plain program, no test framework: prints "PASS <check>", "FAIL <check>:
// why" or "SKIP <check>: why" per check and a last line "torch_cuda_check: N
// passed, N failed, N skipped"; exits 1 if anything failed, else 0.
//
// World size 1 (NCCL refuses two ranks of one communicator on one GPU; the
// two-process hierarchical path is hierarchical_gpu_test's): every
// collective and dtype on cuda:0 against host-computed values, CPU and CUDA
// tensors in one step, results of kernels still queued on the stream when
// the collective is submitted (ready events), and DistributedOptimizer on a
// CUDA model against the same model trained without kolo.
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "kolo/store.h"
#include "kolo/torch/context.h"
#include "kolo/torch/distributed_optimizer.h"

namespace {

int passed = 0, failed = 0, skipped = 0;

void Check(const std::string& name, const std::function<void()>& body) {
  try {
    body();
    std::printf("PASS %s\n", name.c_str());
    ++passed;
  } catch (const std::exception& e) {
    std::printf("FAIL %s: %s\n", name.c_str(), e.what());
    ++failed;
  }
  std::fflush(stdout);
}

void Expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void ExpectEqual(const at::Tensor& got, const at::Tensor& want,
                 const std::string& what) {
  at::Tensor g = got.to(at::kCPU).to(at::kDouble);
  at::Tensor w = want.to(at::kCPU).to(at::kDouble);
  if (!g.sizes().equals(w.sizes()) || !at::equal(g, w)) {
    std::ostringstream os;
    os << what << ": got " << g << " want " << w;
    throw std::runtime_error(os.str());
  }
}

const std::vector<at::ScalarType> kDtypes = {
    at::kByte, at::kChar,     at::kInt,   at::kLong,
    at::kHalf, at::kBFloat16, at::kFloat, at::kDouble};

bool Floating(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat ||
         t == at::kDouble;
}

}  // namespace

int main() {
  namespace kt = kolo::torch;
  if (!torch::cuda::is_available()) {
    std::printf(
        "SKIP all: this LibTorch has no CUDA or no GPU is visible "
        "(torch::cuda::is_available() is false)\n");
    std::printf("torch_cuda_check: 0 passed, 0 failed, 1 skipped\n");
    return 0;
  }
  kolo::Options options;
  options.rank = 0;
  options.size = 1;
  options.store = kolo::NewInMemoryStore();
  options.secret = "torch-cuda-check-secret";
  options.op_timeout = absl::Seconds(60);
  std::shared_ptr<kt::Context> ctx;
  try {
    ctx = kt::Context::Create(options);
  } catch (const std::exception& e) {
    std::printf("FAIL start: %s\n", e.what());
    std::printf("torch_cuda_check: 0 passed, 1 failed, 0 skipped\n");
    return 1;
  }
  const at::Device gpu(at::kCUDA, 0);

  for (at::ScalarType dtype : kDtypes) {
    const std::string d = c10::toString(dtype);
    const at::Tensor host =
        at::arange(24, at::kDouble).remainder(7).reshape({4, 6}).to(dtype);
    const at::Tensor x = host.to(gpu);
    Check("allreduce sum " + d, [&] {
      at::Tensor y =
          ctx->allreduce(x, kt::AllreduceOptions().op(kolo::ReduceOp::kSum));
      Expect(y.device() == gpu, "result not on cuda:0");
      ExpectEqual(y, host, "sum over one rank");
    });
    Check("allreduce min/max/product in place " + d, [&] {
      for (kolo::ReduceOp op : {kolo::ReduceOp::kMin, kolo::ReduceOp::kMax,
                                kolo::ReduceOp::kProduct}) {
        at::Tensor y = x.clone();
        ctx->allreduce_(y, kt::AllreduceOptions().op(op));
        ExpectEqual(y, host, kolo::ReduceOpName(op));
      }
    });
    if (Floating(dtype)) {
      Check("allreduce average and scaling " + d, [&] {
        ExpectEqual(ctx->allreduce(x), host, "average");
        at::Tensor y = ctx->allreduce(x, kt::AllreduceOptions()
                                             .op(kolo::ReduceOp::kSum)
                                             .prescale(2.0)
                                             .postscale(0.5));
        ExpectEqual(y, host, "prescale 2, postscale 0.5");
      });
    }
    Check("allgather " + d,
          [&] { ExpectEqual(ctx->allgather(x), host, "allgather"); });
    Check("broadcast " + d, [&] {
      at::Tensor y = x.clone();
      ctx->broadcast_(y, kt::BroadcastOptions().root(0));
      ExpectEqual(y, host, "broadcast");
    });
    Check("alltoall " + d,
          [&] { ExpectEqual(ctx->alltoall(x), host, "alltoall"); });
    Check("reducescatter " + d, [&] {
      ExpectEqual(ctx->reducescatter(
                      x, kt::ReducescatterOptions().op(kolo::ReduceOp::kSum)),
                  host, "reducescatter");
    });
  }

  Check(
      "many small CUDA tensors fused, with CPU tensors in the same step", [&] {
        std::vector<at::Tensor> gpu_in, cpu_in;
        std::vector<kt::Handle> handles;
        for (int i = 0; i < 64; ++i) {
          gpu_in.push_back(
              at::full({100 + i}, float(i), at::TensorOptions(gpu)));
          cpu_in.push_back(at::full({50 + i}, float(-i)));
          handles.push_back(ctx->allreduce_async(
              gpu_in.back(), kt::AllreduceOptions().op(kolo::ReduceOp::kSum)));
          handles.push_back(ctx->allreduce_async(
              cpu_in.back(), kt::AllreduceOptions().op(kolo::ReduceOp::kSum)));
        }
        for (int i = 0; i < 64; ++i) {
          at::Tensor g = handles[2 * i].wait();
          at::Tensor c = handles[2 * i + 1].wait();
          Expect(g.is_cuda() && c.is_cpu(), "results on the wrong devices");
          ExpectEqual(g, gpu_in[i].cpu(), "gpu tensor " + std::to_string(i));
          ExpectEqual(c, cpu_in[i], "cpu tensor " + std::to_string(i));
        }
      });

  Check(
      "a tensor still being computed on the stream is read once written", [&] {
        // Queue a long chain of kernels, then submit its result at once.
        at::Tensor a = at::rand({2048, 2048}, at::TensorOptions(gpu));
        at::Tensor b = a;
        for (int i = 0; i < 20; ++i) b = at::matmul(b, a).div_(2048.0);
        at::Tensor expected = b.cpu();  // (synchronises; b's value is fixed)
        at::Tensor c = a;
        for (int i = 0; i < 20; ++i) c = at::matmul(c, a).div_(2048.0);
        at::Tensor y =
            ctx->allreduce(c, kt::AllreduceOptions().op(kolo::ReduceOp::kSum));
        // Read too early, it would hold another chain's values or garbage.
        Expect(at::allclose(y.cpu(), expected, 1e-4, 1e-6),
               "allreduce of a queued result differs from its value");
      });

  Check("DistributedOptimizer on a CUDA model matches plain training", [&] {
    torch::manual_seed(7);
    torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                                torch::nn::Linear(64, 10));
    torch::nn::Sequential reference(torch::nn::Linear(32, 64),
                                    torch::nn::ReLU(),
                                    torch::nn::Linear(64, 10));
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      torch::NoGradGuard no_grad;
      reference->parameters()[i].copy_(model->parameters()[i]);
    }
    model->to(gpu);
    reference->to(gpu);
    kt::DistributedOptimizer opt(
        std::make_unique<torch::optim::SGD>(model->parameters(),
                                            torch::optim::SGDOptions(0.1)),
        model->named_parameters(),
        kt::DistributedOptimizerOptions().context(ctx));
    torch::optim::SGD ref_opt(reference->parameters(),
                              torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 5; ++step) {
      at::Tensor in = at::rand({16, 32}, at::TensorOptions(gpu));
      at::Tensor target =
          at::randint(0, 10, {16}, at::TensorOptions(gpu).dtype(at::kLong));
      opt.zero_grad();
      torch::nn::functional::cross_entropy(model->forward(in), target)
          .backward();
      opt.step();
      ref_opt.zero_grad();
      torch::nn::functional::cross_entropy(reference->forward(in), target)
          .backward();
      ref_opt.step();
    }
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      ExpectEqual(model->parameters()[i], reference->parameters()[i],
                  "parameter " + std::to_string(i));
    }
  });

  try {
    ctx->shutdown();
  } catch (const std::exception& e) {
    std::printf("FAIL shutdown: %s\n", e.what());
    ++failed;
  }
  std::printf("torch_cuda_check: %d passed, %d failed, %d skipped\n", passed,
              failed, skipped);
  return failed ? 1 : 0;
}
