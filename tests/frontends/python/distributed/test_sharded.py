"""Sharded training and torch 2.x's process-group machinery on the "kolo"
backend, each against the same on gloo: ZeroRedundancyOptimizer, FSDP on
the CPU (device_id=cpu), the tensor forms of allgather and reduce-scatter
(and their coalesced paths, which FSDP uses), subgroups created and
destroyed, and DDP over a model under torch.compile."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

TORCH_2 = int(torch.__version__.split(".")[0]) >= 2
needs_torch_2 = pytest.mark.skipif(
    not TORCH_2, reason="torch %s: FSDP on the CPU, the coalesced tensor "
    "collectives and torch.compile need torch 2.x" % torch.__version__)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4))


def _batches(rank, steps=3):
    gen = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(5, 8, generator=gen), torch.randn(5, 4, generator=gen))
            for _ in range(steps)]


def _assert_close(ours, ref):
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a, b)


def _zero_train(group, rank, optimizer_class, **defaults):
    model = DDP(_model(), process_group=group)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class,
                                  process_group=group, **defaults)
    for x, y in _batches(rank):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    opt.consolidate_state_dict(to=0)
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_zero_redundancy_optimizer_trains_as_on_gloo(optimizer, rank, gloo):
    cls, kw = ((torch.optim.SGD, dict(lr=0.1, momentum=0.9))
               if optimizer == "sgd" else (torch.optim.Adam, dict(lr=0.01)))
    ours = _zero_train(dist.group.WORLD, rank, cls, **kw)
    ref = _zero_train(gloo, rank, cls, **kw)
    _assert_close(ours, ref)


def _fsdp_train(group, rank):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    model = FSDP(_model(), process_group=group,
                 device_id=torch.device("cpu"), use_orig_params=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in _batches(rank):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    with FSDP.summon_full_params(model):
        return [p.detach().clone() for p in model.parameters()]


@needs_torch_2
def test_fsdp_on_the_cpu_trains_as_on_gloo(rank, gloo):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's, about FSDP1
        ours = _fsdp_train(dist.group.WORLD, rank)
        ref = _fsdp_train(gloo, rank)
    _assert_close(ours, ref)


@needs_torch_2
def test_tensor_allgather_and_reduce_scatter_coalesced(rank, size, gloo):
    inputs = [torch.arange(3, dtype=torch.float32) + 10 * rank,
              torch.full((2,), float(rank))]
    for group in (dist.group.WORLD, gloo):
        outs = [torch.empty(size * t.numel()) for t in inputs]
        with dist._coalescing_manager(group=group):
            for out, t in zip(outs, inputs):
                dist.all_gather_into_tensor(out, t, group=group)
        want = [torch.cat([torch.arange(3, dtype=torch.float32) + 10 * r
                           for r in range(size)]),
                torch.cat([torch.full((2,), float(r)) for r in range(size)])]
        for out, w in zip(outs, want):
            assert torch.equal(out, w)
    big = [torch.arange(size * 2, dtype=torch.float32) * (rank + 1),
           torch.ones(size * 3) * rank]
    results = []
    for group in (dist.group.WORLD, gloo):
        outs = [torch.empty(t.numel() // size) for t in big]
        with dist._coalescing_manager(group=group):
            for out, t in zip(outs, big):
                dist.reduce_scatter_tensor(out, t, group=group)
        results.append(outs)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_subgroups_are_created_and_destroyed(rank, size):
    for round_ in range(3):
        members = list(range(size))[round_ % 2:]
        group = dist.new_group(members)
        if rank in members:
            t = torch.ones(2) * (rank + 1)
            dist.all_reduce(t, group=group)
            assert t.tolist() == [float(sum(r + 1 for r in members))] * 2
            objects = [None] * len(members)
            dist.all_gather_object(objects, {"rank": rank}, group=group)
            assert objects == [{"rank": r} for r in members]
            box = [rank] if rank == members[-1] else [None]
            dist.broadcast_object_list(box, src=members[-1], group=group)
            assert box == [members[-1]]
        dist.destroy_process_group(group)
    dist.barrier()


@needs_torch_2
def test_ddp_over_a_compiled_model_trains_as_on_gloo(rank, size, gloo):
    def train(group):
        model = DDP(_model(), process_group=group)
        compiled = torch.compile(model, backend="aot_eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in _batches(rank):
            opt.zero_grad()
            ((compiled(x) - y) ** 2).mean().backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    _assert_close(train(dist.group.WORLD), train(gloo))
