"""The pytest session of kolo's torch.distributed backend, run in every rank
of one job (`kolorun -np N python3 -m pytest tests/frontends/python/distributed`;
tools/test.sh runs it at N = 2 and 3 through run_ranks.sh, and counts a test as
passed when it passed on every rank).

The default group is kolo's (`dist.init_process_group("kolo")` with no other
argument: kolorun exports what env:// reads); a gloo group over the same
ranks gives the reference results. Every test runs on every rank in the same
order: a test may use collectives freely.
"""

import pytest
import torch
import torch.distributed as dist

import kolo.torch  # noqa: F401  (registers the "kolo" backend)

_gloo = None


def pytest_configure(config):
    # Nothing deprecated on kolo's own path: a DeprecationWarning or
    # FutureWarning that kolo's modules raise, or that torch raises at
    # them, fails the test (whatever the torch).
    config.addinivalue_line("filterwarnings", "error::DeprecationWarning:kolo")
    config.addinivalue_line("filterwarnings", "error::FutureWarning:kolo")
    global _gloo
    torch.manual_seed(4321)
    dist.init_process_group("kolo")
    _gloo = dist.new_group(backend="gloo")


def pytest_unconfigure(config):
    del config
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def rank():
    return dist.get_rank()


@pytest.fixture
def size():
    return dist.get_world_size()


@pytest.fixture
def gloo():
    """A gloo group of every rank: the reference."""
    return _gloo


def pytest_collection_modifyitems(items):
    # One order on every rank.
    items.sort(key=lambda item: item.nodeid)
