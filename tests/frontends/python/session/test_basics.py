"""init, placement, what the build has."""

import os
import re

import torch

import kolo.torch as hvd


def test_placement_matches_the_launcher(rank, size):
    assert hvd.is_initialized()
    assert size == int(os.environ["KOLO_SIZE"]) >= 2
    assert rank == int(os.environ["KOLO_RANK"])
    # kolorun also exports Horovod's names, as horovodrun does.
    assert int(os.environ["HOROVOD_RANK"]) == rank
    assert int(os.environ["HOROVOD_SIZE"]) == size
    assert hvd.local_size() == int(os.environ["HOROVOD_LOCAL_SIZE"])
    assert hvd.local_rank() == int(os.environ["HOROVOD_LOCAL_RANK"])
    assert hvd.cross_size() == 1 and hvd.cross_rank() == 0
    assert hvd.is_homogeneous()
    ranks = hvd.allgather_object(rank)
    assert ranks == list(range(size))


def test_built_flags_answer_truthfully():
    assert hvd.gloo_built() and hvd.gloo_enabled()
    assert not hvd.mpi_built() and not hvd.mpi_enabled()
    assert not hvd.ccl_built() and not hvd.ddl_built() and not hvd.rocm_built()
    assert isinstance(hvd.cuda_built(), bool)
    # As Horovod: NCCL's version code (2.28.9 is 22809), 0 without NCCL.
    nccl = hvd.nccl_built()
    assert type(nccl) is int and (nccl > 0) == hvd.cuda_built()
    if nccl:
        assert nccl >= 2700  # what scripts compare it with
        header = "/usr/local/cuda/include/nccl.h"  # what kolo was built with
        if os.path.exists(header):
            code = re.search(r"#define NCCL_VERSION_CODE (\d+)",
                             open(header).read())
            assert code and nccl == int(code.group(1))


def test_horovod_import_line_works_unchanged():
    # The names a Horovod script uses, all present.
    for name in ["init", "shutdown", "size", "rank", "local_rank",
                 "allreduce", "allreduce_async", "synchronize", "poll",
                 "DistributedOptimizer", "broadcast_parameters",
                 "broadcast_optimizer_state", "Compression", "Average", "Sum",
                 "Adasum", "join", "barrier", "SyncBatchNorm",
                 "HorovodInternalError", "ProcessSet", "global_process_set",
                 "start_timeline", "stop_timeline", "alltoall",
                 "reducescatter", "grouped_allreduce", "sparse_allreduce_async",
                 "broadcast_object", "allgather_object"]:
        assert hasattr(hvd, name), name
    assert hvd.HorovodInternalError is hvd.KoloInternalError
    assert issubclass(hvd.KoloInternalError, RuntimeError)


def test_barrier_and_reinit_are_harmless():
    hvd.barrier()
    hvd.init()  # Already initialized: nothing happens.
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()
