"""Shared pytest configuration: the `slow` and `cuda` markers.

- `slow` tests are skipped unless pytest gets `--runslow` (mirrors nbdev's `#| slow` cells, which
  run with `nbdev_test --flags slow`).
- `cuda` tests are skipped when no CUDA GPU is visible.
"""
import pytest, torch


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running test, skipped unless --runslow is given")
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU; skipped when none is available")


def pytest_collection_modifyitems(config, items):
    skip_slow = pytest.mark.skip(reason="slow test: run with --runslow")
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    has_cuda = torch.cuda.is_available()
    for item in items:
        if "slow" in item.keywords and not config.getoption("--runslow"): item.add_marker(skip_slow)
        if "cuda" in item.keywords and not has_cuda: item.add_marker(skip_cuda)
