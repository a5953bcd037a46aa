"""Launch tests of kolo.torch: each starts real jobs (kolorun, mpirun,
torchrun) of Python workers, or builds and installs the wheel. Run by
plain pytest (not inside a job): tools/test.sh does."""

import os
import socket
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..",
                                    "..", ".."))
# The build under test: Debian's torch (bazel-bin, /usr/bin/python3), or
# with KOLO_BIN and KOLO_PYTHON set, a build against another torch and the
# interpreter that has it (tools/test.sh runs both).
BIN = os.environ.get("KOLO_BIN") or os.path.join(REPO, "bazel-bin")
SITE = os.path.join(BIN, "frontends", "python", "site")
KOLORUN = os.path.join(BIN, "tools", "kolorun", "kolorun")
PYTHON = os.environ.get("KOLO_PYTHON") or "/usr/bin/python3"


def env(**extra):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("KOLO_", "HOROVOD_", "OMPI_", "PMIX_"))
         and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                       "MASTER_PORT")}
    e["PYTHONPATH"] = SITE
    e.update(extra)
    return e


def run(args, timeout=300, **kwargs):
    return subprocess.run(args, capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(path, secret, nproc=2, timeout=300):
    """``path`` in a torchrun job of ``nproc`` local workers; kolo's store
    on a port of its own (torchrun's store holds MASTER_PORT)."""
    # Debian's torch 1.13 on Python 3.11 cannot parse the default
    # --redirects 0: "1" (stdout to a log file, teed) works.
    return run([PYTHON, "-m", "torch.distributed.run", "--nproc_per_node",
                str(nproc), "--redirects", "1", "--tee", "1", "--log_dir",
                os.path.join(os.path.dirname(path), "logs"),
                "--master_port", str(free_port()), path],
               env=env(KOLO_SECRET=secret,
                       KOLO_RENDEZVOUS_PORT=str(free_port())),
               timeout=timeout)


def run_mpirun(path, secret, np=2, timeout=300):
    """``path`` in an mpirun job of ``np`` local workers."""
    return run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
                str(np), "-x", "PYTHONPATH", "-x", "KOLO_SECRET", "-x",
                "KOLO_RENDEZVOUS_PORT", PYTHON, path],
               env=env(KOLO_SECRET=secret,
                       KOLO_RENDEZVOUS_PORT=str(free_port())),
               timeout=timeout)


@pytest.fixture
def script(tmp_path):
    def write(text):
        path = tmp_path / "worker.py"
        path.write_text(text)
        return str(path)
    return write
