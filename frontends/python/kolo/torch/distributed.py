"""kolo as a torch.distributed backend (docs/torch_distributed.md).

Importing ``kolo.torch`` (or this module) registers the backend "kolo":

    import kolo.torch  # noqa: F401
    import torch.distributed as dist
    dist.init_process_group("kolo")      # under kolorun or torchrun
    model = torch.nn.parallel.DistributedDataParallel(model)

Every collective of a "kolo" group is one of kolo's, negotiated by name:
collectives are named by the group and their position in its sequence
(Note [Collectives named by sequence] in frontends/python/src/process_group.h),
so a rank that issues a different collective, shape, dtype, op or root at
the same position fails on every rank with an error naming the collective's
position and each rank's value. The backend and ``kolo.torch.init()`` share
one runtime: the job kolo joins is the job torch's ranks describe.
"""

import os

import torch
import torch.distributed as dist

from kolo import _C
from kolo.torch import mpi_ops

BACKEND = "kolo"
_TORCH_MAJOR = int(torch.__version__.split(".")[0])


def _fill_environment():
    """torch's default init_method (env://) reads RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT; kolorun exports them. Under other
    launchers that set KOLO_RANK/KOLO_SIZE, RANK, WORLD_SIZE, LOCAL_RANK
    and LOCAL_WORLD_SIZE are filled from them here (never overwritten)."""
    for torch_name, kolo_name in (("RANK", "KOLO_RANK"),
                                  ("WORLD_SIZE", "KOLO_SIZE"),
                                  ("LOCAL_RANK", "KOLO_LOCAL_RANK"),
                                  ("LOCAL_WORLD_SIZE", "KOLO_LOCAL_SIZE")):
        if torch_name not in os.environ and kolo_name in os.environ:
            os.environ[torch_name] = os.environ[kolo_name]


def _timeout_ms(backend_options):
    """The group's timeout for kolo's requests: the one given to
    init_process_group or new_group, or 0 (KOLO_OP_TIMEOUT) where torch
    passed its default."""
    timeout = getattr(backend_options, "timeout", None)
    if timeout is None or timeout == dist.constants.default_pg_timeout:
        return 0
    return max(1, int(timeout.total_seconds() * 1000))


def _create_process_group(backend_options, pg_options):
    """torch.distributed's creator of a "kolo" group (extended API): called
    on the group's member ranks only."""
    if pg_options is not None:
        raise ValueError("the kolo backend takes no pg_options")
    if not mpi_ops.is_initialized():
        mpi_ops.init()
    timeout_ms = _timeout_ms(backend_options)
    members = sorted(int(r) for r in backend_options.global_ranks_in_group)
    rank, size = backend_options.group_rank, backend_options.group_size
    if not members:  # the default group: torch's world is kolo's job
        if size != _C.size() or rank != _C.rank():
            raise RuntimeError(
                "torch.distributed's world (rank %d of %d) is not the job "
                "kolo joined (rank %d of %d): start every process with the "
                "same launcher (RANK/WORLD_SIZE and KOLO_RANK/KOLO_SIZE "
                "disagree)" % (rank, size, _C.rank(), _C.size()))
        return _C.ProcessGroupKolo(0, rank, size, "world", timeout_ms)
    if members[rank] != _C.rank() or len(members) != size:
        raise RuntimeError(
            "torch.distributed's group %r (ranks %s) does not hold kolo's "
            "rank %d at position %d" % (backend_options.group_id, members,
                                         _C.rank(), rank))
    # Created by its members alone: torch calls this on members only.
    process_set = _C.add_process_set_of_members(
        members, "c10d/" + backend_options.group_id)
    return _C.ProcessGroupKolo(process_set, rank, size,
                               backend_options.group_id, timeout_ms)


def _register():
    if BACKEND.upper() in dist.Backend._plugins:
        return
    if _TORCH_MAJOR >= 2:
        # A c10d::Backend there: torch builds the ProcessGroup around it,
        # for both device types (a list; a string would be split).
        dist.Backend.register_backend(BACKEND, _create_process_group,
                                      extended_api=True,
                                      devices=["cpu", "cuda"])
    else:
        dist.Backend.register_backend(BACKEND, _create_process_group,
                                      extended_api=True)


_fill_environment()
_register()
