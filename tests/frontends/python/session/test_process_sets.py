"""Process sets: created and removed collectively, collectives on them."""

import pytest
import torch

import kolo.torch as hvd


def test_collectives_on_a_subset(rank, size):
    evens = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    assert evens.process_set_id > 0
    assert evens.size() == len(range(0, size, 2))
    assert evens.included() == (rank % 2 == 0)
    assert evens.rank() == (rank // 2 if rank % 2 == 0 else -1)
    if evens.included():
        got = hvd.allreduce(torch.ones(3) * rank, op=hvd.Sum,
                            process_set=evens, name="ps.sum")
        assert torch.equal(got, torch.full((3,), float(sum(range(0, size, 2)))))
        got = hvd.allgather(torch.tensor([rank]), process_set=evens,
                            name="ps.gather")
        assert got.tolist() == list(range(0, size, 2))
        got = hvd.broadcast(torch.tensor([rank]), root_rank=0,
                            process_set=evens, name="ps.bcast")
        assert got.item() == 0
        assert hvd.broadcast_object(rank, root_rank=0, process_set=evens) == 0
    else:
        with pytest.raises(ValueError, match="not a member"):
            hvd.allreduce(torch.ones(1), process_set=evens, name="ps.outsider")
    assert hvd.remove_process_set(evens)
    assert evens.process_set_id is None
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(1), process_set=evens)
    assert not hvd.remove_process_set(hvd.global_process_set)


def test_optimizer_over_a_process_set(rank, size):
    first_two = hvd.add_process_set([0, 1])
    if first_two.included():
        model = torch.nn.Linear(2, 1)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(), process_set=first_two)
        model(torch.ones(1, 2) * (rank + 1)).sum().backward()
        opt.synchronize()
        assert torch.allclose(model.weight.grad, torch.full((1, 2), 1.5))
    hvd.remove_process_set(first_two)


def test_process_set_from_a_list_and_errors(size):
    ps = hvd.add_process_set(list(range(size)))
    assert ps.ranks == list(range(size))
    with pytest.raises(ValueError, match="registered already"):
        hvd.add_process_set(ps)
    hvd.remove_process_set(ps)
    with pytest.raises(ValueError, match="not registered"):
        hvd.ProcessSet([0]).size()
