"""Every collective of the "kolo" backend against the gloo backend's results
on the same inputs (or, where gloo lacks the collective in torch 1.13, against
the result computed from every rank's inputs), sync and async."""

import pytest
import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
       dist.ReduceOp.PRODUCT]


def values(rank, shape=(3, 5), dtype=torch.float32, seed=0):
    """Rank `rank`'s input: small integers (exact in every dtype and op)."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


def test_backend_is_kolo():
    assert dist.get_backend() == "kolo"
    assert dist.is_initialized()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS, ids=["SUM", "MIN", "MAX", "PRODUCT"])
def test_all_reduce_matches_gloo(dtype, op, rank, gloo):
    x = values(rank, dtype=dtype, seed=1)
    ours, ref = x.clone(), x.clone()
    dist.all_reduce(ours, op=op)
    dist.all_reduce(ref, op=op, group=gloo)
    assert torch.equal(ours, ref)


def test_all_reduce_avg_is_the_mean(rank, size):
    x = values(rank, dtype=torch.float64, seed=2)
    everyone = torch.stack([values(r, dtype=torch.float64, seed=2)
                            for r in range(size)])
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    assert torch.allclose(x, everyone.mean(0))


def test_all_reduce_avg_of_integers_as_horovod(rank, size):
    """kolo's rule for integer averages (docs/guide.md): the sum times
    1/size in double, truncated toward zero."""
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32,
                  torch.int64):
        x = torch.tensor([rank + 2, 3 * rank, 1], dtype=dtype)
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        sums = [sum(r + 2 for r in range(size)), sum(3 * r for r in
                                                     range(size)), size]
        assert x.tolist() == [int(v * (1.0 / size)) for v in sums], dtype


def test_all_reduce_of_odd_tensors(rank, gloo):
    for shape in [(), (0,), (1,), (7, 1, 3), (1000003,)]:
        x = values(rank, shape=shape, seed=3)
        ours, ref = x.clone(), x.clone()
        dist.all_reduce(ours)
        dist.all_reduce(ref, group=gloo)
        assert torch.equal(ours, ref), shape
    # A non-contiguous tensor gets its result in place.
    base = values(rank, shape=(6, 4), seed=4)
    view, ref = base.t(), base.t().clone()
    dist.all_reduce(view)
    dist.all_reduce(ref, group=gloo)
    assert torch.equal(view, ref)


def test_async_work_and_future(rank, size, gloo):
    x = values(rank, seed=5)
    ref = x.clone()
    dist.all_reduce(ref, group=gloo)
    work = dist.all_reduce(x, async_op=True)
    fut = work.get_future()
    assert work.wait()
    assert work.is_completed() and work.is_success()
    assert torch.equal(x, ref)
    assert torch.equal(fut.wait()[0], ref)
    # then() runs after completion, as DDP's comm hooks chain it.
    y = values(rank, seed=5)
    chained = dist.all_reduce(y, async_op=True).get_future().then(
        lambda f: f.value()[0] * 2)
    assert torch.equal(chained.wait(), ref * 2)


def test_all_reduce_coalesced(rank, gloo):
    tensors = [values(rank, shape=s, seed=6) for s in [(2,), (3, 3), (5,)]]
    ours = [t.clone() for t in tensors]
    dist.all_reduce_coalesced(ours)
    for t, ref in zip(ours, tensors):
        dist.all_reduce(ref, group=gloo)
        assert torch.equal(t, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8])
def test_broadcast_from_every_root(dtype, rank, size, gloo):
    for root in range(size):
        x = values(rank, dtype=dtype, seed=7).abs()
        ours, ref = x.clone(), x.clone()
        dist.broadcast(ours, src=root)
        dist.broadcast(ref, src=root, group=gloo)
        assert torch.equal(ours, ref)
        assert torch.equal(ours, values(root, dtype=dtype, seed=7).abs())


def test_all_gather(rank, size, gloo):
    for shape in [(), (4,), (2, 3)]:
        x = values(rank, shape=shape, seed=8)
        ours = [torch.empty(shape) for _ in range(size)]
        ref = [torch.empty(shape) for _ in range(size)]
        dist.all_gather(ours, x)
        dist.all_gather(ref, x, group=gloo)
        for a, b in zip(ours, ref):
            assert torch.equal(a, b)


def test_all_gather_base(rank, size, gloo):
    x = values(rank, shape=(2, 3), seed=9)
    ours = torch.empty(size * 2, 3)
    dist._all_gather_base(ours, x)
    ref = [torch.empty(2, 3) for _ in range(size)]
    dist.all_gather(ref, x, group=gloo)
    assert torch.equal(ours, torch.cat(ref))


@pytest.mark.parametrize("inputs_per_rank", ["world size", "world size + 1"])
def test_all_gather_coalesced_layout_is_rank_major(rank, size,
                                                   inputs_per_rank):
    # torch's documented layout (all_gather_coalesced's docstring):
    # output_tensor_lists[r][i] is rank r's input_tensor_list[i]. With as
    # many inputs as ranks a transposed layout would fit the shapes too.
    n = size if inputs_per_rank == "world size" else size + 1
    shapes = [(3,)] * n if n == size else [(3,), (2, 2)] + [(1,)] * (n - 2)
    inputs = [values(rank, shape=s, seed=10 + i) for i, s in enumerate(shapes)]
    ours = [[torch.empty(s) for s in shapes] for _ in range(size)]
    dist.all_gather_coalesced(ours, inputs)
    for r in range(size):
        for i, s in enumerate(shapes):
            assert torch.equal(ours[r][i], values(r, shape=s, seed=10 + i)), \
                (r, i)


@pytest.mark.skipif(not hasattr(dist, "_make_nccl_premul_sum"),
                    reason="this torch has no PREMUL_SUM for CPU backends")
def test_premul_sum_multiplies_every_input_first(rank, size):
    # sum over r of factor * x_r: all_reduce and reduce_scatter_tensor.
    factor = 0.25
    every = [values(r, shape=(size, 4), seed=30) for r in range(size)]
    expect = sum(factor * x for x in every)
    x = every[rank].clone()
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(factor))
    assert torch.equal(x, expect)
    out = torch.empty(4)
    dist.reduce_scatter_tensor(out, every[rank].clone(),
                               op=dist._make_nccl_premul_sum(factor))
    assert torch.equal(out, expect[rank])


@pytest.mark.skipif(torch.__version__.startswith("1."),
                    reason="torch 1.13 allows monitored_barrier on gloo only")
def test_monitored_barrier_passes_when_every_rank_arrives(rank):
    import datetime
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30),
                           wait_all_ranks=True)


def test_reduce_to_every_root(rank, size, gloo):
    for root in range(size):
        x = values(rank, seed=11)
        ours, ref = x.clone(), x.clone()
        dist.reduce(ours, dst=root, op=dist.ReduceOp.MAX)
        dist.reduce(ref, dst=root, op=dist.ReduceOp.MAX, group=gloo)
        if rank == root:
            assert torch.equal(ours, ref)
        else:
            assert torch.equal(ours, x), "a non-root's tensor changed"


def test_gather_and_scatter(rank, size, gloo):
    for root in range(size):
        x = values(rank, shape=(3,), seed=12)
        ours = [torch.empty(3) for _ in range(size)] if rank == root else None
        ref = [torch.empty(3) for _ in range(size)] if rank == root else None
        dist.gather(x, ours, dst=root)
        dist.gather(x, ref, dst=root, group=gloo)
        if rank == root:
            for a, b in zip(ours, ref):
                assert torch.equal(a, b)

        chunks = ([values(r, shape=(2, 2), seed=13) for r in range(size)]
                  if rank == root else None)
        mine, theirs = torch.empty(2, 2), torch.empty(2, 2)
        dist.scatter(mine, chunks, src=root)
        dist.scatter(theirs, chunks, src=root, group=gloo)
        assert torch.equal(mine, theirs)
        assert torch.equal(mine, values(rank, shape=(2, 2), seed=13))


@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.MAX],
                         ids=["SUM", "MAX"])
def test_reduce_scatter(op, rank, size):
    # gloo has no reduce_scatter in torch 1.13: the reference is computed.
    def inputs(r):
        return [values(r, shape=(2, 3), seed=14 + k) for k in range(size)]
    reduce = torch.sum if op == dist.ReduceOp.SUM else torch.amax
    want = reduce(torch.stack([inputs(r)[rank] for r in range(size)]), dim=0)
    out = torch.empty(2, 3)
    dist.reduce_scatter(out, inputs(rank), op=op)
    assert torch.equal(out, want)
    flat = torch.cat([t.reshape(-1) for t in inputs(rank)])
    out_base = torch.empty(6)
    dist._reduce_scatter_base(out_base, flat, op=op)
    assert torch.equal(out_base, want.reshape(-1))


def test_all_to_all_single_even_and_with_splits(rank, size, gloo):
    x = values(rank, shape=(2 * size, 3), seed=15)
    ours, ref = torch.empty_like(x), torch.empty_like(x)
    dist.all_to_all_single(ours, x)
    dist.all_to_all_single(ref, x, group=gloo)
    assert torch.equal(ours, ref)
    # Rank r sends k + r rows to rank k.
    send = [k + rank for k in range(size)]
    recv = [rank + r for r in range(size)]
    x = values(rank, shape=(sum(send), 2), seed=16)
    ours = torch.empty(sum(recv), 2)
    ref = torch.empty(sum(recv), 2)
    dist.all_to_all_single(ours, x, recv, send)
    dist.all_to_all_single(ref, x, recv, send, group=gloo)
    assert torch.equal(ours, ref)


def test_all_to_all_lists(rank, size):
    # Rank r sends rank k a tensor of k + r + 1 elements, all equal to
    # 10 * r + k.
    inputs = [torch.full((k + rank + 1,), 10.0 * rank + k) for k in range(size)]
    outputs = [torch.empty(rank + r + 1) for r in range(size)]
    dist.all_to_all(outputs, inputs)
    for r, out in enumerate(outputs):
        assert torch.equal(out, torch.full((rank + r + 1,), 10.0 * r + rank))


def test_barrier(rank):
    dist.barrier()
    work = dist.barrier(async_op=True)
    assert work.wait()


def test_subgroup_created_by_its_members(rank, size):
    # Every rank calls new_group (torch requires it); kolo's creator runs on
    # the members only.
    members = list(range(1, size))
    group = dist.new_group(members)
    gloo_group = dist.new_group(members, backend="gloo")
    if rank in members:
        x = values(rank, seed=17)
        ours, ref = x.clone(), x.clone()
        dist.all_reduce(ours, group=group)
        dist.all_reduce(ref, group=gloo_group)
        assert torch.equal(ours, ref)
        assert dist.get_rank(group) == rank - 1
        # src is a rank of the job; torch hands the backend its group rank.
        mine = values(rank, seed=18)
        ours, ref = mine.clone(), mine.clone()
        dist.broadcast(ours, src=members[-1], group=group)
        dist.broadcast(ref, src=members[-1], group=gloo_group)
        assert torch.equal(ours, ref)
        assert torch.equal(ours, values(members[-1], seed=18))
    else:
        assert group == dist.GroupMember.NON_GROUP_MEMBER
    dist.barrier()


def test_sparse_all_reduce_sums_every_ranks_entries(rank, size):
    # Rank r holds entries at rows r and r + 1 (rank 1 none at all): the sum
    # is the dense sum, on every rank, as a coalesced sparse tensor.
    def sparse_of(r):
        if r == 1:
            return torch.sparse_coo_tensor(torch.empty(1, 0, dtype=torch.long),
                                           torch.empty(0, 3), (size + 1, 3))
        return torch.sparse_coo_tensor(torch.tensor([[r, r + 1]]),
                                       values(r, shape=(2, 3), seed=40),
                                       (size + 1, 3))
    t = sparse_of(rank)
    dist.all_reduce(t)
    expect = sum(sparse_of(r).to_dense() for r in range(size))
    assert t.is_sparse and torch.equal(t.to_dense(), expect)


def test_what_kolo_does_not_do_is_refused_by_name(rank, size):
    with pytest.raises(RuntimeError,
                       match="all_reduce|allreduce with ReduceOp.BAND is not "
                       "supported"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32),
                        op=dist.ReduceOp.BAND)
    dist.barrier()  # nothing was submitted: the sequence stays aligned


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="this torch has no CUDA (Debian's is CPU-only)")
def test_cuda_tensor_is_refused_clearly():
    with pytest.raises(RuntimeError, match="cuda"):
        dist.all_reduce(torch.ones(2, device="cuda"))
