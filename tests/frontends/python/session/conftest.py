"""The pytest session of kolo.torch's tests: run in every rank of one job,
`kolorun -np N python3 -m pytest tests/frontends/python/session`
(tools/test.sh runs it at N = 2 and 3 and counts a test as passed when it passed on every
rank: tests/frontends/python/run_ranks.sh).

Every test runs on every rank, in the same order, so tests may use
collectives freely; a test that would make ranks diverge (one rank raising
before a collective the others make) fails on the others too, at the op
timeout (KOLO_OP_TIMEOUT, short here).
"""


import pytest
import torch

import kolo.torch as hvd


def pytest_configure(config):
    # Nothing deprecated on kolo's own path: a DeprecationWarning or
    # FutureWarning that kolo's modules raise, or that torch raises at
    # them, fails the test (whatever the torch).
    config.addinivalue_line("filterwarnings", "error::DeprecationWarning:kolo")
    config.addinivalue_line("filterwarnings", "error::FutureWarning:kolo")
    torch.manual_seed(1234)
    hvd.init()


def pytest_unconfigure(config):
    del config
    if hvd.is_initialized():
        hvd.shutdown()


@pytest.fixture
def rank():
    return hvd.rank()


@pytest.fixture
def size():
    return hvd.size()


@pytest.fixture
def tmp_shared(tmp_path_factory):
    """A directory every rank of this host sees (rank 0's path)."""
    path = str(tmp_path_factory.mktemp("shared")) if hvd.rank() == 0 else ""
    return hvd.broadcast_object(path, root_rank=0)


def pytest_collection_modifyitems(items):
    # One order on every rank.
    items.sort(key=lambda item: item.nodeid)


