"""Making every rank start from the same state: parameters, optimizer
state and Python objects from a root rank, as Horovod's functions."""

import io
import pickle

import torch

from kolo import _C
from kolo.torch import mpi_ops
from kolo.torch.mpi_ops import global_process_set


_WEIGHTS_ONLY = int(torch.__version__.split(".")[0]) >= 2


def _named_tensors(params):
    if isinstance(params, dict):
        return list(params.items())
    items = list(params)
    if items and isinstance(items[0], torch.Tensor):
        return [("param.%d" % i, t) for i, t in enumerate(items)]
    return [(str(n), t) for n, t in items]


def broadcast_parameters(params, root_rank, prefix=None,
                         process_set=global_process_set):
    """Overwrites every tensor of ``params`` with ``root_rank``'s values, in
    place: a state_dict() (parameters and buffers), named_parameters(), or
    a list of tensors. Names and shapes must agree across ranks (a
    mismatch names the tensor). All broadcasts run together (fused).
    ``root_rank`` is a rank of the job, also with a ``process_set`` (as in
    Horovod)."""
    handles = []
    for name, tensor in _named_tensors(params):
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError("broadcast_parameters: %r is a %s, not a tensor" %
                            (name, type(tensor).__name__))
        name = "broadcast.%s%s" % (prefix + "." if prefix else "", name)
        handles.append(mpi_ops.broadcast_async_(tensor.detach(), root_rank,
                                                name, process_set))
    for handle in handles:
        mpi_ops.synchronize(handle)


def broadcast_object(obj, root_rank=0, name=None,
                     process_set=global_process_set):
    """Returns ``root_rank``'s ``obj`` (anything pickle accepts) on every
    rank of ``process_set``; ``root_rank`` is a rank of the job (as in
    Horovod)."""
    data = pickle.dumps(obj) if mpi_ops.rank() == root_rank else b""
    data = _C.broadcast_bytes(data, root_rank,
                              mpi_ops._name(name) or
                              mpi_ops._generated_name("broadcast_object", process_set),
                              mpi_ops._set_id(process_set))
    return pickle.loads(data)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's ``obj``, in rank order."""
    base = mpi_ops._name(name) or mpi_ops._generated_name("allgather_object", process_set)
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    sizes = mpi_ops.allgather(torch.tensor([data.numel()], dtype=torch.int64),
                              name=base + ".sizes", process_set=process_set)
    gathered = mpi_ops.allgather(data, name=base + ".data",
                                 process_set=process_set)
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(gathered[offset:offset + n].numpy().tobytes()))
        offset += n
    return out


def broadcast_optimizer_state(optimizer, root_rank, model=None,
                              process_set=global_process_set):
    """Gives every rank of ``process_set`` ``root_rank``'s optimizer state
    (``root_rank``: a rank of the job): every param group's options (lr,
    betas, ...) and the per-parameter state, also where root has created
    it lazily in a first step() and the others have not (or the reverse).
    Works for every torch.optim optimizer: root's state_dict() is
    serialised, broadcast and loaded. The optimizers must have the same
    param groups with parameters of the same shapes.

    As in Horovod, a parameter that requires grad and has no gradient yet
    gets a zero gradient when the state is still empty (so that code
    reading ``p.grad`` afterwards finds a tensor); unlike Horovod, no
    optimizer step is taken to create the state (the first real step
    creates it on every rank alike)."""
    del model  # Horovod's argument, not needed here.
    if not optimizer.state:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
    if mpi_ops.rank() == root_rank:
        buffer = io.BytesIO()
        torch.save(optimizer.state_dict(), buffer)
        data = buffer.getvalue()
    else:
        data = b""
    data = _C.broadcast_bytes(data, root_rank, "broadcast.optimizer_state",
                              mpi_ops._set_id(process_set))
    # A state_dict holds tensors, numbers, strings and containers: what
    # torch 2.x's weights_only loads (its default from 2.6), stated; 1.13's
    # weights_only cannot load floats.
    state = torch.load(io.BytesIO(data), weights_only=_WEIGHTS_ONLY)
    mine = optimizer.state_dict()
    if len(mine["param_groups"]) != len(state["param_groups"]) or any(
            len(a["params"]) != len(b["params"])
            for a, b in zip(mine["param_groups"], state["param_groups"])):
        raise ValueError(
            "broadcast_optimizer_state: rank %d's optimizer has param groups "
            "of %s parameters, root rank %d's %s" %
            (mpi_ops.rank(), [len(g["params"]) for g in mine["param_groups"]],
             root_rank, [len(g["params"]) for g in state["param_groups"]]))
    optimizer.load_state_dict(state)

