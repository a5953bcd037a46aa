"""Gradients of the differentiable collectives against the analytic ones.

Every rank r computes loss_r = sum(w_r * f(x_r)) for a fixed weight w_r;
the gradient of the total loss sum_k loss_k with respect to rank r's input
is what each collective's backward must give on rank r.
"""

import torch

import kolo.torch as hvd


def _w(r, shape):
    return torch.arange(1.0, 1.0 + torch.Size(shape).numel(),
                        dtype=torch.float64).reshape(shape) * (r + 1)


def _x(r, shape):
    return (torch.arange(torch.Size(shape).numel(), dtype=torch.float64)
            .reshape(shape) % 7 + 1 + r).requires_grad_()


def test_allreduce_sum_average_and_scaled(rank, size):
    shape = (3, 2)
    all_w = sum(_w(r, shape) for r in range(size))
    for op, factor in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / size)):
        x = _x(rank, shape)
        y = hvd.allreduce(x, op=op, prescale_factor=2.0, postscale_factor=0.5,
                          name="grad.allreduce.%d" % op)
        (y * _w(rank, shape)).sum().backward()
        # d/dx_r sum_k w_k . (post * op(pre * x)) = post * pre * factor * sum_k w_k
        assert torch.allclose(x.grad, all_w * factor)


def test_allreduce_min_max_product(rank, size):
    shape = (4,)
    xs = [_x(r, shape).detach() for r in range(size)]
    all_w = sum(_w(r, shape) for r in range(size)).double()
    for op in (hvd.Min, hvd.Max, hvd.Product):
        x = _x(rank, shape)
        y = hvd.allreduce(x, op=op, name="grad.op.%d" % op)
        (y * _w(rank, shape)).sum().backward()
        stacked = torch.stack(xs)
        if op == hvd.Product:
            others = torch.stack([xs[k] for k in range(size) if k != rank])
            want = all_w * others.prod(0)
        else:
            best = stacked.min(0).values if op == hvd.Min else \
                stacked.max(0).values
            ties = (stacked == best).sum(0).double()
            want = all_w * (xs[rank] == best).double() / ties
        assert torch.allclose(x.grad, want), op


def test_allgather_gives_each_rank_its_rows(rank, size):
    rows = rank + 1
    x = _x(rank, (rows, 2))
    y = hvd.allgather(x, name="grad.allgather")
    total = sum(_w(r, (sum(k + 1 for k in range(size)), 2))
                for r in range(size))
    (y * _w(rank, y.shape)).sum().backward()
    offset = sum(k + 1 for k in range(rank))
    assert torch.allclose(x.grad, total[offset:offset + rows].double())


def test_broadcast_is_a_reduce_to_the_root(rank, size):
    root = size - 1
    x = _x(rank, (3,))
    y = hvd.broadcast(x, root_rank=root, name="grad.broadcast")
    (y * _w(rank, (3,))).sum().backward()
    want = sum(_w(r, (3,)) for r in range(size)).double() if rank == root \
        else torch.zeros(3, dtype=torch.float64)
    assert torch.allclose(x.grad, want)


def test_alltoall_sends_the_gradient_back(rank, size):
    splits = [k + 1 for k in range(size)]
    rows = sum(splits)
    x = _x(rank, (rows, 1))
    y, received = hvd.alltoall(x, splits=splits, name="grad.alltoall")
    (y * _w(rank, y.shape)).sum().backward()
    # Row j of rank r's input went to rank k (splits), where it is row
    # (rows before r among those k received) of k's output.
    want = torch.zeros(rows, 1, dtype=torch.float64)
    start = 0
    for k in range(size):
        recv_offset = rank * (k + 1)  # k received k+1 rows from each rank
        w_k = _w(k, (size * (k + 1), 1)).double()
        want[start:start + k + 1] = w_k[recv_offset:recv_offset + k + 1]
        start += k + 1
    assert torch.allclose(x.grad, want)


def test_reducescatter_gradient_is_an_allgather(rank, size):
    rows = 2 * size
    x = _x(rank, (rows, 2))
    y = hvd.reducescatter(x, op=hvd.Sum, name="grad.rs")
    (y * _w(rank, y.shape)).sum().backward()
    want = torch.cat([_w(k, (2, 2)) for k in range(size)]).double()
    assert torch.allclose(x.grad, want)
    x2 = _x(rank, (rows, 2))
    y2 = hvd.reducescatter(x2, op=hvd.Average, name="grad.rs.avg")
    (y2 * _w(rank, y2.shape)).sum().backward()
    assert torch.allclose(x2.grad, want / size)


def test_grouped_allreduce_gradients(rank, size):
    xs = [_x(rank, (2,)), _x(rank, (3,))]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grad.grouped")
    (sum((y * _w(rank, y.shape)).sum() for y in ys)).backward()
    for x in xs:
        assert torch.allclose(x.grad,
                              sum(_w(r, x.shape) for r in range(size)).double())
