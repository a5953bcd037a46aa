"""Point-to-point on the kolo backend (Note [Point-to-point of a process
group]), in every rank of a kolorun job: what each rank receives is
computed from torch's documented semantics and the senders' inputs."""

import torch
import torch.distributed as dist


def payload(src, dst, tag=0, n=5):
    return torch.arange(n, dtype=torch.float64) + 1000 * src + 10 * dst + tag


def test_ring_of_blocking_and_async_sends(rank, size):
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(5, dtype=torch.float64)
    if rank % 2 == 0:  # blocking on half the ranks, in an order that cannot
        dist.send(payload(rank, nxt), nxt)  # deadlock (sends are buffered)
        dist.recv(got, prev)
    else:
        req = dist.irecv(got, prev)
        dist.isend(payload(rank, nxt), nxt).wait()
        req.wait()
    assert torch.equal(got, payload(prev, rank))


def test_tags_keep_messages_apart_and_in_order(rank, size):
    if rank == 0:
        # Posted in this order, received in the other: a send completes when
        # its recv is posted (a rendezvous, as gloo's), so these are isends.
        reqs = [dist.isend(payload(0, 1, tag) + k, 1, tag=tag)
                for tag in (3, 2) for k in range(2)]
        for req in reqs:
            req.wait()
    elif rank == 1:
        for tag in (2, 3):
            for k in range(2):
                got = torch.empty(5, dtype=torch.float64)
                dist.recv(got, 0, tag=tag)
                assert torch.equal(got, payload(0, 1, tag) + k), (tag, k)
    dist.barrier()


def test_recv_from_any_source_names_the_sender(rank, size):
    if rank == 0:
        seen = {}
        for _ in range(size - 1):
            got = torch.empty(5, dtype=torch.float64)
            src = dist.recv(got, tag=4)
            seen[src] = got
        assert sorted(seen) == list(range(1, size))
        for src, got in seen.items():
            assert torch.equal(got, payload(src, 0, 4))
    else:
        dist.send(payload(rank, 0, 4), 0, tag=4)


def test_batch_isend_irecv_and_object_lists(rank, size):
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(2, 3)
    ops = [dist.P2POp(dist.isend, torch.full((2, 3), float(rank)), nxt),
           dist.P2POp(dist.irecv, got, prev)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    assert torch.equal(got, torch.full((2, 3), float(prev)))
    objects = [None, None]
    if not hasattr(dist, "send_object_list"):
        return  # torch 1.13 has no object point-to-point
    if rank == 0:
        dist.send_object_list([{"step": 7}, "text"], dst=size - 1)
    elif rank == size - 1:
        dist.recv_object_list(objects, src=0)
        assert objects == [{"step": 7}, "text"]
    dist.barrier()


def test_non_contiguous_tensors_and_dtypes(rank, size):
    for dtype in (torch.int64, torch.bfloat16, torch.uint8):
        sent = (torch.arange(12).reshape(3, 4) % 100).to(dtype)
        if rank == 0:
            dist.send(sent.t(), 1)  # non-contiguous
        elif rank == 1:
            got = torch.empty(3, 4, dtype=dtype).t()  # a non-contiguous view
            dist.recv(got, 0)
            assert torch.equal(got, sent.t())
    dist.barrier()


def test_subgroup_ranks_are_the_group_ranks(rank, size):
    members = list(range(size - 1, -1, -1))[:2]  # the last two, reversed
    group = dist.new_group(sorted(members))
    if rank in members:
        other = members[0] if rank == members[1] else members[1]
        got = torch.empty(5, dtype=torch.float64)
        # torch takes global ranks and hands the backend group ranks.
        req = dist.isend(payload(rank, other), other, group=group)
        dist.recv(got, other, group=group)
        req.wait()
        assert torch.equal(got, payload(other, rank))
    dist.barrier()


def test_bad_peers_are_refused_by_name(rank, size):
    import pytest
    x = torch.ones(2)
    with pytest.raises((RuntimeError, ValueError), match="rank|Rank"):
        dist.send(x, size + 3)
    # torch refuses a send to oneself before the backend sees it.
    with pytest.raises((RuntimeError, ValueError), match="rank"):
        dist.send(x, rank)
    dist.barrier()


def _transport(group=None):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu")) if hasattr(
        pg, "_get_backend") else pg
    return backend._point_to_point_transport()


def test_one_host_takes_shared_memory(rank, size):
    # kolorun's ranks here share one host (Note [Point-to-point of a process
    # group]): the world and a subgroup both take the shared segment.
    assert _transport() == "shared memory", _transport()
    group = dist.new_group([0, size - 1])
    if rank in (0, size - 1):
        assert _transport(group) == "shared memory", _transport(group)
    dist.barrier()


def test_large_messages_out_of_tag_order_and_many_in_flight(rank, size):
    # Larger than a channel's byte ring (1 MiB), received in the other tag
    # order than sent, and more sends in flight than a channel has
    # descriptor slots (64).
    big = [torch.arange(n, dtype=torch.float32) + 1e6 * k
           for k, n in enumerate((3 << 18, (5 << 18) + 7))]
    small = [torch.full((3,), float(i)) for i in range(150)]
    if rank == 0:
        reqs = [dist.isend(big[0], 1, tag=10), dist.isend(big[1], 1, tag=11)]
        reqs += [dist.isend(t, 1, tag=12) for t in small]
        for req in reqs:
            req.wait()
    elif rank == 1:
        got = [torch.empty_like(t) for t in big]
        dist.recv(got[1], 0, tag=11)
        dist.recv(got[0], 0, tag=10)
        assert torch.equal(got[0], big[0]) and torch.equal(got[1], big[1])
        for t in small:
            out = torch.empty(3)
            dist.recv(out, 0, tag=12)
            assert torch.equal(out, t), (out, t)
        empty = torch.empty(0)
        dist.recv(empty, 0, tag=13)
    if rank == 0:
        dist.send(torch.empty(0), 1, tag=13)  # an empty message arrives too
    dist.barrier()


def test_a_recv_of_the_wrong_size_fails_naming_both_sizes(rank, size):
    import pytest
    if rank == 0:
        dist.send(torch.ones(4), 1, tag=20)  # completes: the bytes are drained
        dist.send(torch.full((2,), 7.0), 1, tag=21)
    elif rank == 1:
        with pytest.raises(RuntimeError, match=(
                r'recv from rank 0 \(tag 20\) in group "world" failed: rank 0 '
                r'sent 16 bytes, the tensor has 12')):
            dist.recv(torch.empty(3), 0, tag=20)
        got = torch.empty(2)
        dist.recv(got, 0, tag=21)  # the pair goes on
        assert torch.equal(got, torch.full((2,), 7.0))
    dist.barrier()


def test_recv_into_a_non_contiguous_tensor_under_inference_mode(rank, size):
    # The copy into the caller's view runs on the caller's thread, under its
    # inference mode (an inference tensor cannot be written outside it).
    sent = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    if rank == 0:
        dist.send(sent.t().contiguous(), 1, tag=30)
    elif rank == 1:
        with torch.inference_mode():
            got = torch.empty(2, 3).t()  # an inference tensor, non-contiguous
            dist.recv(got, 0, tag=30)
            assert torch.equal(got, sent.t())
    dist.barrier()
