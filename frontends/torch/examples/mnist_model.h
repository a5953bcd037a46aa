// The classic MNIST CNN (PyTorch's examples/mnist without dropout): shared
// by the example and the training benchmark.
#ifndef KOLO_FRONTENDS_TORCH_EXAMPLES_MNIST_MODEL_H_
#define KOLO_FRONTENDS_TORCH_EXAMPLES_MNIST_MODEL_H_

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace kolo {
namespace examples {

// [N, 1, 28, 28] images -> [N, 10] logits.
struct MnistNetImpl : ::torch::nn::Module {
  MnistNetImpl()
      : conv1(register_module(
            "conv1", ::torch::nn::Conv2d(
                         ::torch::nn::Conv2dOptions(1, 32, 3).padding(1)))),
        conv2(register_module(
            "conv2", ::torch::nn::Conv2d(
                         ::torch::nn::Conv2dOptions(32, 64, 3).padding(1)))),
        fc1(register_module("fc1", ::torch::nn::Linear(64 * 14 * 14, 128))),
        fc2(register_module("fc2", ::torch::nn::Linear(128, 10))) {}

  at::Tensor forward(at::Tensor x) {
    namespace F = ::torch::nn::functional;
    x = F::relu(conv1->forward(x));
    x = F::relu(conv2->forward(x));
    x = F::max_pool2d(x, F::MaxPool2dFuncOptions(2));
    x = F::relu(fc1->forward(x.flatten(1)));
    return fc2->forward(x);
  }

  ::torch::nn::Conv2d conv1;
  ::torch::nn::Conv2d conv2;
  ::torch::nn::Linear fc1;
  ::torch::nn::Linear fc2;
};
TORCH_MODULE(MnistNet);

}  // namespace examples
}  // namespace kolo

#endif  // KOLO_FRONTENDS_TORCH_EXAMPLES_MNIST_MODEL_H_
