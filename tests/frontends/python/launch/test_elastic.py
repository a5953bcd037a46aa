"""Elastic jobs end to end (docs/elastic.md): real workers under kolorun's
elastic mode training tests/frontends/python/elastic/train_elastic.py,
with workers killed, stopped, added and removed while they train."""

import os
import re

import pytest

from conftest import BIN, KOLORUN, PYTHON, REPO, env, run

TRAIN = os.path.join(REPO, "tests", "frontends", "python", "elastic",
                     "train_elastic.py")
N = 96  # the script's dataset size (DATASET)


def _elastic(args, timeout=240, **extra):
    e = env(EPOCHS="1", **{k: str(v) for k, v in extra.items()})
    # A hung worker is found by heartbeats within half the op timeout.
    e.setdefault("KOLO_OP_TIMEOUT", "6")
    return run([KOLORUN] + args + [PYTHON, TRAIN], env=e, timeout=timeout)


def _finals(output):
    return [(int(pid), int(rank), int(size), int(gen), params)
            for pid, rank, size, gen, params in re.findall(
                r"FINAL pid (\d+) rank (\d+) of (\d+) gen (\d+) params (\S+)",
                output)]


def _starts(output):
    return {int(p) for p in re.findall(r"START pid (\d+)", output)}


def _check_trained(r, size, generation=None):
    """Every final worker agrees bitwise, matches the replay of the
    committed steps, and the epoch saw every sample exactly once."""
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    finals = _finals(r.stdout)
    assert len(finals) == size, out
    assert sorted(f[1] for f in finals) == list(range(size)), out
    assert {f[2] for f in finals} == {size}, out
    if generation is not None:
        assert {f[3] for f in finals} == {generation}, out
    assert len({f[4] for f in finals}) == 1, out  # bitwise identical
    replay = float(re.search(r"REPLAY (\S+)", r.stdout).group(1))
    assert replay < 1e-9, out
    unique, total, dataset = map(int, re.search(
        r"COVERAGE (\d+) (\d+) (\d+)", r.stdout).groups())
    assert unique == dataset == N, out
    return finals


def test_a_killed_worker_of_four_leaves_three_training_on():
    r = _elastic(["-np", "4", "--min-np", "2"], KILL_RANK=2, KILL_STEP=3)
    finals = _check_trained(r, 3, generation=1)
    # The survivors are the processes that started: no restart.
    starts = _starts(r.stdout)
    assert len(starts) == 4, r.stdout
    assert {f[0] for f in finals} < starts
    assert "rank 2 (pid" in r.stderr and "SIGKILL" in r.stderr, r.stderr
    assert "generation 1: 3 workers" in r.stderr, r.stderr
    # Steps 0-2 committed at size 4 (48 samples), step 3 lost with the
    # worker, the other 48 samples in 4 steps of 3 ranks: no sample twice.
    unique, total, _ = map(int, re.search(
        r"COVERAGE (\d+) (\d+) (\d+)", r.stdout).groups())
    assert total == unique, r.stdout


def test_two_workers_killed_at_once_leave_one_new_generation():
    r = _elastic(["-np", "4", "--min-np", "2"], KILL_RANK="1,3", KILL_STEP=2)
    _check_trained(r, 2)
    assert r.stderr.count("SIGKILL; the job goes on without it") == 2, r.stderr


def test_losing_rank_0_the_coordinator_keeps_the_job():
    r = _elastic(["-np", "3", "--min-np", "2"], KILL_RANK=0, KILL_STEP=2)
    finals = _check_trained(r, 2, generation=1)
    assert "rank 0 (pid" in r.stderr, r.stderr
    # kolorun's store outlived rank 0: the survivors re-formed through it.
    assert len(_starts(r.stdout)) == 3
    assert len({f[0] for f in finals} & _starts(r.stdout)) == 2


def test_a_hung_worker_is_found_by_heartbeats_and_removed():
    r = _elastic(["-np", "3", "--min-np", "2"], STOP_RANK=1, STOP_STEP=2)
    _check_trained(r, 2, generation=1)
    assert re.search(r"rank 1 \(pid \d+\) was reported lost by rank \d", r.stderr), \
        r.stderr
    assert "killing it" in r.stderr, r.stderr


def test_fewer_than_min_np_ends_the_job_naming_what_failed():
    r = _elastic(["-np", "2", "--min-np", "2"], KILL_RANK=1, KILL_STEP=1)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "only 1 worker left, fewer than --min-np 2" in r.stderr, r.stderr
    assert "rank 1 (pid" in r.stderr, r.stderr


def test_the_reset_limit_ends_the_job():
    r = _elastic(["-np", "3", "--min-np", "1", "--reset-limit", "0"],
                 KILL_RANK=2, KILL_STEP=1)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "(--reset-limit 0)" in r.stderr, r.stderr
    assert "rank 2 (pid" in r.stderr, r.stderr


def _discovery(tmp_path, hosts):
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(hosts)
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % hosts_file)
    script.chmod(0o755)
    return str(script), str(hosts_file)


def test_a_slot_added_by_the_discovery_script_gets_a_worker(tmp_path):
    script, hosts = _discovery(tmp_path, "localhost:2\n")
    r = _elastic(["-np", "2", "--min-np", "1", "--max-np", "3",
                  "--host-discovery-script", script,
                  "--discovery-interval", "0.2"],
                 HOSTS_FILE=hosts, GROW_AT_STEP=2, GROW_TO=3,
                 STEP_DELAY="0.1")
    finals = _check_trained(r, 3)
    assert "generation 1: 3 workers (1 new)" in r.stderr, r.stderr
    starts = _starts(r.stdout)
    assert len(starts) == 3, r.stdout
    assert {f[0] for f in finals} == starts


def test_a_host_giving_up_slots_lets_its_workers_leave(tmp_path):
    script, hosts = _discovery(tmp_path, "localhost:3\n")
    r = _elastic(["-np", "3", "--min-np", "1",
                  "--host-discovery-script", script,
                  "--discovery-interval", "0.2"],
                 HOSTS_FILE=hosts, SHRINK_AT_STEP=2, SHRINK_TO=2,
                 STEP_DELAY="0.1")
    finals = _check_trained(r, 2)
    assert "generation 1: 2 workers" in r.stderr, r.stderr
    # The removed worker left on its own (exit 0): no failure reported.
    assert "goes on without it" not in r.stderr, r.stderr


def test_a_host_failing_repeatedly_is_blacklisted(tmp_path):
    script, hosts = _discovery(tmp_path, "localhost:3\n")
    # Every worker that starts as rank 2 dies at its first step: the
    # first, then its replacement; then localhost gets no new workers.
    r = _elastic(["-np", "3", "--min-np", "1",
                  "--host-discovery-script", script,
                  "--discovery-interval", "0.2"],
                 HOSTS_FILE=hosts, FAIL_ALWAYS_RANK=2)
    assert "host localhost is blacklisted" in r.stderr, r.stderr
    _check_trained(r, 2)
    assert len(_starts(r.stdout)) == 4, r.stdout


def test_elastic_flags_are_checked():
    r = run([KOLORUN, "-np", "2", "--min-np", "3", "true"], env=env())
    assert r.returncode == 2
    assert "--min-np <= -np <= --max-np" in r.stderr
    r = run([KOLORUN, "-np", "2", "--reset-limit", "x", "true"], env=env())
    assert r.returncode == 2
    assert "--reset-limit expects a non-negative integer" in r.stderr
    r = run([KOLORUN, "-np", "2", "-H", "localhost:2",
             "--host-discovery-script", "/bin/true", "true"], env=env())
    assert r.returncode == 2
    assert "drop -H" in r.stderr


CPP_TRAIN = os.path.join(BIN, "tests", "frontends", "torch",
                         "elastic_train")


def test_the_cpp_api_survives_a_killed_worker():
    e = env(KILL_RANK="1", KILL_STEP="4", KOLO_OP_TIMEOUT="6")
    r = run([KOLORUN, "-np", "3", "--min-np", "2", CPP_TRAIN], env=e,
            timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    finals = _finals(r.stdout)
    assert sorted(f[1] for f in finals) == [0, 1], out
    assert {(f[2], f[3]) for f in finals} == {(2, 1)}, out
    assert len({f[4] for f in finals}) == 1, out
    assert float(re.search(r"REPLAY (\S+)", r.stdout).group(1)) < 1e-9, out
    # The C++ ElasticSampler: every sample of the epoch committed once.
    assert "COVERAGE 96 96" in r.stdout, out
    assert "rank 1 (pid" in r.stderr and "generation 1: 2 workers" in r.stderr


TORCHRUN_WORKER = """
import os
import torch
import kolo.torch as hvd

restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
hvd.init()
x = hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum, name="x")
if restart == 0 and hvd.rank() == 1:
    os._exit(1)  # fails the worker group: torchrun restarts it
y = hvd.allreduce(x, op=hvd.Sum, name="y")
print("RESULT restart %d rank %d of %d: %s" % (restart, hvd.rank(),
                                                hvd.size(), y.tolist()),
      flush=True)
hvd.shutdown()
"""


def test_a_restarted_torchrun_worker_group_reinitialises_kolo(script):
    from conftest import free_port as _free_port
    path = script(TORCHRUN_WORKER)
    r = run([PYTHON, "-m", "torch.distributed.run", "--nnodes", "1:2",
             "--nproc_per_node", "2", "--max_restarts", "1",
             "--rdzv_backend", "c10d",
             "--rdzv_endpoint", "127.0.0.1:%d" % _free_port(),
             "--rdzv_conf", "last_call_timeout=1",
             "--redirects", "1", "--tee", "1", "--log_dir",
             os.path.join(os.path.dirname(path), "logs"), path],
            env=env(KOLO_SECRET="torchrun-test-secret-0123456789",
                    KOLO_RENDEZVOUS_PORT=str(_free_port())),
            timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    # The second attempt: new processes, kolo joined afresh on both.
    for rank in (0, 1):
        assert "RESULT restart 1 rank %d of 2: [6.0, 6.0, 6.0]" % rank in \
            r.stdout, out
    assert "RESULT restart 0" not in r.stdout, out
