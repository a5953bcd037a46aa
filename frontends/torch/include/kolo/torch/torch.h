// kolo's LibTorch frontend, all of it:
//   context.h                collectives on at::Tensor, init(), rank(), ...
//   distributed_optimizer.h  DistributedOptimizer
//   gradient_reducer.h       GradientReducer (its gradient hooks)
//   broadcast.h              broadcast_parameters, broadcast_optimizer_state
// User guide: docs/torch.md.
#ifndef KOLO_TORCH_TORCH_H_
#define KOLO_TORCH_TORCH_H_

#include "kolo/torch/broadcast.h"
#include "kolo/torch/context.h"
#include "kolo/torch/distributed_optimizer.h"
#include "kolo/torch/elastic.h"
#include "kolo/torch/gradient_reducer.h"

#endif  // KOLO_TORCH_TORCH_H_
