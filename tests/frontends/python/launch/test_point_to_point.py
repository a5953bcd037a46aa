"""Point-to-point on the kolo backend with kolo's promises (Note
[Point-to-point of a process group]): a dead peer is named within
RELIABILITY.md's 2 s, a peer that never sends is named with the tag by the
group's timeout, and a rank blocked in recv takes no CPU. Real processes, a
python per rank, started with env:// and no launcher. The collective and
send/recv semantics themselves are tested by PyTorch's own suite
(tests/frontends/python/torch_suite) and by test_torch_store.py."""

import re
import subprocess

from conftest import PYTHON, env, free_port

WORKER = r"""
import datetime, os, signal, sys, time
import torch
import torch.distributed as dist
import kolo.torch  # noqa: F401

case = sys.argv[1]
dist.init_process_group("kolo", timeout=datetime.timedelta(
    seconds=float(os.environ.get("GROUP_TIMEOUT", "600"))))
rank = dist.get_rank()
# Every rank connected: a round trip first.
t = torch.zeros(3)
if rank == 0:
    dist.send(torch.ones(3), 1, tag=1)
else:
    dist.recv(t, 0, tag=1)
    assert torch.equal(t, torch.ones(3))
dist.barrier()
if case == "dies":
    if rank == 0:
        sys.stdout.write("KILLED_AT %.6f\n" % time.clock_gettime(time.CLOCK_MONOTONIC))
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.recv(t, 0, tag=5)
    except RuntimeError as e:
        sys.stdout.write("ERROR_AT %.6f %s\n" % (
            time.clock_gettime(time.CLOCK_MONOTONIC), str(e).splitlines()[0]))
        sys.stdout.flush()
        os._exit(0)
elif case == "silent":
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        cpu = time.process_time()
        start = time.monotonic()
        try:
            dist.recv(t, 0, tag=9)
        except RuntimeError as e:
            sys.stdout.write("WAITED %.3f CPU %.3f %s\n" % (
                time.monotonic() - start, time.process_time() - cpu,
                str(e).splitlines()[0]))
            sys.stdout.flush()
        store.set("done", "1")
    else:
        store.get("done")  # sends nothing; stays until rank 1 is done
    os._exit(0)
"""


def _start(path, case, world=2, **extra):
    port = free_port()
    return [subprocess.Popen(
        [PYTHON, path, case], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env(RANK=str(r), WORLD_SIZE=str(world),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                           **extra))
        for r in range(world)]


def test_a_dead_peer_is_named_within_two_seconds(script):
    path = script(WORKER)
    procs = _start(path, "dies")
    out0, err0 = procs[0].communicate(timeout=120)
    out1, err1 = procs[1].communicate(timeout=120)
    killed = re.search(r"KILLED_AT (\S+)", out0)
    error = re.search(r"ERROR_AT (\S+) (.*)", out1)
    assert killed and error, out0 + err0 + out1 + err1
    assert ('recv from rank 0 (tag 5) in group "world" failed: rank 0 lost'
            in error.group(2)), error.group(2)
    assert float(error.group(1)) - float(killed.group(1)) < 2.0, (
        killed.group(0), error.group(0))


def test_a_silent_peer_is_named_with_the_tag_and_the_waiter_takes_no_cpu(
        script):
    path = script(WORKER)
    procs = _start(path, "silent", GROUP_TIMEOUT="2")
    results = [p.communicate(timeout=120) for p in procs]
    found = re.search(r"WAITED (\S+) CPU (\S+) (.*)", results[1][0])
    assert found, results
    waited, cpu, message = float(found.group(1)), float(found.group(2)), \
        found.group(3)
    assert ('recv from rank 0 (tag 9) in group "world" timed out after '
            '2000 ms') in message, message
    assert waited >= 1.9, waited
    # Blocked, not spinning: the whole process (kolo's threads included)
    # used a small part of one core while it waited.
    assert cpu < 0.25 * waited, (cpu, waited)
