"""DistributedOptimizer: data-parallel training by wrapping any
torch.optim optimizer, as Horovod's.

The gradient hooks and their allreduces are the C++ frontend's
GradientReducer (frontends/torch/include/kolo/torch/gradient_reducer.h):
each gradient's allreduce starts as soon as autograd has accumulated it,
from autograd's own thread, without calling into Python; step() waits for
them and steps the wrapped optimizer. An error during backward (e.g. a
gradient computed more often than backward_passes_per_step allows) is kept
and raised by step() or synchronize(), never inside backward().
"""

import contextlib
import warnings

import torch

from kolo import _C
from kolo.torch import mpi_ops
from kolo.torch.compression import Compression
from kolo.torch.mpi_ops import Average, Adasum, Sum, global_process_set


class _DistributedOptimizer:
    """Methods of the class DistributedOptimizer() derives from the wrapped
    optimizer's class (so that isinstance() and LR schedulers work)."""

    def _kolo_setup(self, named_parameters, compression,
                    backward_passes_per_step, op, gradient_predivide_factor,
                    groups, sparse_as_dense, process_set):
        if op == Adasum:
            raise NotImplementedError(
                "op=hvd.Adasum is not implemented by kolo; use hvd.Average "
                "or hvd.Sum")
        if op not in (Average, Sum):
            raise ValueError("DistributedOptimizer: op must be hvd.Average or "
                             "hvd.Sum")
        code = getattr(compression, "_code", None)
        if code is None:
            raise ValueError(
                "DistributedOptimizer: compression must be Compression.none, "
                ".fp16 or .bf16 (the gradients are compressed by kolo's C++ "
                "reducer; a compressor of your own is not supported there)")
        if not isinstance(backward_passes_per_step, int) or \
                backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be a positive "
                             "integer, not %r" % (backward_passes_per_step,))
        params = _trained_parameters(self.param_groups, named_parameters)
        names = {id(p): n for n, p in params}
        num_groups, group_names = 0, []
        if isinstance(groups, int):
            if groups < 0:
                raise ValueError("groups must be a non-negative integer or a "
                                 "list of lists of parameters")
            num_groups = groups
        elif groups is not None:
            for group in groups:
                try:
                    group_names.append([names[id(p)] for p in group])
                except KeyError:
                    raise ValueError(
                        "groups lists a tensor that is not a trained parameter "
                        "of the optimizer") from None
        mpi_ops._set_id(process_set)
        self._kolo_synchronized = False  # by synchronize(), since step()
        self._kolo_skipping = False      # inside skip_synchronize()
        self._kolo_reducer = _C.GradientReducer(
            params, op, backward_passes_per_step, code,
            float(gradient_predivide_factor), bool(sparse_as_dense),
            num_groups, group_names, process_set.process_set_id, "grad/")

    def synchronize(self):
        """Waits for every gradient's allreduce (submitting those whose hook
        has not fired: parameters no backward pass reached get zeros) and
        writes the results into the gradients. The next step() does not
        synchronize again, so gradients may be changed in between
        (clipping, unscaling)."""
        self._kolo_reducer.synchronize()
        self._kolo_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """``with optimizer.skip_synchronize(): optimizer.step()`` steps
        without synchronizing (after a synchronize() of your own)."""
        self._kolo_reducer.skip_synchronize()
        self._kolo_skipping = True
        try:
            yield
        finally:
            self._kolo_skipping = False

    def step(self, closure=None):
        """Synchronizes (unless done since the last backward pass or
        skipped), then steps the wrapped optimizer."""
        if self._kolo_synchronized and not self._kolo_skipping:
            # Horovod's warning, word for word: scripts and tests look for it.
            warnings.warn("optimizer.step() called without "
                          "optimizer.skip_synchronize() context after "
                          "optimizer.synchronize(). This can cause training "
                          "slowdown. You may want to consider using "
                          "optimizer.skip_synchronize() context if you use "
                          "optimizer.synchronize() in your code.")
        self._kolo_synchronized = False
        self._kolo_reducer.before_step()
        loss = super(self.__class__, self).step(closure)
        self._kolo_reducer.after_step()
        return loss

    def zero_grad(self, *args, **kwargs):
        """The wrapped optimizer's zero_grad(); an error while allreduces
        are in flight (they would write into the zeroed gradients)."""
        self._kolo_reducer.before_zero_grad()
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def _trained_parameters(param_groups, named_parameters):
    """(name, parameter) for every parameter of the optimizer that requires
    grad, each once, in param-group order."""
    seen, out = set(), []
    names = None
    if named_parameters is not None:
        named = list(named_parameters)
        if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
            raise ValueError("named_parameters must be (name, tensor) pairs, "
                             "e.g. model.named_parameters()")
        by_name = {}
        for n, p in named:
            if n in by_name and by_name[n] is not p:
                raise ValueError("named_parameters names two tensors %r" % n)
            by_name[n] = p
        names = {}
        for n, p in named:
            names.setdefault(id(p), n)
    for g, group in enumerate(param_groups):
        for i, p in enumerate(group["params"]):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            if names is None:
                out.append(("param.%d.%d" % (g, i), p))
            elif id(p) not in names:
                raise ValueError(
                    "parameter %d of param group %d (shape %s) is not in "
                    "named_parameters: pass the named_parameters() of every "
                    "module the optimizer trains" % (i, g, list(p.shape)))
            else:
                out.append((names[id(p)], p))
    return out


def DistributedOptimizer(optimizer, named_parameters=None,
                         compression=Compression.none,
                         backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0, num_groups=0,
                         groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps ``optimizer`` so that step() averages (op=Sum: sums) the
    gradients over the ranks first.

    The returned object is an instance of a subclass of the optimizer's
    class sharing the wrapped optimizer's param groups and state (so LR
    schedulers and state_dict() work on it). ``named_parameters`` (e.g.
    model.named_parameters()) names the gradients, which makes mismatch
    errors tell the parameter; ``backward_passes_per_step`` passes are
    accumulated locally before one allreduce; ``compression``:
    Compression.none, .fp16 or .bf16; ``gradient_predivide_factor`` f:
    gradients are scaled by 1/f before the sum and f/size after it;
    ``groups`` (an int, or lists of parameters) or ``num_groups``: the
    gradients of a group are allreduced as one unit; sparse gradients
    (``nn.Embedding(sparse=True)``) are reduced as Horovod does, by an
    allgather of their indices and values, unless ``sparse_as_dense``
    makes them dense first; ``process_set``: the ranks to average over.
    """
    if groups is None and num_groups:
        groups = num_groups
    methods = {k: v for k, v in _DistributedOptimizer.__dict__.items()
               if k not in ("__dict__", "__weakref__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), methods)
    wrapped = cls.__new__(cls)
    # The same param groups, state and defaults objects: changing the lr
    # through either changes both.
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._kolo_setup(named_parameters, compression,
                        backward_passes_per_step, op,
                        gradient_predivide_factor, groups, sparse_as_dense,
                        process_set)
    return wrapped
