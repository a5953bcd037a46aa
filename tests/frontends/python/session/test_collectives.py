"""Every collective, dtype, op, scale factor, async and in-place form."""

import os

import pytest
import torch

import kolo.torch as hvd

REDUCED = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
           torch.float16, torch.bfloat16, torch.float32, torch.float64]
MOVED = REDUCED + [torch.bool]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _values(rank, dtype, shape=(3, 4)):
    """Small, exact values of `dtype` for `rank`."""
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)[:shape[0]]
    if dtype == torch.bool:
        return ((base + rank) % 2 == 0)
    return ((base % 5) + rank + 1).to(dtype)


@pytest.mark.parametrize("dtype", REDUCED)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Min, hvd.Max, hvd.Product])
def test_allreduce_every_dtype_and_op(dtype, op, rank, size):
    x = _values(rank, dtype)
    all_x = torch.stack([_values(r, dtype).to(torch.float64)
                         for r in range(size)])
    want = {hvd.Sum: all_x.sum(0), hvd.Min: all_x.min(0).values,
            hvd.Max: all_x.max(0).values, hvd.Product: all_x.prod(0)}[op]
    got = hvd.allreduce(x, op=op, name="every.%s.%s" % (dtype, op))
    assert got.dtype == dtype and got.shape == x.shape
    if dtype in (torch.uint8, torch.int8, torch.int16):
        want = want.to(torch.int64).to(dtype)  # wraps as the dtype does
    assert torch.equal(got.to(torch.float64), want.to(dtype).to(torch.float64))
    assert torch.equal(x, _values(rank, dtype)), "the input was modified"


@pytest.mark.parametrize("dtype", FLOATS)
def test_average_and_scale_factors(dtype, rank, size):
    x = _values(rank, dtype)
    total = sum(_values(r, torch.float64) for r in range(size))
    got = hvd.allreduce(x, name="avg.%s" % dtype)  # Average by default
    assert torch.allclose(got.double(), total / size, rtol=1e-2)
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                        postscale_factor=3.0, name="scaled.%s" % dtype)
    assert torch.allclose(got.double(), total * 1.5, rtol=1e-2)
    # The deprecated `average` argument, as in Horovod.
    got = hvd.allreduce(x, average=False, name="deprecated.%s" % dtype)
    assert torch.allclose(got.double(), total, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_sums_are_rounded_once(dtype, rank, size):
    # Within one host every rank's input is summed in float and rounded to
    # 16 bits once: the float32 sum of all ranks' tensors, rounded.
    def values(r):
        g = torch.Generator().manual_seed(7 + r)
        return (torch.rand(4096, generator=g) * 2 - 1).to(dtype)
    want = sum(values(r).float() for r in range(size)).to(dtype)
    got = hvd.allreduce(values(rank), op=hvd.Sum, name="once.%s" % dtype)
    assert torch.equal(got, want)


def test_results_are_bitwise_identical_on_every_rank(rank):
    torch.manual_seed(100 + rank)
    x = torch.randn(1000, dtype=torch.float32)
    got = hvd.allreduce(x, name="bitwise")
    gathered = hvd.allgather(got.view(1, -1), name="bitwise.check")
    for row in gathered:
        assert torch.equal(row, gathered[0])


def test_async_in_place_and_poll(rank, size):
    handles = []
    tensors = []
    for i in range(20):
        t = torch.full((i + 1,), float(rank + i))
        tensors.append(t)
        handles.append(hvd.allreduce_async_(t, op=hvd.Sum,
                                            name="inplace.%d" % i))
    for i, (t, h) in enumerate(zip(tensors, handles)):
        out = hvd.synchronize(h)
        assert out is t
        want = sum(r + i for r in range(size))
        assert torch.equal(t, torch.full((i + 1,), float(want)))
        assert hvd.poll(h)
    h = hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name="async.new")
    out = hvd.synchronize(h)
    assert torch.equal(out, torch.full((3,), float(size)))
    assert torch.equal(hvd.synchronize(h), out)  # again: the same result
    t = torch.ones(2)
    assert hvd.allreduce_(t, op=hvd.Sum, name="inplace.sync") is t


def test_blocking_allreduces_run_on_the_callers_thread(rank, size):
    """hvd.allreduce_ and hvd.allreduce are one blocking call each
    (kolo::Runtime::AllreduceAndWait): on one host, a cached name's
    allreduce may run on the calling thread (the job's ranks share this
    host under run_ranks.sh)."""
    from kolo import _C
    t = torch.zeros(4)
    before = _C.counters()
    for i in range(200):
        t.fill_(float(rank + i))
        assert hvd.allreduce_(t, op=hvd.Sum, name="blocking.lone") is t
        want = float(sum(r + i for r in range(size)))
        assert torch.equal(t, torch.full((4,), want)), i
        got = hvd.allreduce(torch.full((2,), float(i)), op=hvd.Sum,
                            name="blocking.out")
        assert torch.equal(got, torch.full((2,), float(i * size))), i
    after = _C.counters()
    # The calls took the loop's turn (whether a turn also completed its
    # collective depends on the other ranks' timing: the C++
    # caller_turn_test checks that with a long spin).
    assert after["loop.caller_turns"] > before["loop.caller_turns"]


def test_stats_and_counters(rank, size):
    """_C.stats() has kolo::RuntimeStats' fields, _C.counters() every
    counter of kolo::Runtime::Counters(); both count what was done."""
    from kolo import _C
    stats, counters = _C.stats(), _C.counters()
    assert set(stats) == {"tensors_executed", "collectives_executed",
                          "negotiation_messages_sent",
                          "negotiation_messages_received",
                          "host_buffer_bytes"}
    assert "negotiation.cache_hits_sent" in counters
    t = torch.ones(8)
    hvd.allreduce_(t, op=hvd.Sum, name="stats.one")
    after = _C.stats()
    assert after["tensors_executed"] == stats["tensors_executed"] + 1
    assert after["collectives_executed"] == stats["collectives_executed"] + 1
    assert (_C.counters()["negotiation.requests_sent"] ==
            counters["negotiation.requests_sent"] + 1)


def test_phase_times_only_when_asked(rank, size):
    """KOLO_PHASE_TIMES=1 times the loop's phases into the counters; without
    it (the sessions' default) nothing is timed. The sessions of
    tools/test.sh run without it; the other branch runs by hand:
    KOLO_PHASE_TIMES=1 tests/frontends/python/run_ranks.sh 2 OUT."""
    from kolo import _C
    tensors = [torch.full((64,), float(rank + i)) for i in range(20)]
    executed = _C.stats()["collectives_executed"]
    for step in range(3):
        handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"phases.{i}")
                   for i, t in enumerate(tensors)]
        for h in handles:
            hvd.synchronize(h)
    phases = ("phase.send_ns", "phase.prepare_ns", "phase.collective_ns",
              "phase.complete_ns", "phase.recycle_ns")
    stats = _C.stats()
    counters = _C.counters()
    assert stats["collectives_executed"] > executed
    asked = os.environ.get("KOLO_PHASE_TIMES", "").lower() in (
        "1", "true", "on", "yes")
    for phase in phases:
        if asked:
            assert counters[phase] > 0, phase
        else:
            assert counters[phase] == 0, phase


def test_non_contiguous_and_empty_and_scalar(rank, size):
    base = torch.arange(12.0).reshape(3, 4) + rank
    view = base.t()  # non-contiguous
    got = hvd.allreduce(view, op=hvd.Sum, name="noncontig")
    want = sum(torch.arange(12.0).reshape(3, 4) + r for r in range(size)).t()
    assert torch.equal(got, want)
    hvd.allreduce_(view, op=hvd.Sum, name="noncontig.inplace")
    assert torch.equal(base.t(), want)
    assert hvd.allreduce(torch.zeros(0), name="empty").numel() == 0
    scalar = hvd.allreduce(torch.tensor(float(rank)), op=hvd.Sum, name="scalar")
    assert scalar.dim() == 0 and scalar.item() == sum(range(size))


@pytest.mark.parametrize("dtype", MOVED)
def test_allgather_uneven_first_dimension(dtype, rank, size):
    x = _values(rank, dtype, shape=(rank + 1, 4))
    got = hvd.allgather(x, name="gather.%s" % dtype)
    want = torch.cat([_values(r, dtype, shape=(r + 1, 4))
                      for r in range(size)])
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", MOVED)
def test_broadcast_every_root(dtype, rank, size):
    for root in range(size):
        x = _values(rank, dtype)
        got = hvd.broadcast(x, root_rank=root,
                            name="bcast.%s.%d" % (dtype, root))
        assert torch.equal(got, _values(root, dtype))
        assert torch.equal(x, _values(rank, dtype))
        hvd.broadcast_(x, root, name="bcast_.%s.%d" % (dtype, root))
        assert torch.equal(x, _values(root, dtype))


@pytest.mark.parametrize("dtype", MOVED)
def test_alltoall_with_and_without_splits(dtype, rank, size):
    # Rank r sends k+1 rows to rank k; each row holds its sender's rank.
    rows = sum(k + 1 for k in range(size))
    x = torch.full((rows, 2), rank).to(dtype)
    splits = [k + 1 for k in range(size)]
    out, received = hvd.alltoall(x, splits=splits,
                                 name="a2a.%s" % dtype)
    assert received.tolist() == [rank + 1] * size
    want = torch.cat([torch.full((rank + 1, 2), r) for r in range(size)])
    assert torch.equal(out, want.to(dtype))
    even = torch.full((size * 2,), rank).to(dtype)
    out = hvd.alltoall(even, name="a2a.even.%s" % dtype)
    assert torch.equal(out, torch.arange(size).repeat_interleave(2).to(dtype))
    h = hvd.alltoall_async(x, splits=torch.tensor(splits),
                           name="a2a.async.%s" % dtype)
    out2, received2 = hvd.synchronize(h)
    assert torch.equal(out2, want.to(dtype))
    assert torch.equal(received2, received)


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_reducescatter_shares_of_the_first_dimension(op, rank, size):
    rows = 2 * size + 1  # the first rank gets one row more
    x = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3) + rank
    got = hvd.reducescatter(x, op=op, name="rs.%d" % op)
    total = sum(torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3) + r
                for r in range(size))
    if op == hvd.Average:
        total = total / size
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    assert torch.allclose(got, total[start:start + counts[rank]])
    h = hvd.reducescatter_async(x, op=op, name="rs.async.%d" % op,
                                prescale_factor=2.0)
    assert torch.allclose(hvd.synchronize(h),
                          2 * total[start:start + counts[rank]])


def test_grouped_collectives(rank, size):
    tensors = [torch.full((i + 1,), float(rank)) for i in range(5)]
    got = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="grouped")
    for i, t in enumerate(got):
        assert torch.equal(t, torch.full((i + 1,), float(sum(range(size)))))
    h = hvd.grouped_allreduce_async_(tensors, op=hvd.Sum, name="grouped_")
    assert hvd.synchronize(h)[0] is tensors[0]
    assert tensors[4][0].item() == sum(range(size))
    gathered = hvd.grouped_allgather([torch.ones(rank + 1), torch.zeros(2)],
                                     name="grouped.gather")
    assert gathered[0].numel() == sum(r + 1 for r in range(size))
    assert gathered[1].numel() == 2 * size
    h = hvd.grouped_allgather_async([torch.ones(1)], name="grouped.gather.a")
    assert hvd.synchronize(h)[0].numel() == size
    scattered = hvd.grouped_reducescatter(
        [torch.ones(size * 2, 2), torch.ones(size)], op=hvd.Sum,
        name="grouped.rs")
    assert torch.equal(scattered[0], torch.full((2, 2), float(size)))
    assert torch.equal(scattered[1], torch.full((1,), float(size)))
    h = hvd.grouped_reducescatter_async([torch.ones(size)], op=hvd.Sum,
                                        name="grouped.rs.a")
    assert torch.equal(hvd.synchronize(h)[0], torch.full((1,), float(size)))


def test_compression_travels_narrow_and_comes_back_wide(rank, size):
    x = torch.full((8,), 1.0 + rank, dtype=torch.float32)
    for compression in (hvd.Compression.fp16, hvd.Compression.bf16):
        got = hvd.allreduce(x, op=hvd.Sum, compression=compression,
                            name="compressed.%s" % compression.__name__)
        assert got.dtype == torch.float32
        assert torch.equal(got, torch.full((8,), float(sum(1.0 + r for r in range(size)))))
    same, ctx = hvd.Compression.none.compress(x)
    assert same is x and hvd.Compression.none.decompress(same, ctx) is x


def test_sparse_allreduce_through_allgather(rank, size):
    dense = torch.zeros(5, 3)
    dense[rank % 5] = 1.0
    dense[4] = 2.0
    h = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse",
                                   op=hvd.Sum)
    got = hvd.synchronize(h).to_dense()
    want = torch.zeros(5, 3)
    for r in range(size):
        want[r % 5] += 1.0
    want[4] += 2.0 * size
    assert torch.equal(got, want)
    h = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse.avg",
                                   op=hvd.Average)
    assert torch.allclose(hvd.synchronize(h).to_dense(), want / size)


def test_join_with_uneven_batches(rank, size):
    # Rank r has r + 2 batches; ranks that run out join and contribute
    # zeros, and Average divides by the set size, as in Horovod.
    steps = rank + 2
    for step in range(size + 1):
        if step < steps:
            got = hvd.allreduce(torch.ones(4), op=hvd.Average,
                                name="join.step.%d" % step)
            contributors = sum(1 for r in range(size) if step < r + 2)
            assert torch.allclose(got, torch.full((4,), contributors / size))
    last = hvd.join()
    assert last == size - 1  # the rank with the most batches joins last
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after.join").item() == size
