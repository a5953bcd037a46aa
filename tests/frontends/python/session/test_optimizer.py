"""DistributedOptimizer: 2 ranks x batch b equals 1 rank x batch 2b, and
the rest of Horovod's optimizer semantics."""

import pytest
import torch

import kolo.torch as hvd


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 5)
        self.fc2 = torch.nn.Linear(5, 3)
        self.unused = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _batch(r, n=4):
    g = torch.Generator().manual_seed(50 + r)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _model():
    torch.manual_seed(7)
    return Net()


def _reference(size, steps, make_opt, accumulate=1):
    """One process training on every rank's batch at once."""
    model = _model()
    opt = make_opt(model.parameters())
    for step in range(steps):
        opt.zero_grad()
        for part in range(accumulate):
            xs, ys = zip(*[_batch(r * 100 + step * 10 + part) for r in range(size)])
            loss = torch.nn.functional.cross_entropy(model(torch.cat(xs)),
                                                     torch.cat(ys))
            (loss / accumulate).backward()
        opt.step()
    return model


@pytest.mark.parametrize("name,make_opt", [
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    ("adam", lambda p: torch.optim.Adam(p, lr=0.01)),
])
def test_ranks_equal_one_process_on_the_whole_batch(name, make_opt, rank,
                                                    size):
    model = _model()
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters())
    assert isinstance(opt, type(make_opt(_model().parameters())))
    for step in range(3):
        opt.zero_grad()
        x, y = _batch(rank * 100 + step * 10)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    ref = _reference(size, 3, make_opt)
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-5), (name, n)
    # Every rank holds the same bits.
    flat = torch.cat([p.detach().view(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat.view(1, -1), name="opt.same.%s" % name)
    assert all(torch.equal(row, gathered[0]) for row in gathered)


def test_backward_passes_per_step_accumulate_locally(rank, size):
    make = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    model = _model()
    opt = hvd.DistributedOptimizer(make(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    for step in range(2):
        opt.zero_grad()
        for part in range(2):
            x, y = _batch(rank * 100 + step * 10 + part)
            (torch.nn.functional.cross_entropy(model(x), y) / 2).backward()
        opt.step()
    ref = _reference(size, 2, make, accumulate=2)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-5)


def test_a_parameter_without_gradient_does_not_hang(rank, size):
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = _batch(rank)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()  # `unused` got no gradient on any rank: zeros are reduced
    assert torch.equal(model.unused.weight.grad, torch.zeros(2, 2))


def test_compression_and_groups_and_sum(rank, size):
    make = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    variants = [
        lambda m: {"compression": hvd.Compression.fp16},
        lambda m: {"num_groups": 2},
        lambda m: {"groups": [[m.fc1.weight, m.fc2.weight]]},
        lambda m: {"op": hvd.Sum},
        lambda m: {"gradient_predivide_factor": 2.0},
    ]
    for index, variant in enumerate(variants):
        model = _model()
        kwargs = variant(model)
        opt = hvd.DistributedOptimizer(
            make(model.parameters()), named_parameters=model.named_parameters(),
            **kwargs)
        x, y = _batch(rank)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.synchronize()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        with opt.skip_synchronize():
            opt.step()
        # Every rank ended with the same gradients.
        flat = torch.cat([g.view(-1) for g in grads]).view(1, -1)
        gathered = hvd.allgather(flat, name="opt.grads.%d" % index)
        assert all(torch.allclose(row, gathered[0]) for row in gathered)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(make(_model().parameters()), op=hvd.Adasum)


def test_lr_scheduler_and_state_dict_reach_the_wrapped_optimizer(rank):
    model = _model()
    inner = torch.optim.SGD(model.parameters(), lr=1.0)
    opt = hvd.DistributedOptimizer(inner,
                                   named_parameters=model.named_parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = _batch(rank)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == inner.param_groups[0]["lr"] == 0.5
    assert opt.state_dict()["param_groups"][0]["lr"] == 0.5


def test_errors_raise_from_step_not_from_backward(rank):
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = _batch(rank)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(hvd.KoloInternalError, match="zero_grad"):
        opt.zero_grad()  # allreduces are in flight
    opt.synchronize()
    opt.zero_grad()
    # Two passes with backward_passes_per_step=1: kept, raised by step().
    torch.nn.functional.cross_entropy(model(x), y).backward()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(hvd.KoloInternalError,
                       match="wrapped optimizer's own step"):
        opt.step()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()  # the next step goes on


def test_amp_style_unscale_and_clip(rank, size):
    """The documented pattern for gradient clipping / unscaling."""
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    scaler = torch.cuda.amp.GradScaler(enabled=False)  # CPU: a pass-through
    x, y = _batch(rank)
    scaler.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
    opt.synchronize()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()
    flat = torch.cat([p.detach().view(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat.view(1, -1), name="amp.same")
    assert all(torch.equal(row, gathered[0]) for row in gathered)


def test_bad_arguments():
    model = _model()
    opt = lambda: torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: E731
    with pytest.raises(ValueError, match="not in named_parameters"):
        hvd.DistributedOptimizer(opt(), named_parameters=[("fc1.weight",
                                                            model.fc1.weight)])
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(opt(), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="op must be"):
        hvd.DistributedOptimizer(opt(), op=hvd.Max)


def test_zero_grad_passes_set_to_none_through(rank):
    """Horovod's wrapper passes zero_grad's arguments to torch's, whose
    default differs between torch 1.13 (zeros) and 2.x (None)."""
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for set_to_none in (False, True):
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        if set_to_none:
            assert model.weight.grad is None
        else:
            assert torch.equal(model.weight.grad, torch.zeros(1, 2))
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    opt.zero_grad()
    torch_default = torch.optim.SGD([torch.zeros(1, requires_grad=True)],
                                    lr=0.1)
    p = torch_default.param_groups[0]["params"][0]
    p.grad = torch.ones(1)
    torch_default.zero_grad()
    assert (model.weight.grad is None) == (p.grad is None)
