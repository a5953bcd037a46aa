"""Collectives on torch.Tensor with Horovod's names and arguments.

Every function here is a thin layer over kolo's C++ frontend (kolo._C):
names, dtypes and devices are checked here, before anything is submitted;
negotiation, fusion and the data movement are the runtime's. The
non-in-place collectives are differentiable (see each function).
"""

import atexit
import sys
import threading

import torch

from kolo import _C
from kolo.torch.compression import Compression

# Reduction ops, dtypes, and the checks and names every collective uses:
# kolo/torch/checks.py.
from kolo.torch.checks import (  # noqa: F401  (re-exported)
    _FLOAT_SET, _MOVED_DTYPES, _MOVED_SET, _OP_NAMES, _REDUCED_DTYPES,
    _REDUCED_SET, Adasum, Average, Max, Min, Product, Sum, _check_tensor,
    _generated_name, _name, _op_of, _unnamed)

KoloInternalError = _C.KoloInternalError
# Horovod's name for the same exception.
HorovodInternalError = KoloInternalError


class HostsUpdatedInterrupt(RuntimeError):
    """Raised in an elastic job when hosts were added or removed."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


# --- Process sets: kolo/torch/process_sets.py ------------------------------

from kolo.torch.process_sets import (  # noqa: E402,F401  (re-exported)
    ProcessSet, _check_initialized, _process_sets, _set_id, add_process_set,
    global_process_set, remove_process_set)


# --- Basics -----------------------------------------------------------------

def init(comm=None, process_sets=None):
    """Joins the job described by the environment (kolorun, mpirun, Slurm or
    torchrun set it). ``process_sets``: ProcessSets (or rank lists) to
    register at once. ``comm`` (an MPI communicator in Horovod) is not
    supported: kolo needs no MPI."""
    if comm is not None:
        raise NotImplementedError(
            "init(comm=...) takes an MPI communicator in Horovod; kolo does "
            "not use MPI: start the job with kolorun (or mpirun) instead")
    _C.init()
    global_process_set.ranks = list(range(_C.size()))
    global _atexit_registered
    if not _atexit_registered:
        # As Horovod: a script that never calls shutdown() leaves the job
        # together with the others when it exits; one that dies of an
        # exception leaves at once, so that the others hear of it (and
        # kolorun names it) without waiting.
        atexit.register(_shutdown_at_exit)
        previous = sys.excepthook

        def excepthook(kind, value, traceback):
            global _died_of_exception
            _died_of_exception = True
            previous(kind, value, traceback)
        sys.excepthook = excepthook
        _atexit_registered = True
    for ps in process_sets or ():
        add_process_set(ps)


_atexit_registered = False
_died_of_exception = False


def _shutdown_at_exit():
    if _C.is_initialized() and not _died_of_exception:
        try:
            shutdown()
        except KoloInternalError:
            pass  # The job failed; its error was reported already.


def shutdown():
    """Leaves the job (every rank calls it). init() may be called again."""
    _C.shutdown()
    for ps_id in [i for i in _process_sets if i != 0]:
        _process_sets.pop(ps_id).process_set_id = None


def _after_reset():
    """After an elastic reset (kolo.torch.elastic): the global set has the
    new generation's ranks; other process sets belonged to the old one;
    unnamed collectives are counted afresh, as the newcomers count them."""
    _unnamed.clear()
    for ps_id in [i for i in _process_sets if i != 0]:
        _process_sets.pop(ps_id).process_set_id = None
    if _C.is_initialized():
        global_process_set.ranks = list(range(_C.size()))


def is_initialized():
    return _C.is_initialized()


def size():
    _check_initialized()
    return _C.size()


def rank():
    _check_initialized()
    return _C.rank()


def local_size():
    _check_initialized()
    return _C.local_size()


def local_rank():
    _check_initialized()
    return _C.local_rank()


def cross_size():
    _check_initialized()
    return _C.cross_size()


def cross_rank():
    _check_initialized()
    return _C.cross_rank()


def is_homogeneous():
    """Whether every host runs the same number of ranks."""
    _check_initialized()
    counts = allgather(torch.tensor([_C.local_size()]), name="kolo.homogeneous")
    return bool((counts == counts[0]).all())


def gloo_built():
    return _C.built("gloo")


def gloo_enabled():
    return _C.built("gloo")


def nccl_built():
    """NCCL's version code (e.g. 22803 for 2.28.3) when this build runs CUDA
    tensors over NCCL, else 0, as Horovod's (scripts compare it, e.g. with
    2700)."""
    return _C.nccl_version()


def cuda_built():
    return _C.built("cuda")


def mpi_built():
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def ccl_built():
    return False


def ddl_built():
    return False


def rocm_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Writes a Chrome trace of rank 0's collectives to ``file_path``
    (activity names as Horovod's: NEGOTIATE_ALLREDUCE, ALLREDUCE, ...;
    CYCLE_START markers with ``mark_cycles``)."""
    _check_initialized()
    _C.start_timeline(file_path, bool(mark_cycles))


def stop_timeline():
    _check_initialized()
    _C.stop_timeline()


# --- Handles ------------------------------------------------------------------

class _Handle:
    """What the *_async functions return: pass it to poll() or
    synchronize(); calling it (``handle()``) is synchronize(handle), as
    Horovod's sparse_allreduce_async handles are called."""

    __slots__ = ("_handle", "_finish", "_result", "_done", "_lock")

    def __init__(self, handle, finish=None):
        self._handle = handle
        self._finish = finish
        self._done = False
        self._result = None
        self._lock = threading.Lock()

    def _wait(self):
        with self._lock:
            if not self._done:
                result = self._finish(self._handle) if self._finish else \
                    self._handle.wait()
                self._result = result
                self._done = True
            return self._result

    __call__ = _wait


# The C++ frontend's own handle, which the plain collectives return as it is
# (a result that needs no Python afterwards: the cheapest path).
_NativeHandle = _C.Handle


def poll(handle):
    """True once the collective of ``handle`` has finished (synchronize()
    then returns at once)."""
    if type(handle) is _NativeHandle:
        return handle.poll()
    return handle._done or handle._handle.poll()


def synchronize(handle):
    """Waits for the collective of ``handle`` and returns its result;
    raises KoloInternalError (HorovodInternalError) if it failed."""
    if type(handle) is _NativeHandle:
        return handle.wait()
    if not isinstance(handle, _Handle):
        raise TypeError("synchronize() expects a handle returned by an "
                        "*_async function, got %s" % type(handle).__name__)
    return handle._wait()


def _first(h):
    return h.wait()


def _all(h):
    return h.wait_all()


# --- Allreduce ----------------------------------------------------------------

_Tensor = torch.Tensor


def _allreduce(submit, tensor, name, op, prescale_factor, postscale_factor,
               process_set, in_place, what):
    """``submit``: _C.allreduce_async, or _C.allreduce (blocking, which may
    run the allreduce on this thread: kolo::Runtime::AllreduceAndWait).
    Both raise ValueError only when they refuse to submit."""
    if (type(tensor) is _Tensor and process_set is global_process_set and
            type(name) is str and name):
        # The common case (this runs for every tensor of a step): the C++
        # frontend checks the tensor itself and refuses, before it submits
        # anything, every tensor that _check_tensor refuses (as
        # ValueError); only then does it run, to say it in Horovod's terms
        # (a TypeError for a dtype). Their reads of the
        # tensor's attributes cost more than the rest of the call here.
        # Named calls only: an unnamed one takes its generated name before
        # the C++ checks, so a refusal there would use up a name that the
        # other ranks do not (the checks below come first for it).
        try:
            return submit(tensor, name, op, float(prescale_factor),
                          float(postscale_factor), 0, in_place)
        except ValueError as e:
            refused = e
    else:
        refused = None
    _check_tensor(tensor, what)
    if refused is not None:
        raise refused
    return submit(tensor, _name(name), op, float(prescale_factor),
                  float(postscale_factor), _set_id(process_set), in_place)


def allreduce_async(tensor, average=None, name=None, op=None,
                    prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Starts reducing ``tensor`` over the ranks of ``process_set`` (op:
    Average by default, Sum, Min, Max, Product); the input is not modified.
    Returns a handle for poll() and synchronize(), whose result is a new
    tensor: postscale_factor * op(prescale_factor * tensor on each rank).
    Collectives are matched across ranks by name (auto-generated when
    None, which needs every rank to make the same unnamed calls in the
    same order)."""
    op = _op_of(op, average)
    return _allreduce(_C.allreduce_async, tensor, name, op, prescale_factor,
                      postscale_factor, process_set, False, "allreduce")


def allreduce_async_(tensor, average=None, name=None, op=None,
                     prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """allreduce_async, writing the result into ``tensor``."""
    op = _op_of(op, average)
    return _allreduce(_C.allreduce_async, tensor, name, op, prescale_factor,
                      postscale_factor, process_set, True, "allreduce_")


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """allreduce, in place: the result is written into ``tensor``, which is
    returned."""
    op = _op_of(op, average)
    _allreduce(_C.allreduce, tensor, name, op, prescale_factor,
               postscale_factor, process_set, True, "allreduce_")
    return tensor


def _reduce_grad(grad_output, ctx):
    """The gradient of an allreduce for its input (Sum and Average: the
    allreduce of the gradient, as in Horovod; Min and Max: the summed
    gradient where this rank's input is the result, split among tied
    ranks; Product: the summed gradient times the product of the others'
    inputs)."""
    ps = ctx.process_set
    if ctx.op in (Sum, Average):
        return allreduce(grad_output, op=ctx.op,
                         prescale_factor=ctx.prescale_factor,
                         postscale_factor=ctx.postscale_factor,
                         process_set=ps)
    total = allreduce(grad_output, op=Sum, process_set=ps)
    scale = ctx.prescale_factor * ctx.postscale_factor
    if ctx.op in (Min, Max):
        hit = (ctx.input * ctx.prescale_factor == ctx.result /
               ctx.postscale_factor).to(grad_output.dtype)
        ties = allreduce(hit, op=Sum, process_set=ps)
        return total * hit / ties.clamp(min=1) * scale
    # Product: d(post * prod_k pre*x_k)/dx_r = post * pre * prod_{k!=r} pre*x_k
    gathered = allgather(ctx.input.unsqueeze(0) * ctx.prescale_factor,
                         process_set=ps)
    me = ps.rank() if ps is not global_process_set else _C.rank()
    others = torch.cat([gathered[:me], gathered[me + 1:]])
    return total * others.prod(dim=0) * scale


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor,
                process_set):
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        result = _allreduce(_C.allreduce, tensor, name, op, prescale_factor,
                            postscale_factor, process_set, False, "allreduce")
        if op in (Min, Max, Product):
            ctx.input = tensor.detach()
            ctx.result = result.detach()
        return result

    @staticmethod
    def backward(ctx, grad_output):
        return _reduce_grad(grad_output, ctx), None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none,
              op=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set):
    """Reduces ``tensor`` over the ranks of ``process_set`` and returns the
    result (a new tensor; see allreduce_async). Differentiable. With
    ``compression`` (e.g. Compression.fp16) the tensor travels compressed
    and the result has the input's dtype."""
    op = _op_of(op, average)
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, name, op, prescale_factor,
                               postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def _grouped_allreduce_async(tensors, name, op, prescale_factor,
                             postscale_factor, process_set, in_place, what):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("%s needs at least one tensor" % what)
    for t in tensors:
        _check_tensor(t, what)
    return _Handle(_C.grouped_allreduce_async(
        tensors, _name(name), op, float(prescale_factor),
        float(postscale_factor), _set_id(process_set), in_place), _all)


def grouped_allreduce_async(tensors, average=None, name=None, op=None,
                            prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Reduces a list of tensors as one unit (negotiated and fused together:
    one bad member fails the group on every rank). The handle's result is
    the list of results."""
    op = _op_of(op, average)
    return _grouped_allreduce_async(tensors, name, op, prescale_factor,
                                    postscale_factor, process_set, False,
                                    "grouped_allreduce")


def grouped_allreduce_async_(tensors, average=None, name=None, op=None,
                             prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    op = _op_of(op, average)
    return _grouped_allreduce_async(tensors, name, op, prescale_factor,
                                    postscale_factor, process_set, True,
                                    "grouped_allreduce_")


def grouped_allreduce_(tensors, average=None, name=None, op=None,
                       prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(
        tensors, average, name, op, prescale_factor, postscale_factor,
        process_set))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set,
                *tensors):
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        results = synchronize(_grouped_allreduce_async(
            tensors, name, op, prescale_factor, postscale_factor, process_set,
            False, "grouped_allreduce"))
        if op in (Min, Max, Product):
            ctx.inputs = [t.detach() for t in tensors]
            ctx.results = [r.detach() for r in results]
        return tuple(results)

    @staticmethod
    def backward(ctx, *grads):
        out = []
        for i, g in enumerate(grads):
            if ctx.op in (Min, Max, Product):
                ctx.input, ctx.result = ctx.inputs[i], ctx.results[i]
            out.append(_reduce_grad(g, ctx))
        return (None, None, None, None, None) + tuple(out)


def grouped_allreduce(tensors, average=None, name=None,
                      compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """Reduces a list of tensors as one unit; returns the list of results.
    Differentiable."""
    op = _op_of(op, average)
    pairs = [compression.compress(t) for t in tensors]
    reduced = _GroupedAllreduce.apply(name, op, prescale_factor,
                                      postscale_factor, process_set,
                                      *[p[0] for p in pairs])
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, pairs)]


# --- Allgather ----------------------------------------------------------------

def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's ``tensor`` along the first
    dimension, in rank order (the first dimension may differ between
    ranks). The handle's result is the concatenation."""
    _check_tensor(tensor, "allgather", _MOVED_SET)
    if tensor.dim() == 0:
        raise ValueError("allgather: a scalar has no first dimension to "
                         "concatenate along; reshape it to [1]")
    return _C.allgather_async(tensor, _name(name), _set_id(process_set))


def _set_size(process_set):
    return len(process_set.ranks) if process_set.ranks else _C.size()


def _rows_before_me(rows, process_set):
    """This rank's offset and row count, from every rank's row count."""
    counts = allgather(torch.tensor([rows], dtype=torch.int64),
                       process_set=process_set)
    me = process_set.rank() if process_set is not global_process_set \
        else _C.rank()
    return int(counts[:me].sum()), counts


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0]
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        # As Horovod: this rank's rows get the average over the set of the
        # matching slice of every output's gradient.
        averaged = allreduce(grad_output, op=Average,
                             process_set=ctx.process_set)
        offset, _ = _rows_before_me(ctx.rows, ctx.process_set)
        return averaged.narrow(0, offset, ctx.rows), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's ``tensor`` along the first dimension, in
    rank order, and returns the result. Differentiable."""
    if tensor.requires_grad:
        return _Allgather.apply(tensor, name, process_set)
    return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors, name=None,
                            process_set=global_process_set):
    """Allgathers each tensor of a list; the handle's result is the list of
    results. (Each member is negotiated under "<name>.<index>"; unlike a
    grouped allreduce, members are not fused as one unit.)"""
    tensors = list(tensors)
    base = _name(name) or _generated_name("grouped_allgather", process_set)
    handles = [allgather_async(t, "%s.%d" % (base, i), process_set)
               for i, t in enumerate(tensors)]
    return _Handle(handles, lambda hs: [synchronize(h) for h in hs])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers each tensor of a list; returns the list of results."""
    base = _name(name) or _generated_name("grouped_allgather", process_set)
    return [allgather(t, "%s.%d" % (base, i), process_set)
            for i, t in enumerate(tensors)]


# --- Broadcast ----------------------------------------------------------------

def _broadcast_async(tensor, root_rank, name, process_set, in_place, what):
    """``root_rank`` is a rank of the job, also in a process set (as in
    Horovod); negotiation refuses, on every rank of the set, a root that
    is not a member, naming the set's ranks."""
    _check_tensor(tensor, what, _MOVED_SET)
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise TypeError("%s: root_rank must be an int (a rank of the job), "
                        "not %r" % (what, root_rank))
    return _C.broadcast_async(tensor, root_rank, _name(name),
                              _set_id(process_set), in_place)


def broadcast_async(tensor, root_rank, name=None,
                    process_set=global_process_set):
    """Starts giving every rank ``root_rank``'s tensor; the handle's result
    is a new tensor (the input is not modified)."""
    return _broadcast_async(tensor, root_rank, name, process_set, False,
                            "broadcast")


def broadcast_async_(tensor, root_rank, name=None,
                     process_set=global_process_set):
    """broadcast_async, writing root's values into ``tensor``."""
    return _broadcast_async(tensor, root_rank, name, process_set, True,
                            "broadcast_")


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites ``tensor`` with root's values on every rank; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name,
                                        process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name,
                                           process_set))

    @staticmethod
    def backward(ctx, grad_output):
        # As Horovod: root's input gets the average of every output's
        # gradient; the others' none (root_rank is a rank of the job).
        averaged = allreduce(grad_output, op=Average,
                             process_set=ctx.process_set)
        if _C.rank() != ctx.root_rank:
            averaged = torch.zeros_like(averaged)
        return averaged, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root's tensor on every rank (a new tensor). Differentiable."""
    if tensor.requires_grad:
        return _Broadcast.apply(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


# --- Alltoall -----------------------------------------------------------------

def _splits_list(splits, what):
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64):
            raise TypeError("%s: splits must hold integers, not %s" %
                            (what, splits.dtype))
        return [int(s) for s in splits.tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None,
                   process_set=global_process_set):
    """Starts sending ``splits[k]`` rows of ``tensor`` to rank k of the set
    (equal parts of the first dimension when None). The handle's result is
    (the rows received from every rank, concatenated in rank order, and a
    tensor of how many rows came from each)."""
    _check_tensor(tensor, "alltoall", _MOVED_SET)
    if tensor.dim() == 0:
        raise ValueError("alltoall: a scalar has no first dimension to split")
    handle = _C.alltoall_async(tensor, _splits_list(splits, "alltoall"),
                               _name(name), _set_id(process_set))

    def finish(h):
        output = h.wait()
        return output, torch.tensor(h.received_splits(), dtype=torch.int32)
    return _Handle(handle, finish)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        output, received = synchronize(alltoall_async(tensor, splits, name,
                                                      process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, grad_received):
        # The gradient of the rows this rank sent comes back along the
        # reverse routes: an alltoall with the received counts as splits.
        grad, _ = synchronize(alltoall_async(grad_output, ctx.received,
                                             process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends ``splits[k]`` rows of ``tensor`` to rank k of the set and
    returns the rows received from every rank, concatenated in rank order;
    with ``splits`` given, returns (output, received_splits), as Horovod.
    Differentiable."""
    if tensor.requires_grad:
        output, received = _Alltoall.apply(tensor, splits, name, process_set)
    else:
        output, received = synchronize(alltoall_async(tensor, splits, name,
                                                      process_set))
    return output if splits is None else (output, received)


# --- Reducescatter ------------------------------------------------------------

def _reducescatter_async(tensor, name, op, prescale_factor, postscale_factor,
                         process_set, what):
    _check_tensor(tensor, what)
    if op not in (Sum, Average):
        raise ValueError("%s supports op=hvd.Sum and hvd.Average, not %s" %
                         (what, _OP_NAMES.get(op, op)))
    if tensor.dim() == 0:
        raise ValueError("%s: a scalar has no first dimension to scatter" %
                         what)
    return _C.reducescatter_async(tensor, _name(name), op,
                                  float(prescale_factor),
                                  float(postscale_factor),
                                  _set_id(process_set))


def reducescatter_async(tensor, name=None, op=Average,
                        process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts reducing ``tensor`` (same shape on every rank) and scattering
    the first dimension: rank k of the set gets the k-th share of the
    rows (the first ranks one row more when it does not divide)."""
    op = _op_of(op, None)
    return _reducescatter_async(tensor, name, op, prescale_factor,
                                postscale_factor, process_set,
                                "reducescatter")


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor,
                process_set):
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        return synchronize(_reducescatter_async(
            tensor, name, op, prescale_factor, postscale_factor, process_set,
            "reducescatter"))

    @staticmethod
    def backward(ctx, grad_output):
        # As Horovod defines it: every rank's input gets all ranks' output
        # gradients, in rank order (an allgather), times the set size for
        # Sum and times the scale factors.
        grad = grad_output
        if ctx.op == Sum:
            grad = grad * _set_size(ctx.process_set)
        if ctx.prescale_factor != 1.0:
            grad = grad * ctx.prescale_factor
        if ctx.postscale_factor != 1.0:
            grad = grad * ctx.postscale_factor
        return (allgather(grad, process_set=ctx.process_set), None, None,
                None, None, None)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces ``tensor`` and returns this rank's share of the first
    dimension. Differentiable."""
    op = _op_of(op, None)
    compressed, ctx = compression.compress(tensor)
    result = _Reducescatter.apply(compressed, name, op, prescale_factor,
                                  postscale_factor, process_set)
    return compression.decompress(result, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average,
                                process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Reducescatters each tensor of a list; the handle's result is the list
    of results (members negotiated under "<name>.<index>")."""
    base = _name(name) or _generated_name("grouped_reducescatter", process_set)
    handles = [reducescatter_async(t, "%s.%d" % (base, i), op, process_set,
                                   prescale_factor, postscale_factor)
               for i, t in enumerate(tensors)]
    return _Handle(handles, lambda hs: [synchronize(h) for h in hs])


def grouped_reducescatter(tensors, name=None, compression=Compression.none,
                          op=Average, process_set=global_process_set,
                          prescale_factor=1.0, postscale_factor=1.0):
    base = _name(name) or _generated_name("grouped_reducescatter", process_set)
    return [reducescatter(t, "%s.%d" % (base, i), compression, op,
                          process_set, prescale_factor, postscale_factor)
            for i, t in enumerate(tensors)]


# --- Sparse, barrier, join ----------------------------------------------------

def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Reduces a sparse COO tensor through allgather, as Horovod does: every
    rank's indices and values are gathered and summed (coalesced) into one
    sparse tensor; Average divides by the set size. The handle is called
    (``handle()``, as in Horovod) or passed to synchronize() for the
    sparse result."""
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async expects a sparse tensor")
    if op not in (Sum, Average):
        raise ValueError("sparse_allreduce_async supports op=hvd.Sum and "
                         "hvd.Average")
    t = tensor.coalesce()
    base = _name(name) or _generated_name("sparse_allreduce", process_set)
    indices = allgather_async(t.indices().t().contiguous(), base + ".indices",
                              process_set)
    values = allgather_async(t.values(), base + ".values", process_set)
    set_size = _set_size(process_set)

    def finish(handles):
        idx = synchronize(handles[0]).t()
        vals = synchronize(handles[1])
        if op == Average:
            vals = vals / set_size
        return torch.sparse_coo_tensor(idx, vals, t.shape).coalesce()
    return _Handle((indices, values), finish)


def barrier(process_set=global_process_set):
    """Blocks until every rank of the set has called barrier()."""
    _C.barrier(_set_id(process_set))


def join(device=-1):
    """This rank has no more data: until every rank has joined it
    contributes zeros to the others' Sum/Average allreduces (Average
    divides by the ranks that contributed). Blocks until all have joined;
    returns the rank that joined last."""
    del device  # Horovod's argument; kolo needs none.
    return _C.join()
