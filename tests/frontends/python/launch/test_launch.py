"""kolo.torch launched the ways users launch it."""

import os
import re

import pytest

from conftest import (BIN, KOLORUN, PYTHON, REPO, env, run, run_mpirun,
                      run_torchrun)

ALLREDUCE = """
import torch
import kolo.torch as hvd
hvd.init()
out = hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum)
print("RESULT rank %d of %d: %s" % (hvd.rank(), hvd.size(), out.tolist()))
"""


# What a pip-installed kolo must train, outside the tree: a Horovod-style
# loop, DDP, ZeroRedundancyOptimizer and (torch 2.x) FSDP on the CPU, on the
# "kolo" backend; each leaves the replicas identical.
TRAIN_FOUR_WAYS = """
import warnings
import torch
import torch.distributed as dist
import kolo.torch as hvd
from torch.distributed.optim import ZeroRedundancyOptimizer

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 2))

def train(way, net, opt, params):
    gen = torch.Generator().manual_seed(hvd.rank())
    for _ in range(3):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 2, generator=gen)
        opt.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in params()])
    every = hvd.allgather(flat.unsqueeze(0), name="check." + way)
    assert all(torch.equal(row, every[0]) for row in every), "replicas differ"
    return float(flat.double().sum())

hvd.init()
m = model()
hvd.broadcast_parameters(m.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                               named_parameters=m.named_parameters())
results = {"horovod": train("horovod", m, opt, m.parameters)}
dist.init_process_group("kolo")
m = model()
ddp = torch.nn.parallel.DistributedDataParallel(m)
results["ddp"] = train("ddp", ddp, torch.optim.SGD(ddp.parameters(), lr=0.1),
                       m.parameters)
m = model()
ddp = torch.nn.parallel.DistributedDataParallel(m)
zero = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.Adam, lr=0.01)
results["zero"] = train("zero", ddp, zero, m.parameters)
if int(torch.__version__.split(".")[0]) >= 2:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's, about FSDP1
        fsdp = FSDP(model(), device_id=torch.device("cpu"),
                    use_orig_params=True)
        def full():
            with FSDP.summon_full_params(fsdp):
                return [p.detach().clone() for p in fsdp.parameters()]
        results["fsdp"] = train("fsdp", fsdp,
                                torch.optim.SGD(fsdp.parameters(), lr=0.1),
                                full)
dist.destroy_process_group()
print("TRAINED rank %d of %d: %s" % (hvd.rank(), hvd.size(),
                                     " ".join(sorted(results))), flush=True)
"""


def test_mnist_example_on_a_subset_as_the_readme_shows():
    r = run([KOLORUN, "-np", "2", PYTHON,
             os.path.join(REPO, "frontends/python/examples/mnist.py"),
             "--epochs", "1", "--limit-train", "1024", "--limit-test", "500",
             "--log-interval", "4", "--min-accuracy", "40"],
            env=env(), cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert re.search(r"^\[%d\] OK rank %d of 2: test accuracy" % (rank, rank),
                         r.stdout, re.M), r.stdout
    assert "samples/s over 2 ranks" in r.stdout
    assert re.search(r"^\[0\] epoch 1 step 4/\d+: loss", r.stdout, re.M)


def test_a_python_exception_on_one_rank_ends_the_job_naming_it(script):
    path = script("""
import torch
import kolo.torch as hvd
hvd.init()
if hvd.rank() == 1:
    raise RuntimeError("rank 1 gives up")
hvd.allreduce(torch.ones(2), name="never")
""")
    r = run([KOLORUN, "-np", "3", PYTHON, path], env=env(KOLO_OP_TIMEOUT="60"),
            timeout=60)
    assert r.returncode != 0
    assert "RuntimeError: rank 1 gives up" in r.stdout + r.stderr
    # kolorun names rank 1 first: it leaves at once (no shutdown at exit
    # after an uncaught exception).
    named = re.findall(r"kolorun: rank (\d) \(pid \d+\) exited with code 1",
                       r.stderr)
    assert named and named[0] == "1", r.stderr
    # The survivors heard of it (not 60 s later) and said so.
    assert "rank 1 lost" in r.stdout + r.stderr


def test_horovod_variables_and_unbuffered_output(script):
    path = script("""
import os
print("HVD", os.environ["HOROVOD_RANK"], os.environ["HOROVOD_SIZE"],
      os.environ["HOROVOD_LOCAL_RANK"], os.environ["PYTHONUNBUFFERED"])
""")
    r = run([KOLORUN, "-np", "2", PYTHON, path], env=env())
    assert r.returncode == 0, r.stderr
    assert "[0] HVD 0 2 0 1" in r.stdout and "[1] HVD 1 2 1 1" in r.stdout


def test_under_torchrun(script):
    r = run_torchrun(script(ALLREDUCE), "torchrun-test-secret-0123456789")
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert "RESULT rank %d of 2: [3.0, 3.0, 3.0]" % rank in r.stdout, \
            r.stdout


def test_under_mpirun(script):
    r = run_mpirun(script(ALLREDUCE), "mpirun-test-secret-0123456789")
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert "RESULT rank %d of 2: [3.0, 3.0, 3.0]" % rank in r.stdout


@pytest.mark.skipif(
    bool(os.environ.get("KOLO_PYTHON")),
    reason="a fresh venv over /usr/bin/python3's site packages has Debian's "
    "torch: test_pip_install_builds_against_the_venvs_torch covers this one")
def test_wheel_installs_into_a_fresh_venv_and_runs_outside_the_tree(tmp_path):
    wheels = tmp_path / "wheels"
    r = run([os.path.join(REPO, "tools/build_wheel.sh"), str(wheels)],
            timeout=1200, env=dict(os.environ, KOLO_PYTHON=PYTHON))
    assert r.returncode == 0, r.stdout + r.stderr
    built = list(wheels.glob("kolo-*.whl"))
    assert len(built) == 1, built
    venv = tmp_path / "venv"
    r = run([PYTHON, "-m", "venv", "--system-site-packages", str(venv)])
    assert r.returncode == 0, r.stderr
    r = run([str(venv / "bin" / "pip"), "install", "--no-index",
             str(built[0])])
    assert r.returncode == 0, r.stdout + r.stderr
    clean = {k: v for k, v in env().items() if k not in ("PYTHONPATH",
                                                         "LD_LIBRARY_PATH")}
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    r = run([str(venv / "bin" / "python"), "-c",
             "import kolo, kolo.torch as hvd; print(kolo.__file__); "
             "print(hvd.elastic.__file__, hvd.elastic.TorchState.__name__)"],
            env=clean, cwd=str(outside))
    assert r.returncode == 0, r.stderr
    assert str(venv) in r.stdout, r.stdout
    # Every module of the package is in the wheel (elastic included).
    assert "%s/lib/" % venv in r.stdout.splitlines()[1], r.stdout
    assert "TorchState" in r.stdout, r.stdout
    (outside / "train.py").write_text(ALLREDUCE)
    r = run([str(venv / "bin" / "kolorun"), "-np", "2",
             str(venv / "bin" / "python"), "train.py"],
            env=clean, cwd=str(outside))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RESULT rank 1 of 2: [3.0, 3.0, 3.0]" in r.stdout
    # The README's command, from the venv, on a small subset.
    r = run([str(venv / "bin" / "kolorun"), "-np", "2",
             str(venv / "bin" / "python"),
             os.path.join(REPO, "frontends/python/examples/mnist.py"),
             "--epochs", "1", "--limit-train", "512", "--limit-test", "200"],
            env=clean, cwd=str(outside))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[1] OK rank 1 of 2: test accuracy" in r.stdout, r.stdout


def _output_base(bin_dir):
    """The Bazel output base a bazel-bin symlink points into."""
    return os.path.realpath(bin_dir).split("/execroot/")[0]


def test_pip_install_builds_against_the_venvs_torch(tmp_path):
    """pip install --no-build-isolation <checkout> in a venv that holds a
    torch builds kolo against that torch: Debian's (a fresh venv over
    /usr/bin/python3's site packages), or KOLO_PYTHON's venv (installed
    there, then removed). The wheel asks for that torch's minor version;
    kolorun comes into the venv's bin/ and runs jobs outside the tree: an
    allreduce, and a Horovod-style loop, DDP, ZeroRedundancyOptimizer and
    (torch 2.x) FSDP at 2 and 3 ranks."""
    if PYTHON == "/usr/bin/python3":
        venv_bin = tmp_path / "venv" / "bin"
        r = run([PYTHON, "-m", "venv", "--system-site-packages",
                 str(tmp_path / "venv")])
        assert r.returncode == 0, r.stderr
        python = str(venv_bin / "python")
    else:
        python = PYTHON
        venv_bin = os.path.dirname(PYTHON)
    pip = os.path.join(str(venv_bin), "pip")
    clean = {k: v for k, v in env().items() if k not in ("PYTHONPATH",
                                                         "LD_LIBRARY_PATH")}
    build_env = dict(clean, KOLO_BAZEL_OUTPUT_BASE=_output_base(BIN))
    try:
        r = run([pip, "install", "--no-build-isolation", REPO], env=build_env,
                timeout=1800, cwd=str(tmp_path))
        assert r.returncode == 0, r.stdout + r.stderr
        r = run([python, "-c",
                 "import importlib.metadata as m, torch; "
                 "print(m.requires('kolo'), torch.__version__)"],
                env=clean, cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr
        requires, version = r.stdout.rsplit(" ", 1)
        major, minor = version.split(".")[:2]
        # (Older setuptools write "torch (==X.Y.*)".)
        assert "torch" in requires, requires
        if "a0" in version:  # Debian's 1.13.0a0+gitunknown
            assert "<%s.%d" % (major, int(minor) + 1) in requires, requires
            assert ">=%s.%s.0a0" % (major, minor) in requires, requires
        else:
            assert "==%s.%s.*" % (major, minor) in requires, requires
        (tmp_path / "train.py").write_text(ALLREDUCE)
        r = run([os.path.join(str(venv_bin), "kolorun"), "-np", "2", python,
                 "train.py"], env=clean, cwd=str(tmp_path))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "RESULT rank 1 of 2: [3.0, 3.0, 3.0]" in r.stdout, r.stdout
        (tmp_path / "four.py").write_text(TRAIN_FOUR_WAYS)
        ways = "ddp fsdp horovod zero" if major != "1" else "ddp horovod zero"
        for np in (2, 3):
            r = run([os.path.join(str(venv_bin), "kolorun"), "-np", str(np),
                     python, "four.py"], env=clean, cwd=str(tmp_path),
                    timeout=300)
            assert r.returncode == 0, r.stdout + r.stderr
            for rank in range(np):
                assert "TRAINED rank %d of %d: %s" % (rank, np, ways) in \
                    r.stdout, r.stdout
    finally:
        if PYTHON != "/usr/bin/python3":
            run([pip, "uninstall", "-y", "-q", "kolo"], env=clean)


def test_a_source_install_without_torch_says_so(tmp_path):
    """In a venv without torch, the build stops at once saying what is
    missing and what to do."""
    r = run(["/usr/bin/python3", "-m", "venv", str(tmp_path / "bare")])
    assert r.returncode == 0, r.stderr
    r = run([str(tmp_path / "bare" / "bin" / "pip"), "install",
             "--no-build-isolation", "--no-index", REPO],
            env={k: v for k, v in env().items() if k != "PYTHONPATH"},
            cwd=str(tmp_path), timeout=300)
    assert r.returncode != 0
    assert "has no torch" in r.stdout + r.stderr, r.stdout + r.stderr
    assert "pip install torch" in r.stdout + r.stderr


def test_the_device_checks_python_script_on_cpu_tensors():
    """tests/device/torch_python_check.py, which tools/device_check.sh runs
    on the GPU machine, passes here with its checks on CPU tensors (so that
    device time is never spent on a broken script)."""
    r = run([KOLORUN, "-np", "1", PYTHON,
             os.path.join(REPO, "tests", "device", "torch_python_check.py")],
            env=env(KOLO_CHECK_DEVICE="cpu"), timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "torch_python_check: 8 passed, 0 failed, 0 skipped" in out, out
