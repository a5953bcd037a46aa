"""The kolo backend started the ways PyTorch's tutorials start a job, with
no kolo launcher: torch.multiprocessing.spawn with tcp:// and file://, an
explicit TCPStore, a plain python per rank with env://. kolo joins through
the store torch passes (docs/torch_distributed.md, "Rendezvous through
torch's store"). DDP and FSDP2 trained this way match a one-process
reference; TORCH_DISTRIBUTED_DEBUG=DETAIL works on the world and on
subgroups; a rank that never arrives is named."""

import os
import re
import subprocess
import sys

import pytest

from conftest import PYTHON, env, free_port, run

TORCH_2 = subprocess.run(
    [PYTHON, "-c", "import torch; print(torch.__version__)"],
    capture_output=True, text=True).stdout.startswith("2.")

# Rank programs. COMMON starts the group the way argv[1] says.
COMMON = r"""
import datetime, os, sys
import torch
import torch.distributed as dist
import kolo.torch  # noqa: F401  (registers "kolo")

BACKEND = os.environ.get("TEST_BACKEND", "kolo")

def start(rank, world, how, where):
    if how == "store":
        host, port = where.split(":")
        store = dist.TCPStore(host, int(port), world, rank == 0,
                              timeout=datetime.timedelta(seconds=60))
        dist.init_process_group(BACKEND, store=store, rank=rank,
                                world_size=world)
    elif how == "env":
        dist.init_process_group(BACKEND)
    else:
        dist.init_process_group(BACKEND, init_method=where, rank=rank,
                                world_size=world)
"""

TRAIN = COMMON + r"""
import torch.multiprocessing as mp

STEPS, BATCH = 4, 6

def data(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 2, generator=g)

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 2))

def reference(world, divide, bf16_reduce=False):
    # One process, every rank's batch: the mean of the ranks' gradients
    # (AVG), or their sum / divide (a divide factor other than the world
    # size). With a bf16 reduce, each rank's gradient is rounded to bf16
    # first, the sum taken in float and rounded to bf16 once, as kolo
    # reduces 16-bit floats (docs/guide.md).
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(STEPS):
        grads = []
        for r in range(world):
            m.zero_grad()
            x, y = data(step, r)
            ((m(x) - y) ** 2).mean().backward()
            grads.append([p.grad.clone() for p in m.parameters()])
        for i, p in enumerate(m.parameters()):
            if bf16_reduce:
                total = sum(g[i].bfloat16().float() for g in grads)
                p.grad = (total / world).bfloat16().float()
            else:
                p.grad = sum(g[i] for g in grads) / (divide or world)
        opt.step()
    return [p.detach() for p in m.parameters()]

def worker(rank, world, how, where, kind, out):
    start(rank, world, how, where)
    divide = 0.0
    m = model()
    if kind == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(m)
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        policy = MixedPrecisionPolicy(
            reduce_dtype=torch.bfloat16 if kind == "fsdp2-bf16" else None)
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mp_policy=policy)
        net = fully_shard(m, mp_policy=policy)
        if kind == "fsdp2-divide":
            divide = world * 1.5  # not the world size: PREMUL_SUM
            for module in net.modules():  # each fully_shard'ed module's own
                if hasattr(module, "set_gradient_divide_factor"):
                    module.set_gradient_divide_factor(divide)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = data(step, rank)
        opt.zero_grad()
        # FSDP2 reduces sum(g_r) / divide (PREMUL_SUM by 1 / divide) where a
        # divide factor is set, the mean of the g_r (AVG) otherwise.
        ((net(x) - y) ** 2).mean().backward()
        opt.step()
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
              for p in net.parameters()]
    flat = torch.cat([p.reshape(-1) for p in params])
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    replicas_equal = all(torch.equal(every[0], e) for e in every)
    ref = torch.cat([p.reshape(-1) for p in
                     reference(world, divide, kind == "fsdp2-bf16")])
    err = (flat - ref).abs().max().item()
    sys.stdout.write("RESULT rank %d backend %s replicas_equal %s max_err "
                     "%.3g\n" % (rank, dist.get_backend(), replicas_equal, err))
    sys.stdout.flush()
    dist.destroy_process_group()

if __name__ == "__main__":
    how, where, kind, world = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    mp.spawn(worker, args=(world, how, where, kind, None), nprocs=world)
"""


def _results(output):
    return re.findall(r"RESULT rank (\d) backend (\w+) replicas_equal (\w+) "
                      r"max_err (\S+)", output)


def _check_trained(r, world, backend="kolo", exact=False):
    assert r.returncode == 0, r.stdout + r.stderr
    found = _results(r.stdout)
    assert sorted(int(f[0]) for f in found) == list(range(world)), r.stdout
    for _, name, equal, err in found:
        assert name == backend
        assert equal == "True", r.stdout  # bitwise-equal replicas
        # The one-process reference: exactly, where both add the same two
        # numbers (2 ranks, no prescale); else within float32's rounding.
        assert float(err) == 0 if exact else float(err) < 1e-5, r.stdout


@pytest.mark.parametrize("kind", ["ddp", "fsdp2", "fsdp2-bf16",
                                  "fsdp2-divide"])
def test_spawn_tcp_trains_like_one_process(script, kind):
    if kind != "ddp" and not TORCH_2:
        pytest.skip("torch 1.13 has no fully_shard (FSDP2)")
    path = script(TRAIN)
    r = run([PYTHON, path, "init", "tcp://127.0.0.1:%d" % free_port(), kind,
             "2"], env=env(), timeout=180)
    _check_trained(r, 2, exact=kind != "fsdp2-divide")


def test_gloo_in_the_same_fsdp2_tests(script):
    # pytorch#162338: FSDP2's AVG summed on gloo instead of averaging. On
    # the pinned torch gloo averages right in this test; it refuses
    # PREMUL_SUM (a divide factor), which kolo serves.
    if not TORCH_2:
        pytest.skip("torch 1.13 has no fully_shard (FSDP2)")
    path = script(TRAIN)
    for kind in ("fsdp2", "fsdp2-bf16"):
        r = run([PYTHON, path, "init", "tcp://127.0.0.1:%d" % free_port(),
                 kind, "2"], env=env(TEST_BACKEND="gloo"), timeout=180)
        _check_trained(r, 2, backend="gloo", exact=True)
    r = run([PYTHON, path, "init", "tcp://127.0.0.1:%d" % free_port(),
             "fsdp2-divide", "2"], env=env(TEST_BACKEND="gloo"), timeout=180)
    assert r.returncode != 0
    assert "Cannot use ReduceOp.PREMUL_SUM with Gloo" in r.stderr, r.stderr


DTENSOR = COMMON + r"""
import torch.multiprocessing as mp

def worker(rank, world, where):
    start(rank, world, "init", where)
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import (DTensor, Partial, Replicate, Shard,
                                          distribute_tensor)
    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(world * 4 * 6 * world, dtype=torch.float32).reshape(
        world * 4, 6 * world)
    d = distribute_tensor(full, mesh, [Shard(0)])
    total = full * sum(range(1, world + 1))
    partial = DTensor.from_local(full * (rank + 1), mesh, [Partial()])
    checks = {
        "Shard(0)->Replicate": torch.equal(
            d.redistribute(mesh, [Replicate()]).to_local(), full),
        "Shard(0)->Shard(1)": torch.equal(
            d.redistribute(mesh, [Shard(1)]).to_local(),
            full.chunk(world, dim=1)[rank]),
        "Partial->Replicate": torch.equal(
            partial.redistribute(mesh, [Replicate()]).to_local(), total),
        "Partial->Shard(0)": torch.equal(
            partial.redistribute(mesh, [Shard(0)]).to_local(),
            total.chunk(world)[rank]),
    }
    group = dist.group.WORLD
    inputs = [torch.full((2,), float(rank)), torch.full((3, 2), rank + 10.0)]
    gathered = funcol.all_gather_into_tensor_coalesced(inputs, group)
    checks["all_gather_into_tensor_coalesced"] = all(
        torch.equal(g, torch.cat([torch.full_like(x, float(v)) for v in vs]))
        for g, x, vs in zip(gathered, inputs,
                            (range(world), range(10, 10 + world))))
    chunks = [torch.arange(world * 2.0) + 100 * rank,
              torch.arange(world * 3.0).reshape(world, 3) * (rank + 1)]
    scattered = funcol.reduce_scatter_tensor_coalesced(
        chunks, "sum", [0, 0], group)
    want = [sum(torch.arange(world * 2.0) + 100 * r for r in range(world)),
            sum(torch.arange(world * 3.0).reshape(world, 3) * (r + 1)
                for r in range(world))]
    checks["reduce_scatter_tensor_coalesced"] = all(
        torch.equal(s, w.chunk(world)[rank]) for s, w in zip(scattered, want))
    # Rank r sends j + 1 rows to rank j: uneven splits both ways.
    send = torch.cat([torch.full((j + 1, 2), 100.0 * rank + j)
                      for j in range(world)])
    got = funcol.all_to_all_single(send, [rank + 1] * world,
                                   [j + 1 for j in range(world)], group)
    checks["all_to_all_single"] = torch.equal(got, torch.cat(
        [torch.full((rank + 1, 2), 100.0 * r + rank) for r in range(world)]))
    sys.stdout.write("DTENSOR rank %d %s\n" % (
        rank, " ".join("%s=%s" % kv for kv in checks.items())))
    sys.stdout.flush()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[2]), sys.argv[1]), nprocs=int(sys.argv[2]))
"""


@pytest.mark.parametrize("world", [2, 3])
def test_dtensor_redistribution_and_functional_collectives(script, world):
    if not TORCH_2:
        pytest.skip("torch 1.13 has no DTensor")
    path = script(DTENSOR)
    r = run([PYTHON, path, "tcp://127.0.0.1:%d" % free_port(), str(world)],
            env=env(), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = re.findall(r"DTENSOR rank (\d) (.*)", r.stdout)
    assert sorted(int(l[0]) for l in lines) == list(range(world)), r.stdout
    for _, checks in lines:
        assert "=False" not in checks and checks.count("=True") == 7, checks


def test_spawn_file_and_explicit_store_at_three_ranks(script, tmp_path):
    path = script(TRAIN)
    r = run([PYTHON, path, "init", "file://%s" % (tmp_path / "rdv"), "ddp",
             "3"], env=env(), timeout=180)
    _check_trained(r, 3)
    r = run([PYTHON, path, "store", "127.0.0.1:%d" % free_port(), "ddp", "2"],
            env=env(), timeout=180)
    _check_trained(r, 2)


PER_RANK = COMMON + r"""
start(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env", None)
t = torch.full((3,), float(dist.get_rank() + 1))
dist.all_reduce(t)
print("SUM rank %d %s" % (dist.get_rank(), t.tolist()), flush=True)
dist.destroy_process_group()
"""


def _per_rank(path, world, extra=None, ranks=None):
    port = free_port()
    procs = []
    for rank in (range(world) if ranks is None else ranks):
        procs.append(subprocess.Popen(
            [PYTHON, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env(RANK=str(rank), WORLD_SIZE=str(world),
                               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                               **(extra or {}))))
    return [p.communicate(timeout=120) + (p.returncode,) for p in procs]


def test_plain_python_per_rank_with_env(script):
    path = script(PER_RANK)
    for out, err, rc in _per_rank(path, 2):
        assert rc == 0, out + err
        assert "[3.0, 3.0, 3.0]" in out, out + err


def test_secret_required_and_missing_is_refused(script):
    path = script(PER_RANK)
    for out, err, rc in _per_rank(path, 2, {"KOLO_REQUIRE_SECRET": "1"}):
        assert rc != 0
        assert "KOLO_REQUIRE_SECRET=1 and no job secret given" in err, err
    # With the secret given, the same start works.
    for out, err, rc in _per_rank(path, 2, {
            "KOLO_REQUIRE_SECRET": "1",
            "KOLO_SECRET": "store-rendezvous-secret-0123456789"}):
        assert rc == 0, out + err


ABSENT = COMMON + r"""
# Rank 1 joins torch's store and leaves without init_process_group.
rank, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, 3, rank == 0,
                      timeout=datetime.timedelta(seconds=60))
if rank == 1:
    sys.exit(0)
dist.init_process_group("kolo", store=store, rank=rank, world_size=3)
"""


def test_rank_that_never_arrives_is_named(script):
    path = script(ABSENT)
    port = free_port()
    procs = [subprocess.Popen([PYTHON, path, str(rank), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env(KOLO_START_TIMEOUT="2"))
             for rank in range(3)]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    out, err, rc = results[0]
    assert rc != 0
    assert ("rendezvous through torch's store timed out after 2 s "
            "(KOLO_START_TIMEOUT): rank(s) 1 did not reach "
            "init_process_group") in err, err
    out, err, rc = results[2]
    assert rc != 0
    assert "rank 0 did not publish kolo's rendezvous address" in err, err


DETAIL = COMMON + r"""
import torch.multiprocessing as mp

def worker(rank, world, where):
    start(rank, world, "init", where)
    sub = dist.new_group([0, 1])
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(t, group=sub)
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    sub_objs = [None] * 2
    dist.all_gather_object(sub_objs, rank * 10, group=sub)
    seq = dist.distributed_c10d._get_default_group()._get_sequence_number_for_group()
    sys.stdout.write("DETAIL rank %d %s %s %s seq %d\n" % (
        rank, t.tolist(), [o["rank"] for o in objs], sub_objs, seq))
    sys.stdout.flush()
    # A mismatch is caught by torch's own DETAIL check or by kolo's.
    try:
        dist.all_reduce(torch.ones(3 if rank == 0 else 5))
    except RuntimeError as e:
        sys.stdout.write("MISMATCH rank %d %s\n" % (rank, str(e).splitlines()[0]))
        sys.stdout.flush()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2)
"""


def test_sequence_numbers_with_torch_distributed_debug_detail(script):
    if not TORCH_2:
        pytest.skip("torch 1.13 has sequence numbers through ProcessGroup "
                    "(tested by the distributed session)")
    path = script(DETAIL)
    r = run([PYTHON, path, "tcp://127.0.0.1:%d" % free_port()],
            env=env(TORCH_DISTRIBUTED_DEBUG="DETAIL"), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = re.findall(r"DETAIL rank (\d) (.*)", r.stdout)
    assert sorted(l[0] for l in lines) == ["0", "1"], r.stdout + r.stderr
    for rank, rest in lines:
        assert rest.startswith("[4.0, 4.0, 4.0, 4.0] [0, 1] [0, 10] seq "), rest
    seqs = {rest.rsplit(" ", 1)[1] for _, rest in lines}
    assert len(seqs) == 1 and int(seqs.pop()) > 0, lines
    mismatches = re.findall(r"MISMATCH rank (\d) (.*)", r.stdout)
    assert sorted(m[0] for m in mismatches) == ["0", "1"], r.stdout + r.stderr
