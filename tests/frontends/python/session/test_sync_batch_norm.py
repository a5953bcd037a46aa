"""SyncBatchNorm on N ranks equals BatchNorm2d on the concatenated batch:
outputs, input gradients, parameter gradients and running statistics."""

import torch

import kolo.torch as hvd


def _batch(r):
    g = torch.Generator().manual_seed(300 + r)
    return torch.randn(3 + r, 4, 5, 5, generator=g, dtype=torch.float64)


def test_equals_batchnorm_on_the_concatenated_batch(rank, size):
    sync = hvd.SyncBatchNorm(4).double()
    ref = torch.nn.BatchNorm2d(4).double()
    with torch.no_grad():
        for bn in (sync, ref):
            bn.weight.copy_(torch.linspace(0.5, 2.0, 4))
            bn.bias.copy_(torch.linspace(-1.0, 1.0, 4))
    x = _batch(rank).requires_grad_()
    y = sync(x)
    w = torch.arange(y.numel(), dtype=torch.float64).reshape(y.shape) % 3
    (y * w).sum().backward()

    xs = [_batch(r).requires_grad_() for r in range(size)]
    ys = ref(torch.cat(xs))
    ws = torch.cat([torch.arange(_batch(r).numel(), dtype=torch.float64)
                    .reshape(_batch(r).shape) % 3 for r in range(size)])
    (ys * ws).sum().backward()

    offset = sum(3 + r for r in range(rank))
    assert torch.allclose(y, ys[offset:offset + 3 + rank].detach(), atol=1e-10)
    assert torch.allclose(x.grad, xs[rank].grad, atol=1e-9)
    # Each rank holds its share of the parameter gradients: summed over the
    # ranks they are BatchNorm's.
    for which, mine, theirs in (("weight", sync.weight.grad, ref.weight.grad),
                                ("bias", sync.bias.grad, ref.bias.grad)):
        total = hvd.allreduce(mine, op=hvd.Sum, name="sbn.grad." + which)
        assert torch.allclose(total, theirs, atol=1e-9)
    assert torch.allclose(sync.running_mean, ref.running_mean, atol=1e-10)
    assert torch.allclose(sync.running_var, ref.running_var, atol=1e-10)
    # Eval mode: the running statistics, no communication.
    sync.eval()
    ref.eval()
    assert torch.allclose(sync(_batch(rank)), ref(_batch(rank)), atol=1e-10)
