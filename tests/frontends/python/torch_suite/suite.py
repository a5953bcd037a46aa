"""PyTorch's own backend test suite on the kolo backend: the installed
torch's ``DistributedTest._DistTestBase`` (what torch's
test/distributed/test_distributed_spawn.py runs for gloo, nccl and ucc),
with the spawn start method, on the CPU.

torch gates some CPU tests by backend name: written for gloo only, or for
MPI only (all_to_all). This module loads the installed
torch/testing/_internal/distributed/distributed_test.py with those gates
admitting "kolo" too (each rewrite is listed in GATES and counted at load,
so a torch that changed its wording fails loudly instead of skipping
silently), and marks kolo as a backend that has DDP and subgroups.
Inside the tests the same comparisons then take gloo's branch: kolo is held
to what torch expects of gloo.

Imported by run_suite.py in the driver and, through the spawn start
method, in every rank process: both load the same rewritten module.
"""

import os
import shutil
import sys
import tempfile
import types

import torch
import kolo.torch  # noqa: F401  (registers "kolo" in every rank)
from torch.testing._internal import common_distributed

# (text in distributed_test.py, its replacement, how often it must appear)
GATES = [
    ('BACKEND != "gloo"', 'BACKEND not in ("gloo", "kolo")', None),
    ('BACKEND == "gloo"', 'BACKEND in ("gloo", "kolo")', None),
    ('require_backend_is_available({"gloo"})',
     'require_backend_is_available({"gloo", "kolo"})', None),
    ('BACKEND != "mpi", "Only MPI supports',
     'BACKEND not in ("mpi", "kolo"), "Only MPI supports', None),
]


def _load():
    name = "torch.testing._internal.distributed.distributed_test"
    path = os.path.join(os.path.dirname(common_distributed.__file__),
                        "distributed", "distributed_test.py")
    with open(path) as f:
        source = f.read()
    counts = {}
    for old, new, _ in GATES:
        counts[old] = source.count(old)
        if counts[old] == 0:
            raise RuntimeError("torch's distributed_test.py no longer has %r: "
                               "update GATES in %s" % (old, __file__))
        source = source.replace(old, new)
    for feature in ("ddp", "subgroup", "plugin", "gpu", "cuda"):
        common_distributed.DistTestCases.backend_feature[feature].add("kolo")
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    exec(compile(source, path, "exec"), module.__dict__)
    return module, counts


assert os.environ.get("BACKEND") == "kolo", "run through run_suite.py"
distributed_test, GATE_COUNTS = _load()


class TestKoloBackendWithSpawn(distributed_test.TestDistBackend,
                               distributed_test.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()  # a fresh TEMP_DIR (the file barrier's) per test
        # The forkserver's ranks see the environment the server started
        # with: one TEMP_DIR path for the whole shard, emptied per test.
        fixed = os.environ.setdefault("KOLO_SUITE_TEMP_DIR", tempfile.mkdtemp())
        if os.environ["TEMP_DIR"] != fixed:
            shutil.rmtree(fixed)
            shutil.copytree(os.environ["TEMP_DIR"], fixed)
            os.environ["TEMP_DIR"] = fixed
        # Like spawn (fresh processes, no state of the test runner's), from
        # a server that imported torch and this module once: each rank then
        # starts in a fraction of a second instead of seconds.
        context = torch.multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["suite"])
        self._start_processes(context.Process)
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()
