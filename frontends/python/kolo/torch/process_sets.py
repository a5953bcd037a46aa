"""Process sets (Horovod's hvd.ProcessSet): subsets of the job's ranks that
collectives can run on. Re-exported by kolo.torch.mpi_ops and kolo.torch."""

from kolo import _C


def _check_initialized():
    if not _C.is_initialized():
        raise ValueError(
            "kolo.torch has not been initialized; call hvd.init() first")


class ProcessSet:
    """A subset of the job's ranks that collectives can run on.

    Create with ranks (``ProcessSet([0, 2])``) and register with
    ``add_process_set`` (or pass to ``init(process_sets=...)``) on every
    rank; then pass as ``process_set=`` to any collective.
    """

    def __init__(self, ranks):
        self.ranks = sorted(int(r) for r in ranks)
        self.process_set_id = None

    def _check(self):
        if self.process_set_id is None:
            raise ValueError(
                "process set %s is not registered: call "
                "hvd.add_process_set() on every rank first" % (self.ranks,))

    def included(self):
        """Whether this rank belongs to the set."""
        self._check()
        return _C.rank() in self.ranks

    def rank(self):
        """This rank's rank within the set (-1 if not a member)."""
        self._check()
        r = _C.rank()
        return self.ranks.index(r) if r in self.ranks else -1

    def size(self):
        """The number of ranks in the set."""
        self._check()
        return len(self.ranks)

    def __repr__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (
            self.process_set_id, self.ranks)


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
_process_sets = {0: global_process_set}


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks) and returns
    the ProcessSet. Collective: every rank of the job calls it, with the
    same ranks, in the same order."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError("%r is registered already" % (process_set,))
    _check_initialized()
    process_set.process_set_id = _C.add_process_set(process_set.ranks)
    _process_sets[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Removes a registered process set. Collective, like add_process_set.
    Returns True if it was removed."""
    if process_set is global_process_set or \
            process_set.process_set_id in (None, 0):
        return False
    _check_initialized()
    _C.remove_process_set(process_set.process_set_id)
    del _process_sets[process_set.process_set_id]
    process_set.process_set_id = None
    return True


def _set_id(process_set):
    if process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise TypeError("process_set must be a ProcessSet, not %s" %
                        type(process_set).__name__)
    process_set._check()
    return process_set.process_set_id
