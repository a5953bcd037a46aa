"""Note [Collectives named by sequence]: what gloo would hang on or corrupt
silently is an error on every rank, naming the collective's position and
each rank's value. Each test uses a group of its own, so that the default
group's sequence stays aligned for the other tests."""

import pytest
import torch
import torch.distributed as dist

from kolo.torch import KoloInternalError


def fresh_group():
    return dist.new_group(list(range(dist.get_world_size())))


def test_shape_mismatch_names_the_position_and_the_ranks(rank, size):
    group = fresh_group()
    dist.all_reduce(torch.ones(2), group=group)  # position 0 matches
    x = torch.ones(3 if rank == 0 else 4)
    with pytest.raises(KoloInternalError) as error:
        dist.all_reduce(x, group=group)
    message = str(error.value)
    assert "/1\": shape mismatch" in message, message
    assert "rank 0 has [3]" in message, message
    others = "rank 1 has [4]" if size == 2 else "ranks 1, 2 have [4]"
    assert others in message, message
    # The job goes on: the next position matches on every rank.
    y = torch.ones(2)
    dist.all_reduce(y, group=group)
    assert torch.equal(y, torch.full((2,), float(size)))


def test_a_rank_skipping_a_collective_is_a_mismatch_not_a_hang(rank, size):
    group = fresh_group()
    with pytest.raises(KoloInternalError) as error:
        if rank == size - 1:
            dist.all_reduce(torch.ones(5), group=group)  # skipped the broadcast
        else:
            dist.broadcast(torch.ones(5), src=0, group=group)
    message = str(error.value)
    assert "/0\": collective mismatch" in message, message
    assert "broadcast" in message and "allreduce" in message, message


def test_dtype_and_op_and_root_mismatches(rank):
    group = fresh_group()
    cases = [
        (lambda: dist.all_reduce(
            torch.ones(2, dtype=torch.float32 if rank == 0 else torch.float64),
            group=group), "dtype mismatch"),
        (lambda: dist.all_reduce(
            torch.ones(2), op=dist.ReduceOp.SUM if rank == 0 else
            dist.ReduceOp.MAX, group=group), "reduce op mismatch"),
        (lambda: dist.broadcast(torch.ones(2), src=rank, group=group),
         "root mismatch"),
    ]
    for position, (call, what) in enumerate(cases):
        with pytest.raises(KoloInternalError) as error:
            call()
        message = str(error.value)
        assert "/%d\": %s" % (position, what) in message, message


def test_a_groups_timeout_ends_the_wait_for_a_rank_that_never_comes(rank,
                                                                     size):
    """new_group(timeout=...) (as init_process_group's) is the timeout of
    the group's collectives, as in gloo: one that a rank never issues fails
    after it, naming the rank and which timeout passed; KOLO_OP_TIMEOUT
    (600 s here) stays the default group's."""
    from datetime import timedelta
    group = dist.new_group(list(range(size)),
                           timeout=timedelta(milliseconds=500))
    if rank != size - 1:
        with pytest.raises(KoloInternalError) as error:
            dist.all_reduce(torch.ones(3), group=group)
        message = str(error.value)
        assert "timed out after 500 ms (the request's timeout)" in message, \
            message
        assert "waiting for rank %d to submit it" % (size - 1) in message, \
            message
    # Every rank meets again on the default group.
    x = torch.ones(1)
    dist.all_reduce(x)
    assert x.item() == size
