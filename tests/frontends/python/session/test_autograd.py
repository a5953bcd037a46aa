"""Gradients of the differentiable collectives, as Horovod defines them
(horovod/torch/mpi_ops.py), computed here from those definitions.

Every rank r computes loss_r = sum(w_r * f(x_r)) for a fixed weight w_r,
so the gradient arriving at rank k's output is w_k. For the allreduces
(Sum, Average) Horovod's gradient is that of the total loss sum_k loss_k;
for broadcast and allgather it is the average over the ranks of the
output gradients (the gradient of the mean loss), and for reducescatter
the allgather of the output gradients, times the set size for Sum and
times the scale factors. Min, Max and Product: kolo's own (the gradient
of the total loss), where Horovod reduces the gradients with the same op.
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


def test_allgather_gives_each_rank_its_rows_averaged(rank, size):
    rows = rank + 1
    x = _x(rank, (rows, 2))
    y = hvd.allgather(x, name="grad.allgather")
    total = sum(_w(r, (sum(k + 1 for k in range(size)), 2))
                for r in range(size))
    (y * _w(rank, y.shape)).sum().backward()
    offset = sum(k + 1 for k in range(rank))
    assert torch.allclose(x.grad, total[offset:offset + rows].double() / size)


def test_grouped_allgather_gradients(rank, size):
    xs = [_x(rank, (rank + 1, 2)), _x(rank, (2, 3))]
    ys = hvd.grouped_allgather(xs, name="grad.grouped_allgather")
    (sum((y * _w(rank, y.shape)).sum() for y in ys)).backward()
    offset = sum(k + 1 for k in range(rank))
    total0 = sum(_w(r, ys[0].shape) for r in range(size)).double() / size
    assert torch.allclose(xs[0].grad, total0[offset:offset + rank + 1])
    total1 = sum(_w(r, ys[1].shape) for r in range(size)).double() / size
    assert torch.allclose(xs[1].grad, total1[2 * rank:2 * rank + 2])


def test_broadcast_gives_the_root_the_average(rank, size):
    root = size - 1
    x = _x(rank, (3,))
    y = hvd.broadcast(x, root_rank=root, name="grad.broadcast")
    (y * _w(rank, (3,))).sum().backward()
    want = sum(_w(r, (3,)) for r in range(size)).double() / size \
        if rank == root else torch.zeros(3, dtype=torch.float64)
    assert torch.allclose(x.grad, want)
    # Ones at -np 2: 1.0 on the root, as Horovod gives.
    ones = torch.ones(2, requires_grad=True)
    hvd.broadcast(ones, root_rank=0, name="grad.broadcast.ones").sum() \
        .backward()
    assert torch.equal(ones.grad, torch.full((2,), 1.0 if rank == 0 else 0.0))


def test_broadcast_gradient_in_a_process_set(rank, size):
    """The root is a rank of the job; the average is over the set."""
    members = list(range(1, size))  # every rank but 0
    ps = hvd.add_process_set(members)
    try:
        if rank in members:
            root = members[-1]
            x = _x(rank, (3,))
            y = hvd.broadcast(x, root_rank=root, name="grad.broadcast.set",
                              process_set=ps)
            (y * _w(rank, (3,))).sum().backward()
            want = sum(_w(r, (3,)) for r in members).double() / len(members) \
                if rank == root else torch.zeros(3, dtype=torch.float64)
            assert torch.allclose(x.grad, want)
    finally:
        hvd.remove_process_set(ps)


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
    gathered = torch.cat([_w(k, (2, 2)) for k in range(size)]).double()
    for op, factor in ((hvd.Sum, size), (hvd.Average, 1)):
        x = _x(rank, (rows, 2))
        y = hvd.reducescatter(x, op=op, name="grad.rs.%d" % op)
        (y * _w(rank, y.shape)).sum().backward()
        assert torch.allclose(x.grad, gathered * factor), op
        scaled = _x(rank, (rows, 2))
        y = hvd.reducescatter(scaled, op=op, prescale_factor=2.0,
                              postscale_factor=0.25,
                              name="grad.rs.scaled.%d" % op)
        (y * _w(rank, y.shape)).sum().backward()
        assert torch.allclose(scaled.grad, gathered * factor * 0.5), op
    # Ones at -np 2 with Sum: 2.0, as Horovod gives.
    ones = torch.ones(rows, requires_grad=True)
    hvd.reducescatter(ones, op=hvd.Sum, name="grad.rs.ones").sum().backward()
    assert torch.equal(ones.grad, torch.full((rows,), float(size)))


def test_grouped_reducescatter_gradients(rank, size):
    xs = [_x(rank, (2 * size, 2)), _x(rank, (size, 3))]
    ys = hvd.grouped_reducescatter(xs, op=hvd.Sum,
                                   name="grad.grouped_reducescatter")
    (sum((y * _w(rank, y.shape)).sum() for y in ys)).backward()
    for x, y in zip(xs, ys):
        want = torch.cat([_w(k, y.shape) for k in range(size)]).double()
        assert torch.allclose(x.grad, want * size)


def test_grouped_allreduce_gradients(rank, size):
    xs = [_x(rank, (2,)), _x(rank, (3,))]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grad.grouped")
    (sum((y * _w(rank, y.shape)).sum() for y in ys)).backward()
    for x in xs:
        assert torch.allclose(x.grad,
                              sum(_w(r, x.shape) for r in range(size)).double())
