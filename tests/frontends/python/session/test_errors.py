"""Errors: bad arguments raise ValueError/TypeError before anything is
submitted; the runtime's errors raise KoloInternalError (Horovod's
HorovodInternalError) carrying its message, on every rank."""

import pytest
import torch

import kolo.torch as hvd


def test_mismatched_shapes_name_every_rank(rank, size):
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.allreduce(torch.ones(rank + 1), name="err.shape")
    message = str(info.value)
    assert 'allreduce "err.shape": shape mismatch' in message
    for r in range(size):
        assert "[%d]" % (r + 1) in message
    assert info.value.code == "INVALID_ARGUMENT"
    # The job goes on.
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="err.after").sum() == 2 * size


def test_mismatched_dtypes_and_roots(rank):
    with pytest.raises(hvd.KoloInternalError, match="dtype mismatch"):
        dtype = torch.float32 if rank == 0 else torch.float64
        hvd.allreduce(torch.ones(2, dtype=dtype), name="err.dtype")
    with pytest.raises(hvd.KoloInternalError, match="root mismatch"):
        hvd.broadcast(torch.ones(2), root_rank=rank, name="err.root")


def test_a_name_submitted_twice_fails_at_once(rank):
    # In flight on rank 0 until the others submit it, after the broadcast.
    if rank == 0:
        h = hvd.allreduce_async(torch.ones(3), name="err.twice")
        with pytest.raises(ValueError, match="already in flight"):
            hvd.allreduce_async(torch.ones(3), name="err.twice")
    hvd.broadcast_object(0, 0, name="err.twice.order")
    if rank != 0:
        h = hvd.allreduce_async(torch.ones(3), name="err.twice")
    hvd.synchronize(h)


def test_a_name_in_flight_fails_a_blocking_call_at_once(rank):
    """hvd.allreduce is one blocking call (kolo::Runtime::AllreduceAndWait):
    its submission's errors stay ValueError, raised before it waits."""
    name = "err.twice.blocking"
    if rank == 0:
        # In flight until the other ranks submit it, after the broadcast.
        h = hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name=name)
        with pytest.raises(ValueError, match="already in flight"):
            hvd.allreduce(torch.ones(3), op=hvd.Sum, name=name)
    hvd.broadcast_object(0, 0, name="err.twice.blocking.order")
    if rank == 0:
        got = hvd.synchronize(h)
    else:
        got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name=name)
    assert torch.equal(got, torch.full((3,), float(hvd.size())))


def test_bad_arguments_raise_before_anything_is_submitted():
    with pytest.raises(TypeError, match="complex64 is not supported"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="unknown reduction op"):
        hvd.allreduce(torch.ones(2), op=17)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    with pytest.raises(TypeError, match="root_rank must be an int"):
        hvd.broadcast(torch.ones(2), root_rank="0")
    with pytest.raises(ValueError, match="sparse"):
        hvd.allreduce(torch.eye(2).to_sparse())
    with pytest.raises(TypeError, match="torch.Tensor"):
        hvd.allreduce([1, 2])
    with pytest.raises(ValueError, match="scalar"):
        hvd.allgather(torch.tensor(1.0))
    with pytest.raises(ValueError, match="Sum and hvd.Average"):
        hvd.reducescatter(torch.ones(4), op=hvd.Max)
    with pytest.raises(TypeError, match="synchronize"):
        hvd.synchronize(42)
    with pytest.raises(ValueError, match="meta"):
        hvd.allreduce(torch.ones(2, device="meta"))
    # Nothing was submitted: the job is in step.
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="err.clean").item() == hvd.size()


def test_allreduces_refuse_in_horovods_terms():
    """The allreduces' common path (a named plain tensor) leaves the tensor's
    checks to the C++ frontend; what it refuses still raises Horovod's
    exception with the Python layer's message (matched on words only it
    says), and nothing is submitted."""
    for f in (hvd.allreduce_async, hvd.allreduce_async_, hvd.allreduce_,
              hvd.allreduce):
        for name in ("err.refused", None):
            with pytest.raises(TypeError, match="complex64 is not supported"):
                f(torch.ones(2, dtype=torch.complex64), name=name)
            with pytest.raises(ValueError, match="sparse_allreduce_async"):
                f(torch.eye(2).to_sparse(), name=name)
            with pytest.raises(ValueError, match="^allreduce_?: tensors on meta"):
                f(torch.ones(2, device="meta"), name=name)
        with pytest.raises(TypeError, match="name must be a str"):
            f(torch.ones(2), name=7)
    # A name in flight: the runtime's refusal, as it is. Rank 0's first
    # submission stays in flight until the others submit it, after the
    # broadcast (else it could complete before the second call).
    if hvd.rank() == 0:
        h = hvd.allreduce_async(torch.ones(3), op=hvd.Sum,
                                name="err.async.twice")
        with pytest.raises(ValueError, match="already in flight"):
            hvd.allreduce_async_(torch.ones(3), op=hvd.Sum,
                                 name="err.async.twice")
    hvd.broadcast_object(0, 0, name="err.async.twice.order")
    if hvd.rank() != 0:
        h = hvd.allreduce_async(torch.ones(3), op=hvd.Sum,
                                name="err.async.twice")
    assert torch.equal(hvd.synchronize(h), torch.full((3,), float(hvd.size())))
    # Nothing else was submitted, and no generated name was used up by a
    # refusal: the job is in step, unnamed calls included.
    out = hvd.synchronize(hvd.allreduce_async(torch.ones(1), op=hvd.Sum))
    assert out.item() == hvd.size()


def test_splits_that_do_not_add_up(rank, size):
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(torch.ones(size * 2), splits=[1] * (size + 1))
