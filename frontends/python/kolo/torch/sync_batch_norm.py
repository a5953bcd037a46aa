"""SyncBatchNorm: batch normalization over the whole global batch.

In training mode the mean and variance are those of every rank's batch
together (as if one rank had the concatenated batch): two differentiable
allreduces (the sum, then the sum of squared deviations), so autograd
gives exact gradients through the statistics with no code of its own. In
eval mode the running statistics are used, with no communication.
"""

import torch

from kolo.torch import mpi_ops
from kolo.torch.mpi_ops import Sum, global_process_set


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """A drop-in for torch.nn.SyncBatchNorm / BatchNorm1d/2d/3d over the
    ranks of ``process_set``."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine,
                         track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" %
                             input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return super().forward(input)
        if self.momentum is None:
            self.num_batches_tracked += 1
            factor = 1.0 / float(self.num_batches_tracked)
        else:
            factor = self.momentum
            if self.training and self.track_running_stats:
                self.num_batches_tracked += 1
        dims = [0] + list(range(2, input.dim()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        count = torch.tensor([input.numel() / input.shape[1]],
                             dtype=input.dtype)
        # [sum over this rank's batch..., count]: one allreduce for both.
        totals = mpi_ops.allreduce(
            torch.cat([input.sum(dims), count]), op=Sum,
            name=None, process_set=self.process_set)
        n = totals[-1]
        mean = totals[:-1] / n
        centered = input - mean.view(shape)
        var = mpi_ops.allreduce((centered * centered).sum(dims), op=Sum,
                                process_set=self.process_set) / n
        out = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                unbiased = var * n / (n - 1).clamp(min=1)
                self.running_mean.mul_(1 - factor).add_(mean.detach() * factor)
                self.running_var.mul_(1 - factor).add_(
                    unbiased.detach() * factor)
        return out
