"""broadcast_parameters, broadcast_optimizer_state (every optimizer, state
created lazily included), broadcast_object, allgather_object."""

import pytest
import torch

import kolo.torch as hvd


def _model(rank):
    torch.manual_seed(rank)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))


def test_broadcast_parameters_state_dict_and_named_parameters(rank):
    model = _model(rank)
    model(torch.randn(5, 4))  # BatchNorm's running statistics differ per rank
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gathered = hvd.allgather_object(
        {k: v.clone() for k, v in model.state_dict().items()})
    for other in gathered:
        for k, v in other.items():
            assert torch.equal(v, gathered[0][k]), k
    model2 = _model(rank + 10)
    hvd.broadcast_parameters(model2.named_parameters(), root_rank=1)
    flat = torch.cat([p.detach().view(-1) for p in model2.parameters()])
    assert torch.equal(flat, hvd.broadcast(flat, root_rank=1, name="bp.check"))


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.01),
    "adadelta": lambda p: torch.optim.Adadelta(p),
    "adamax": lambda p: torch.optim.Adamax(p),
    "asgd": lambda p: torch.optim.ASGD(p),
    "nadam": lambda p: torch.optim.NAdam(p),
    "radam": lambda p: torch.optim.RAdam(p),
    "rprop": lambda p: torch.optim.Rprop(p),
    "lbfgs": lambda p: torch.optim.LBFGS(p, lr=0.1),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_broadcast_optimizer_state_of_every_optimizer(name, rank):
    model = torch.nn.Linear(3, 2)
    opt = OPTIMIZERS[name](model.parameters())
    # Root has stepped (its state exists), the others have not.
    if rank == 0:
        def closure():
            opt.zero_grad()
            loss = model(torch.ones(1, 3)).sum()
            loss.backward()
            return loss
        opt.step(closure)
        opt.param_groups[0]["lr"] = 0.123
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    state = opt.state_dict()
    assert state["param_groups"][0]["lr"] == 0.123
    gathered = hvd.allgather_object(state)
    for other in gathered:
        assert other["param_groups"] == gathered[0]["param_groups"]
        assert other["state"].keys() == gathered[0]["state"].keys()
        for k in other["state"]:
            for key, value in other["state"][k].items():
                ref = gathered[0]["state"][k][key]
                if isinstance(value, torch.Tensor):
                    assert torch.equal(value, ref), (name, key)
                else:
                    assert value == ref, (name, key)


def test_broadcast_optimizer_state_through_the_distributed_optimizer(rank):
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    model(torch.ones(1, 3) * rank).sum().backward()
    opt.step()
    assert len(opt.state) == 2


def test_objects(rank, size):
    assert hvd.broadcast_object({"epoch": 7, "rank": rank}, root_rank=1) == \
        {"epoch": 7, "rank": 1}
    got = hvd.allgather_object(("rank", rank, "x" * rank))
    assert got == [("rank", r, "x" * r) for r in range(size)]
    big = list(range(10000)) if rank == 0 else None
    assert hvd.broadcast_object(big, root_rank=0) == list(range(10000))
