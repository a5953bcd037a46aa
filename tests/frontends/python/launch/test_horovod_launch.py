"""Horovod behaviours that need a job of their own: init() after
shutdown() in one process, ten times in a row, under kolorun, mpirun and
torchrun (also after a collective failed, and with the duplicate-rank
check still catching two processes), and a refusal that only one rank
meets failing on every rank at once."""

from conftest import KOLORUN, PYTHON, env, run, run_mpirun, run_torchrun

CYCLES = """
import sys
import torch
import kolo.torch as hvd

for cycle in range(10):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    got = hvd.allreduce(torch.full((3,), float(rank + 1)), op=hvd.Sum,
                        name="cycle")
    assert got.tolist() == [float(sum(range(1, size + 1)))] * 3, got
    assert hvd.broadcast_object(cycle * 10 + rank, root_rank=size - 1) == \\
        cycle * 10 + size - 1
    if cycle % 3 == 1:
        # A collective that fails (a shape mismatch): the next init works.
        try:
            hvd.allreduce(torch.ones(rank + 1), name="mismatch")
            sys.exit("rank %d: the mismatch did not fail" % rank)
        except hvd.HorovodInternalError as e:
            assert "shape mismatch" in str(e), e
    hvd.barrier()
    hvd.shutdown()
    assert not hvd.is_initialized()
print("CYCLES rank %d done" % rank, flush=True)
"""


def _check_cycles(r, size=2):
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for rank in range(size):
        assert "CYCLES rank %d done" % rank in out, out


def test_init_after_shutdown_under_kolorun(script):
    _check_cycles(run([KOLORUN, "-np", "2", PYTHON, script(CYCLES)],
                      env=env(), timeout=240))


def test_init_after_shutdown_under_kolorun_three_ranks(script):
    _check_cycles(run([KOLORUN, "-np", "3", PYTHON, script(CYCLES)],
                      env=env(), timeout=240), size=3)


def test_init_after_shutdown_under_mpirun(script):
    _check_cycles(run_mpirun(script(CYCLES),
                             "mpirun-cycles-secret-0123456789", timeout=240))


def test_init_after_shutdown_under_torchrun(script):
    _check_cycles(run_torchrun(script(CYCLES),
                               "torchrun-cycles-secret-0123456789",
                               timeout=240))


TWO_CLAIMS = """
import os
import kolo.torch as hvd

if os.environ["KOLO_RANK"] == "1":
    os.environ["KOLO_RANK"] = "0"   # a wrong launch: two workers of rank 0
    os.environ["KOLO_LOCAL_RANK"] = "0"
for cycle in range(2):
    hvd.init()
    hvd.shutdown()
print("INIT pid %d done" % os.getpid(), flush=True)
"""


def test_two_processes_claiming_one_rank_still_fail(script):
    """The duplicate-rank check still catches two processes (the claims of
    one process's earlier inits are no obstacle: the cycle tests)."""
    r = run([KOLORUN, "-np", "2", PYTHON, script(TWO_CLAIMS)],
            env=env(KOLO_START_TIMEOUT="10"), timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "rank 0 is claimed by two workers" in out, out
    assert "INIT pid" not in out, out


ONE_RANK_REFUSES = """
import time
import torch
import kolo.torch as hvd

hvd.init()
rank = hvd.rank()
t = torch.ones(3, dtype=torch.int32) if rank == 0 else torch.ones(3)
start = time.monotonic()
try:
    hvd.allreduce(t, name="mixed")  # default op: Average
    print("MIXED rank %d: no error" % rank, flush=True)
except RuntimeError as e:
    print("MIXED rank %d failed after %.3f s (%s): %s" % (
        rank, time.monotonic() - start, type(e).__name__, e), flush=True)
hvd.shutdown()
"""


def test_mixed_dtypes_fail_on_both_ranks_within_a_second(script):
    """An int tensor on rank 0, a float on rank 1, default op, under the
    default op timeout (600 s): both ranks fail at once with negotiation's
    error, rank 0 included (it used to refuse locally and leave rank 1
    waiting for the timeout)."""
    r = run([KOLORUN, "-np", "2", PYTHON, script(ONE_RANK_REFUSES)],
            env=env(), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        line = next((l for l in r.stdout.splitlines()
                     if "MIXED rank %d" % rank in l), None)
        assert line and "failed after" in line, r.stdout
        assert "KoloInternalError" in line and "dtype mismatch" in line, line
        seconds = float(line.split("failed after ")[1].split(" s")[0])
        print(line)
        assert seconds < 1.0, line
