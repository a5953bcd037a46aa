"""What every collective of kolo.torch checks before it submits anything,
and how unnamed collectives are named; the reduction ops and dtypes
(Horovod's names). Re-exported by kolo.torch.mpi_ops."""

import itertools

import torch

from kolo import _C

# Reduction ops: the runtime's values (kolo/types.h), plus Adasum, which
# kolo does not implement.
Sum = 0
Average = 1
Min = 2
Max = 3
Product = 4
Adasum = 5

_OP_NAMES = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max",
             Product: "Product", Adasum: "Adasum"}

# Dtypes the runtime reduces; bool is only moved (broadcast, allgather,
# alltoall), as in Horovod: a reduction of bool is refused in negotiation,
# on every rank alike (a rank's dtype may differ from the others').
_REDUCED_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32,
                   torch.int64, torch.float16, torch.bfloat16, torch.float32,
                   torch.float64)
_MOVED_DTYPES = _REDUCED_DTYPES + (torch.bool,)
_REDUCED_SET = frozenset(_REDUCED_DTYPES)
_MOVED_SET = frozenset(_MOVED_DTYPES)
_FLOAT_SET = frozenset((torch.float16, torch.bfloat16, torch.float32,
                        torch.float64))


def _op_of(op, average, default=Average):
    if average is not None:
        if op is not None:
            raise ValueError("pass op or the deprecated average, not both")
        return Average if average else Sum
    if op is None:
        return default
    if op == Adasum:
        raise NotImplementedError(
            "Adasum is not implemented by kolo; use op=hvd.Average or hvd.Sum")
    if op not in _OP_NAMES:
        raise ValueError("unknown reduction op %r (use hvd.Average, hvd.Sum, "
                         "hvd.Min, hvd.Max or hvd.Product)" % (op,))
    return op


# These checks run for every collective, also each gradient of a training
# step submitted from Python: each costs a set lookup or an attribute read.
# Only what every rank passes alike is refused here; a check whose outcome
# may differ between ranks (a dtype the reduction cannot take, a root outside
# the process set) is negotiation's, so that every rank hears of it at once.
def _check_tensor(tensor, what, dtypes=_MOVED_SET):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("%s expects a torch.Tensor, got %s" %
                        (what, type(tensor).__name__))
    if tensor.dtype not in dtypes:
        raise TypeError(
            "%s: dtype %s is not supported (kolo supports %s)" %
            (what, tensor.dtype, ", ".join(
                str(d).replace("torch.", "")
                for d in (_MOVED_DTYPES if dtypes is _MOVED_SET
                          else _REDUCED_DTYPES))))
    if tensor.is_cpu and tensor.layout == torch.strided:
        return
    if tensor.layout != torch.strided:
        raise ValueError("%s: %s tensors are not supported (dense tensors "
                         "only; sparse gradients: sparse_allreduce_async or "
                         "sparse_as_dense=True)" % (what, tensor.layout))
    if tensor.device.type == "cuda":
        if not _C.built("cuda"):
            raise ValueError("%s: the tensor is on %s, but this build of kolo "
                             "has no CUDA backend" % (what, tensor.device))
    elif tensor.device.type != "cpu":
        raise ValueError("%s: tensors on %s are not supported (CPU and CUDA "
                         "only)" % (what, tensor.device))


_unnamed = {}


def _generated_name(kind, process_set=None):
    """"<kind>.noname.<n>" for the collectives composed here (the C++
    frontend numbers its own), counted per process set (only its members
    make its collectives): every rank of the set must make the same unnamed
    calls in the same order."""
    set_id = process_set.process_set_id if process_set is not None else 0
    counter = _unnamed.setdefault((kind, set_id), itertools.count())
    if set_id:
        return "%s.noname.set%d.%d" % (kind, set_id, next(counter))
    return "%s.noname.%d" % (kind, next(counter))


def _name(name):
    if name is None:
        return ""
    if not isinstance(name, str):
        raise TypeError("name must be a str, not %s" % type(name).__name__)
    return name
