"""What Horovod scripts rely on, as horovod.torch defines it: integer
averages and scale factors, process-set roots given as ranks of the job,
sparse gradients, broadcast_optimizer_state without gradients, the job
after a join, and the warnings and values scripts read.

(Gradients of every collective: test_autograd.py. init after shutdown and a
refusal on one rank only: tests/frontends/python/launch/test_horovod_launch.py.)
"""

import math
import warnings

import pytest
import torch

import kolo.torch as hvd

_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_RANGES = {torch.uint8: (0, 255), torch.int8: (-128, 127),
           torch.int16: (-32768, 32767)}


def _horovod_scaled(dtype, value, factor):
    """Horovod's integer scaling: the product in double, converted to the
    integer type by truncation toward zero (kolo clamps to the type's range
    where C++'s conversion is undefined)."""
    low, high = _RANGES.get(dtype, (-math.inf, math.inf))
    return min(high, max(low, math.trunc(value * factor)))


def _int_input(dtype, r, n):
    values = [(r + 2 * i) - 3 for i in range(n)]
    if dtype == torch.uint8:
        values = [abs(v) for v in values]
    return values


def _expected(dtype, size, n, op, pre, post, index=lambda i: i):
    post = post / size if op == hvd.Average else post
    out = []
    for i in range(n):
        total = 0
        for q in range(size):
            x = _int_input(dtype, q, 4 * size)[index(i)]
            total += x if pre == 1.0 else _horovod_scaled(dtype, x, pre)
        out.append(total if post == 1.0 else _horovod_scaled(dtype, total, post))
    return out


_CASES = ((hvd.Average, 1.0, 1.0), (hvd.Average, 0.5, 3.0),
          (hvd.Sum, 1.0, 0.4), (hvd.Sum, 1.7, 1.0), (hvd.Sum, 1.0, 300.0))


def test_integer_averages_and_scale_factors(rank, size):
    """Every integer dtype, through allreduce (default op: Average),
    grouped allreduce, reducescatter and grouped reducescatter: Horovod's
    results (2 and 3 average to 2, -3 and -2 to -2), the input's dtype."""
    n = 4 * size
    for dtype in _INT_DTYPES:
        mine = torch.tensor(_int_input(dtype, rank, n), dtype=dtype)
        # The default op is Average, as in Horovod.
        got = hvd.allreduce(mine, name="int.default.%s" % dtype)
        assert got.dtype == dtype
        assert got.tolist() == _expected(dtype, size, n, hvd.Average, 1, 1)
        for c, (op, pre, post) in enumerate(_CASES):
            want = _expected(dtype, size, n, op, pre, post)
            what = "%s %s pre %s post %s" % (dtype, op, pre, post)
            got = hvd.allreduce(mine, op=op, prescale_factor=pre,
                                postscale_factor=post,
                                name="int.ar.%s.%d" % (dtype, c))
            assert got.tolist() == want, what
            inplace = mine.clone()
            hvd.allreduce_(inplace, op=op, prescale_factor=pre,
                           postscale_factor=post,
                           name="int.ar_.%s.%d" % (dtype, c))
            assert inplace.tolist() == want, what
            grouped = hvd.grouped_allreduce(
                [mine, mine[:3]], op=op, prescale_factor=pre,
                postscale_factor=post, name="int.gar.%s.%d" % (dtype, c))
            assert grouped[0].tolist() == want, what
            assert grouped[1].tolist() == want[:3], what
            # Reducescatter: rank r's rows [4r, 4r + 4).
            share = _expected(dtype, size, 4, op, pre, post,
                              index=lambda i: 4 * rank + i)
            got = hvd.reducescatter(mine, op=op, prescale_factor=pre,
                                    postscale_factor=post,
                                    name="int.rs.%s.%d" % (dtype, c))
            assert got.dtype == dtype and got.tolist() == share, what
            got = hvd.grouped_reducescatter(
                [mine, mine], op=op, prescale_factor=pre,
                postscale_factor=post, name="int.grs.%s.%d" % (dtype, c))
            assert [g.tolist() for g in got] == [share, share], what


def test_integer_average_of_counters(rank, size):
    """What scripts do: average correct predictions over the ranks."""
    correct = torch.tensor(10 * (rank + 1))
    got = hvd.allreduce(correct, name="int.counter")
    assert got.dtype == correct.dtype
    assert got.item() == math.trunc(sum(10 * (r + 1) for r in range(size)) /
                                    size)


def test_a_bool_reduction_fails_on_every_rank(rank):
    with pytest.raises(RuntimeError, match="bool tensors are not reduced"):
        hvd.allreduce(torch.ones(2, dtype=torch.bool), op=hvd.Sum,
                      name="bool.reduce")
    # The job goes on.
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum,
                         name="bool.after").item() == hvd.size()


def test_mixed_dtypes_fail_on_every_rank(rank):
    """An int on rank 0, a float elsewhere, default op: negotiation's
    error, on every rank, as a RuntimeError subclass (Horovod's tests
    expect one)."""
    t = torch.ones(3, dtype=torch.int32) if rank == 0 else torch.ones(3)
    with pytest.raises(RuntimeError, match="dtype mismatch") as info:
        hvd.allreduce(t, name="mixed.dtypes")
    assert isinstance(info.value, hvd.HorovodInternalError)
    assert "rank 0 has int32" in str(info.value)


def _odd_and_even_sets(size):
    evens = [r for r in range(size) if r % 2 == 0]
    odds = [r for r in range(size) if r % 2 == 1]
    return evens, odds


def test_process_set_broadcasts_take_a_rank_of_the_job(rank, size):
    """broadcast, broadcast_, broadcast_async(_), broadcast_object,
    broadcast_parameters and broadcast_optimizer_state over a process set,
    from every member as root, named by its rank in the job."""
    evens, odds = _odd_and_even_sets(size)
    sets = [hvd.add_process_set(evens), hvd.add_process_set(odds)]
    try:
        for ps, members in zip(sets, (evens, odds)):
            if rank not in members:
                continue
            for root in members:
                tag = "ps%d.root%d" % (ps.process_set_id, root)
                mine = torch.full((3,), float(rank))
                want = torch.full((3,), float(root))
                assert torch.equal(hvd.broadcast(mine, root, name="b." + tag,
                                                 process_set=ps), want)
                h = hvd.broadcast_async(mine, root, name="ba." + tag,
                                        process_set=ps)
                assert torch.equal(hvd.synchronize(h), want)
                copy = mine.clone()
                hvd.broadcast_(copy, root, name="b_." + tag, process_set=ps)
                assert torch.equal(copy, want)
                assert hvd.broadcast_object({"from": rank}, root,
                                            name="bo." + tag,
                                            process_set=ps) == {"from": root}
                model = torch.nn.Linear(2, 2)
                with torch.no_grad():
                    model.weight.fill_(rank)
                    model.bias.fill_(-rank)
                hvd.broadcast_parameters(model.state_dict(), root,
                                         prefix=tag, process_set=ps)
                assert torch.equal(model.weight, torch.full((2, 2),
                                                            float(root)))
                opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1))
                hvd.broadcast_optimizer_state(opt, root, process_set=ps)
                assert opt.param_groups[0]["lr"] == pytest.approx(
                    0.1 * (root + 1))
            # A root outside the set: an error on every member, naming the
            # set's ranks.
            outsider = next(r for r in range(size) if r not in members)
            with pytest.raises(RuntimeError,
                               match=r"root rank %d is not a member of the "
                               r"process set \(ranks %s\)" %
                               (outsider, ", ".join(map(str, members)))):
                hvd.broadcast(torch.ones(1), outsider,
                              name="b.outside.%d" % ps.process_set_id,
                              process_set=ps)
    finally:
        for ps in sets:
            hvd.remove_process_set(ps)


def test_distributed_optimizer_over_a_process_set(rank, size):
    """Horovod's pattern: parameters broadcast from a member named by its
    rank in the job, then training within the set."""
    evens, _ = _odd_and_even_sets(size)
    ps = hvd.add_process_set(evens)
    try:
        if rank in evens:
            torch.manual_seed(rank)
            model = torch.nn.Linear(3, 1)
            root = evens[-1]
            hvd.broadcast_parameters(model.state_dict(), root,
                                     prefix="ps.opt", process_set=ps)
            opt = hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1),
                named_parameters=model.named_parameters(), process_set=ps)
            hvd.broadcast_optimizer_state(opt, root, process_set=ps)
            for step in range(3):
                opt.zero_grad()
                x = torch.full((4, 3), float(rank + step))
                model(x).sum().backward()
                opt.step()
            got = hvd.allgather(model.weight.detach(), name="ps.opt.check",
                                process_set=ps)
            for row in got:
                assert torch.equal(row, got[0])
    finally:
        hvd.remove_process_set(ps)


def _embedding_run(sparse_as_dense, rank):
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 3, sparse=True),
                                torch.nn.Flatten(), torch.nn.Linear(6, 1))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5),
        named_parameters=model.named_parameters(),
        sparse_as_dense=sparse_as_dense)
    hvd.broadcast_parameters(model.state_dict(), 0,
                             prefix="emb.%d" % sparse_as_dense)
    for step in range(3):
        opt.zero_grad()
        # Each rank its own rows, some shared (duplicate indices summed).
        idx = torch.tensor([[rank % 10, (rank + step) % 10],
                            [(2 * rank + 1) % 10, step % 10]])
        model(idx).sum().backward()
        if not sparse_as_dense:
            assert model[0].weight.grad.is_sparse
        opt.step()
    return model


def _embedding_reference(size):
    """The same training on one process: the averaged gradient is the
    gradient of the mean of the ranks' losses."""
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 3),
                                torch.nn.Flatten(), torch.nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(3):
        opt.zero_grad()
        loss = 0
        for r in range(size):
            idx = torch.tensor([[r % 10, (r + step) % 10],
                                [(2 * r + 1) % 10, step % 10]])
            loss = loss + model(idx).sum()
        (loss / size).backward()
        opt.step()
    return model


def test_sparse_embedding_trains_with_and_without_sparse_as_dense(rank, size):
    reference = _embedding_reference(size)
    for sparse_as_dense in (False, True):
        model = _embedding_run(sparse_as_dense, rank)
        for got, want in zip(model.parameters(), reference.parameters()):
            assert torch.allclose(got, want, atol=1e-6), sparse_as_dense
        # Every rank holds the same bits.
        gathered = hvd.allgather(model[0].weight.detach().unsqueeze(0),
                                 name="emb.check.%d" % sparse_as_dense)
        assert all(torch.equal(g, gathered[0]) for g in gathered)


def test_sparse_allreduce_async_handle_is_called(rank, size):
    dense = torch.zeros(4, 2)
    dense[rank % 4] = rank + 1.0
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse.call",
                                        op=hvd.Sum)
    got = handle()  # as Horovod's handle is used
    want = torch.zeros(4, 2)
    for r in range(size):
        want[r % 4] += r + 1.0
    assert got.is_sparse and torch.equal(got.to_dense(), want)


def test_broadcast_optimizer_state_without_gradients(rank):
    """Horovod's test_broadcast_state_no_grad: a parameter that never gets
    a gradient (requires_grad=False, an int) next to one with none yet."""

    class ModelNoGrad(torch.nn.Module):
        def __init__(self, a, b):
            super().__init__()
            self.a = torch.nn.Parameter(a.int(), requires_grad=False)
            self.b = torch.nn.Parameter(b)

        def forward(self, x):
            return torch.index_select(self.b, 0, self.a.long()) * x

    model = ModelNoGrad(torch.tensor([1.0, 3.0]), torch.rand(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001,
                                weight_decay=1e-6, momentum=0.9,
                                nesterov=True)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0,
                             prefix="nograd")
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    grad = optimizer.param_groups[0]["params"][1].grad
    bgrad = hvd.broadcast(grad, root_rank=0, name="nograd.grad")
    assert optimizer.param_groups[0]["params"][0].grad is None
    assert torch.equal(grad, bgrad)
    # Training goes on from there.
    optimizer.zero_grad()
    model(torch.ones(2)).sum().backward()
    optimizer.step()
    w = hvd.allgather(model.b.detach().unsqueeze(0), name="nograd.check")
    assert all(torch.equal(row, w[0]) for row in w)


_COLLECTIVES_AFTER_JOIN = (
    ("allreduce", lambda t, n: hvd.allreduce(t, op=hvd.Sum, name=n)),
    ("grouped_allreduce",
     lambda t, n: hvd.grouped_allreduce([t, t], op=hvd.Sum, name=n)[0]),
    ("allgather", lambda t, n: hvd.allgather(t, name=n)),
    ("broadcast", lambda t, n: hvd.broadcast(t, 0, name=n)),
    ("alltoall", lambda t, n: hvd.alltoall(t, name=n)),
    ("reducescatter", lambda t, n: hvd.reducescatter(t, op=hvd.Sum, name=n)),
    ("barrier", lambda t, n: hvd.barrier()),
)


@pytest.mark.parametrize("collective", [c[0] for c in _COLLECTIVES_AFTER_JOIN])
def test_collectives_after_a_completed_join(rank, size, collective):
    """Once every rank's join() has returned, the job is back to normal;
    each rank in turn joins first."""
    run = dict(_COLLECTIVES_AFTER_JOIN)[collective]
    for first in range(size):
        if rank == first:
            last = hvd.join()
        else:
            # The others wait for the first to have joined, then join.
            hvd.allreduce(torch.ones(1), op=hvd.Sum,
                          name="join.before.%s.%d" % (collective, first))
            last = hvd.join()
        assert 0 <= last < size
        hvd.barrier()
        t = torch.full((size, 2), float(rank + 1))
        got = run(t, "after.join.%s.%d" % (collective, first))
        if collective == "allreduce" or collective == "grouped_allreduce":
            assert torch.equal(got, torch.full((size, 2), float(
                sum(range(1, size + 1)))))
        elif collective == "allgather":
            assert got.shape == (size * size, 2)
        elif collective == "broadcast":
            assert torch.equal(got, torch.full((size, 2), 1.0))
        elif collective == "reducescatter":
            assert torch.equal(got, torch.full((1, 2), float(
                sum(range(1, size + 1)))))


def test_synchronize_then_step_warns_as_horovod(rank):
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   )
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()
    opt.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()  # no synchronize() of its own: no warning
