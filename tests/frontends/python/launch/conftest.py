"""Launch tests of kolo.torch: each starts real jobs (kolorun, mpirun,
torchrun) of Python workers, or builds and installs the wheel. Run by
plain pytest (not inside a job): tools/test.sh does."""

import os
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..",
                                    "..", ".."))
SITE = os.path.join(REPO, "bazel-bin", "frontends", "python", "site")
KOLORUN = os.path.join(REPO, "bazel-bin", "tools", "kolorun", "kolorun")
PYTHON = "/usr/bin/python3"


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


@pytest.fixture
def script(tmp_path):
    def write(text):
        path = tmp_path / "worker.py"
        path.write_text(text)
        return str(path)
    return write
