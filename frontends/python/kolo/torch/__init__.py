"""kolo.torch: Horovod's PyTorch API (horovod.torch) on kolo's runtime.

    import kolo.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Run under kolorun (``kolorun -np 2 python3 train.py``), mpirun, Slurm or
torchrun. docs/python.md documents every function and what differs from
Horovod. Horovod's HOROVOD_* settings that kolo shares are read as aliases
of the KOLO_* ones (docs/configuration.md).
"""

import torch  # noqa: F401  (loads libtorch before the extension)

from kolo import _build


def _check_torch():
    """One line naming both torches where this kolo was built for another
    (a wheel installed with pip's check bypassed), and what the extension
    missed where it cannot load."""
    built = _build.TORCH_VERSION
    running = torch.__version__.split("+")[0]
    if built.split(".")[:2] != running.split(".")[:2]:
        raise ImportError(
            "kolo was built for torch %s but this Python has torch %s (%s): "
            "install the kolo wheel made for torch %s, or build kolo against "
            "this torch (pip install --no-build-isolation <checkout>)" %
            (built, torch.__version__, torch.__file__,
             ".".join(running.split(".")[:2])))
    try:
        from kolo import _C  # noqa: F401
    except ImportError as e:
        if "libnccl" in str(e) or "libcudart" in str(e):
            raise ImportError(
                "kolo uses the NCCL and CUDA runtime of PyPI's torch (the "
                "nvidia-nccl and nvidia-cuda-runtime wheels torch %s brings), "
                "and this Python has none: %s" % (torch.__version__, e)) from e
        raise


_check_torch()

from kolo.torch.compression import Compression
from kolo.torch.functions import (allgather_object, broadcast_object,
                                  broadcast_optimizer_state,
                                  broadcast_parameters)
from kolo.torch.mpi_ops import (
    Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt,
    KoloInternalError, Max, Min, ProcessSet, Product, Sum, add_process_set,
    allgather, allgather_async, allreduce, allreduce_, allreduce_async,
    allreduce_async_, alltoall, alltoall_async, barrier, broadcast,
    broadcast_, broadcast_async, broadcast_async_, ccl_built, cross_rank,
    cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
    global_process_set, grouped_allgather, grouped_allgather_async,
    grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
    grouped_allreduce_async_, grouped_reducescatter,
    grouped_reducescatter_async, init, is_homogeneous, is_initialized, join,
    local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
    nccl_built, poll, rank, reducescatter, reducescatter_async,
    remove_process_set, rocm_built, shutdown, size, sparse_allreduce_async,
    start_timeline, stop_timeline, synchronize)
from kolo.torch.optimizer import DistributedOptimizer
from kolo.torch.sync_batch_norm import SyncBatchNorm

# hvd.elastic.run, TorchState, ElasticSampler (docs/elastic.md).
from kolo.torch import elastic  # noqa: E402,F401

# Registers the torch.distributed backend "kolo" (docs/torch_distributed.md).
from kolo.torch import distributed  # noqa: E402,F401
