"""start_timeline/stop_timeline: a Chrome trace with Horovod's activity
names, written by rank 0."""

import json
import os

import torch

import kolo.torch as hvd


def test_timeline_has_horovods_activity_names(rank, tmp_shared):
    path = os.path.join(tmp_shared, "timeline.json")
    hvd.start_timeline(path, mark_cycles=True)
    for i in range(3):
        hvd.allreduce(torch.ones(100), name="tl.grad.%d" % i)
    hvd.broadcast(torch.ones(4), root_rank=0, name="tl.bcast")
    hvd.stop_timeline()
    hvd.barrier()
    if rank != 0:
        return
    with open(path) as f:
        events = json.load(f)
    names = {e.get("name") for e in events}
    for expected in ("NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE",
                     "NEGOTIATE_BROADCAST", "BROADCAST", "CYCLE_START"):
        assert expected in names, (expected, sorted(n for n in names if n))
