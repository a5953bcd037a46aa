"""Launch tests of the torch.distributed backend "kolo": a DDP script that
only changes the backend string, under kolorun (no argument to
init_process_group) and under torchrun; a rank killed mid-training ends the
others with an error naming it, in seconds, where gloo waits for its
timeout (30 minutes by default)."""

import re

from conftest import KOLORUN, PYTHON, env, run
from conftest import free_port as _free_port

DDP_SCRIPT = """
import os, sys, signal
import torch
import torch.distributed as dist
import kolo.torch  # noqa: F401  (registers "kolo")

dist.init_process_group(sys.argv[1])
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 2))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(rank)
die_at = int(os.environ.get("DIE_AT", "-1"))
for step in range(int(os.environ.get("STEPS", "5"))):
    if step == die_at and rank == int(os.environ["DIE_RANK"]):
        print("DYING", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 2, generator=gen)
    opt.zero_grad()
    ((ddp(x) - y) ** 2).mean().backward()
    opt.step()
total = sum(p.double().sum().item() for p in model.parameters())
print("PARAMS rank %d of %d backend %s: %.17g" % (
    rank, dist.get_world_size(), dist.get_backend(), total), flush=True)
dist.destroy_process_group()
if sys.argv[1] == "gloo":
    # The reference run: torch 2.15's gloo backend aborts now and then in
    # interpreter teardown ("terminate called without an active exception",
    # 3 of 30 runs under load with kolo not imported); kolo's own run exits
    # normally.
    os._exit(0)
"""


def _params(output):
    return re.findall(r"PARAMS rank (\d) of (\d) backend (\w+): (\S+)", output)


def test_ddp_under_kolorun_with_the_backend_string_only(script):
    path = script(DDP_SCRIPT)
    results = {}
    for backend in ("kolo", "gloo"):
        r = run([KOLORUN, "-np", "2", PYTHON, path, backend], env=env(),
                timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        found = _params(r.stdout)
        assert sorted(f[0] for f in found) == ["0", "1"], r.stdout
        assert {f[2] for f in found} == {backend}
        results[backend] = {f[3] for f in found}
    # Both replicas agree, and kolo trained exactly as gloo did.
    assert len(results["kolo"]) == 1, results
    assert results["kolo"] == results["gloo"], results


def test_ddp_under_torchrun(script, tmp_path):
    path = script(DDP_SCRIPT)
    r = run([PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "2",
             "--redirects", "1", "--tee", "1", "--log_dir",
             str(tmp_path / "logs"), "--master_port", str(_free_port()), path,
             "kolo"],
            env=env(), timeout=120)  # no KOLO_* variable: torch's store
    assert r.returncode == 0, r.stdout + r.stderr
    found = _params(r.stdout)
    assert sorted(f[0] for f in found) == ["0", "1"], r.stdout
    assert len({f[3] for f in found}) == 1


def _stamp(line):
    """Seconds of kolorun's --prefix-timestamp ("2026-05-01T12:00:00.123Z")."""
    clock = line.split(" ", 1)[0].split("T")[1].rstrip("Z")
    h, m, sec = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(sec)


def test_a_killed_rank_is_named_within_the_promised_bound(script):
    path = script(DDP_SCRIPT)
    r = run([KOLORUN, "--prefix-timestamp", "-np", "3", PYTHON, path, "kolo"],
            env=env(DIE_AT="2", DIE_RANK="2", STEPS="1000"), timeout=120)
    output = r.stdout + r.stderr
    assert r.returncode != 0
    assert re.search(r"kolorun: rank 2 \(pid \d+\) was killed by signal "
                     r"SIGKILL", r.stderr), r.stderr
    dying = [l for l in output.splitlines() if "[2] DYING" in l]
    lost = [l for l in output.splitlines()
            if re.search(r"\[[01]\] .*allreduce \"c10d/world/\d+\" failed: "
                         r"rank 2 lost", l)]
    assert dying and len(lost) == 2, output
    # RELIABILITY.md: a dead rank is reported within 2 s (gloo waits for
    # its timeout, 30 minutes by default). Both clocks are kolorun's.
    for line in lost:
        assert _stamp(line) - _stamp(dying[0]) < 2.0, (dying[0], line)
