"""Elastic training with Horovod's API (``hvd.elastic``), for jobs kolorun
runs in elastic mode (``kolorun -np 4 --min-np 2 ...``; docs/elastic.md).

    import kolo.torch as hvd
    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader):
                ...
                state.commit()

    train(state)

``commit()`` keeps a copy of the state in memory and checks, with the other
ranks, whether kolorun asked the job to re-form (hosts added or removed).
When a rank is lost, every survivor's pending collective raises
KoloInternalError naming it; ``run`` then restores the last commit, leaves
the generation, joins the next one (kolorun's assignment: new rank and
size) and syncs: the rank with the most commits (the lowest such rank)
broadcasts its state to every rank, newcomers included. What is lost: the
steps since the last commit.
"""

import copy
import functools
import math

import torch

from kolo import _C
from kolo.torch import mpi_ops
from kolo.torch.functions import (allgather_object, broadcast_object,
                                  broadcast_optimizer_state,
                                  broadcast_parameters)
from kolo.torch.mpi_ops import HostsUpdatedInterrupt, KoloInternalError

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt", "enabled", "generation"]


def enabled():
    """Whether this process is a worker of an elastic job."""
    return _C.elastic_enabled()


def generation():
    """The generation (membership) this worker is in: 0, 1, 2, ..."""
    return _C.elastic_generation()


def _reset():
    """Leaves the current generation and joins the next; False when this
    worker has no place in it."""
    member = _C.elastic_reset()
    mpi_ops._after_reset()
    return member


def run(func):
    """Decorator (Horovod's ``hvd.elastic.run``): ``func(state, ...)`` runs
    until it returns; after a lost rank (KoloInternalError) the state goes
    back to its last commit, after HostsUpdatedInterrupt it is kept; either
    way the job re-forms and ``func`` runs again, after ``state.sync()``. A
    worker with no place in the next generation (its host was removed, or
    the job is finishing) exits with status 0."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not enabled():
            state.sync()
            return func(state, *args, **kwargs)
        reset_required = False
        while True:
            if reset_required:
                if not _reset():
                    raise SystemExit(0)
                state.on_reset()
            try:
                state.sync()
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt:
                pass
            except KoloInternalError:
                state.restore()
            reset_required = True
    return wrapper


class State:
    """What survives a reset. Subclasses implement save(), restore() and
    _broadcast(root)."""

    def __init__(self):
        self._reset_callbacks = []
        self._commits = 0

    def register_reset_callbacks(self, callbacks):
        """Callables run after every reset, before sync() (e.g. to scale
        the learning rate with the new size)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state, then check_host_updates(). Collective."""
        self.save()
        self._commits += 1
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when kolorun asked
        the job to re-form (agreed by all ranks). Collective."""
        if enabled() and _C.elastic_hosts_updated():
            raise HostsUpdatedInterrupt(False)

    def sync(self):
        """Every rank takes the state of the rank with the most commits (the
        lowest such rank): who that is is agreed by all, never assumed."""
        # Also in a job of one: the broadcast puts the state in the new
        # generation's shape (samplers are re-partitioned).
        commits = allgather_object(self._commits,
                                   name="kolo.elastic.sync.commits")
        best = max(commits)
        self._broadcast(commits.index(best))
        self._commits = best
        self.save()

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def _broadcast(self, root):
        raise NotImplementedError


class ObjectState(State):
    """Named Python values (anything pickle accepts), as attributes:
    ``state = ObjectState(epoch=0)``, ``state.epoch += 1``."""

    def __init__(self, **kwargs):
        self._values = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        super().__init__()
        self._saved_values = {}
        ObjectState.save(self)

    def save(self):
        self._saved_values = {n: copy.deepcopy(getattr(self, n))
                              for n in self._values}

    def restore(self):
        for name, value in self._saved_values.items():
            setattr(self, name, copy.deepcopy(value))

    def _broadcast(self, root):
        values = broadcast_object({n: getattr(self, n) for n in self._values},
                                  root_rank=root,
                                  name="kolo.elastic.sync.values")
        for name, value in values.items():
            setattr(self, name, value)


class TorchState(ObjectState):
    """A model's parameters and buffers, an optimizer's state, and named
    values; ElasticSampler values are kept with their progress (Horovod's
    ``hvd.elastic.TorchState``)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        samplers = {n: v for n, v in kwargs.items()
                    if isinstance(v, ElasticSampler)}
        others = {n: v for n, v in kwargs.items() if n not in samplers}
        self._samplers = samplers
        for name, sampler in samplers.items():
            setattr(self, name, sampler)
        self._saved_model = None
        self._saved_optimizer = None
        self._saved_samplers = {}
        super().__init__(**others)
        TorchState.save(self)
        reducer = getattr(optimizer, "_kolo_reducer", None)
        if reducer is not None:
            # A DistributedOptimizer's allreduces run on the job's context,
            # which every reset replaces.
            self.register_reset_callbacks([reducer.reset])

    def commit(self):
        # The samples every rank recorded since the last commit become
        # everyone's: a rank lost later does not take them along.
        for sampler in self._samplers.values():
            sampler._share_recorded()
        super().commit()

    def save(self):
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())
        self._saved_samplers = {n: s.state_dict()
                                for n, s in self._samplers.items()}
        super().save()

    def restore(self):
        if self.model is not None and self._saved_model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None and self._saved_optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        for name, saved in self._saved_samplers.items():
            self._samplers[name].load_state_dict(saved)
        super().restore()

    def _broadcast(self, root):
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=root)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=root)
        if self._samplers:
            states = broadcast_object(
                {n: s.state_dict() for n, s in self._samplers.items()},
                root_rank=root, name="kolo.elastic.sync.samplers")
            for name, sampler_state in states.items():
                self._samplers[name].load_state_dict(sampler_state)
        super()._broadcast(root)


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions a dataset among the ranks of the current generation and
    resumes an epoch where it stopped: the samples recorded as processed
    (record_batch, record_indices) before the last commit are not given
    out again after a reset; the rest is split among the new ranks. Each
    rank gets ceil(remaining / size) samples; the first few are given twice
    when the remaining ones do not divide evenly (as DistributedSampler
    pads), so that every rank runs the same number of steps. Put it in the
    TorchState (``TorchState(model, opt, sampler=sampler)``) so that its
    progress is committed and synced."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()  # committed, of every rank
        self._recorded = []             # this rank's, since the last commit
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch ``epoch`` afresh (its own shuffle)."""
        self.epoch = epoch
        self.processed_indices = set()
        self._recorded = []
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks the ``batch_idx``-th batch of ``batch_size`` of this rank's
        current partition as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices):
        self._recorded.extend(int(i) for i in indices)

    def get_indices(self, batch_idx, batch_size):
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def _order(self):
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=g).tolist()

    def reset(self):
        """Re-partitions what is left of the epoch among the current ranks."""
        initialized = mpi_ops.is_initialized()
        self.num_replicas = mpi_ops.size() if initialized else 1
        self.rank = mpi_ops.rank() if initialized else 0
        remaining = [i for i in self._order()
                     if i not in self.processed_indices]
        self.remaining_indices = remaining
        self.num_samples = math.ceil(len(remaining) / self.num_replicas)
        total = self.num_samples * self.num_replicas
        padded = list(remaining)
        while remaining and len(padded) < total:
            padded.extend(remaining[:total - len(padded)])
        self.indices = padded[self.rank:total:self.num_replicas]

    def _share_recorded(self):
        for part in allgather_object(self._recorded):
            self.processed_indices.update(part)
        self._recorded = []

    def state_dict(self):
        return {"epoch": self.epoch,
                "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]
        self.processed_indices = set(state["processed_indices"])
        self._recorded = []
        self.reset()

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
