"""DistributedDataParallel on the "kolo" backend trains exactly as on gloo:
the same parameters after k steps, with the default bucket size, no_sync(),
find_unused_parameters, gradient accumulation and DDP's fp16/bf16
communication hooks."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def __init__(self, branch=False):
        super().__init__()
        self.a = torch.nn.Linear(10, 32)
        self.b = torch.nn.Linear(32, 4)
        if branch:
            # Used only where forward takes the branch: unused elsewhere.
            self.unused = torch.nn.Linear(32, 4)

    def forward(self, x, branch=False):
        h = torch.relu(self.a(x))
        return self.unused(h) if branch else self.b(h)


def train(group, rank, steps=4, accumulate=1, use_no_sync=False,
          find_unused=False, hook=None):
    torch.manual_seed(0)
    model = Net(branch=find_unused)
    ddp = DDP(model, process_group=group, find_unused_parameters=find_unused)
    if hook is not None:
        ddp.register_comm_hook(group, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(10 + rank)
    for _ in range(steps):
        opt.zero_grad()
        for micro in range(accumulate):
            x = torch.randn(6, 10, generator=gen)
            y = torch.randn(6, 4, generator=gen)
            last = micro == accumulate - 1
            if use_no_sync and not last:
                with ddp.no_sync():
                    ((ddp(x) - y) ** 2).mean().backward()
            else:
                out = ddp(x, branch=find_unused and rank % 2 == 1)
                ((out - y) ** 2).mean().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def assert_same(ours, ref, size):
    for a, b in zip(ours, ref):
        if size == 2:
            # a + b is the same float whatever the order: bit for bit.
            assert torch.equal(a, b)
        else:
            # gloo's ring adds in another order than kolo's rank order.
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", [
    dict(),
    dict(accumulate=2),
    dict(accumulate=3, use_no_sync=True),
    dict(find_unused=True),
], ids=["default", "accumulate", "no_sync", "find_unused_parameters"])
def test_ddp_trains_as_on_gloo(case, rank, size, gloo):
    ours = train(None, rank, **case)
    ref = train(gloo, rank, **case)
    assert_same(ours, ref, size)
    # And the replicas agree with each other (bit for bit on kolo).
    mine = torch.cat([p.reshape(-1) for p in ours])
    everyone = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(everyone, mine)
    for other in everyone:
        assert torch.equal(other, everyone[0])


# torch 1.13's DDP refuses bf16_compress_hook without CUDA 11 and NCCL 2.10,
# whatever the backend.
BF16_HOOK = pytest.param(
    default_hooks.bf16_compress_hook, marks=pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="torch 1.13's DDP takes bf16_compress_hook with CUDA only"))


@pytest.mark.parametrize("hook", [default_hooks.fp16_compress_hook, BF16_HOOK],
                         ids=["fp16_compress_hook", "bf16_compress_hook"])
def test_ddp_communication_hooks(hook, rank, size, gloo):
    ours = train(None, rank, hook=hook)
    ref = train(gloo, rank, hook=hook)
    # 16-bit sums: kolo rounds once within a host, gloo at each step.
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, rtol=1e-2, atol=1e-3)
