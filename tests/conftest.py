"""Shared pytest configuration: the `slow` and `cuda` markers.

- `slow` tests are skipped unless pytest gets `--runslow` (mirrors nbdev's `#| slow` cells, which
  run with `nbdev_test --flags slow`).
- `cuda` tests are skipped when no CUDA GPU is visible, unless the environment sets `T2T_REQUIRE_CUDA=1`: then each
  of them fails, saying why CUDA is not available (a driver too old for the wheel's CUDA must not pass silently on a
  GPU machine). `tools/gpu_check.sh` sets it.
"""
import os

import pytest, torch


def require_cuda() -> bool:
    "Does the environment ask for a GPU (T2T_REQUIRE_CUDA=1)?"
    return os.environ.get('T2T_REQUIRE_CUDA', '') not in ('', '0')


def cuda_unavailable_reason() -> str:
    "Why torch sees no CUDA GPU: the CUDA runtime's own error where there is one."
    try: torch.cuda.init()
    except Exception as e: return f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
    return f"torch.cuda.is_available() is False (torch {torch.__version__}, built for CUDA {torch.version.cuda})"


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running test, skipped unless --runslow is given")
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU; skipped when none is available (fails with T2T_REQUIRE_CUDA=1)")


def pytest_collection_modifyitems(config, items):
    skip_slow = pytest.mark.skip(reason="slow test: run with --runslow")
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    has_cuda = torch.cuda.is_available()
    for item in items:
        if "slow" in item.keywords and not config.getoption("--runslow"): item.add_marker(skip_slow)
        if "cuda" in item.keywords and not has_cuda and not require_cuda(): item.add_marker(skip_cuda)


def pytest_runtest_setup(item):
    if "cuda" in item.keywords and require_cuda() and not torch.cuda.is_available():
        pytest.fail(f"T2T_REQUIRE_CUDA=1 but CUDA is not available: {cuda_unavailable_reason()}", pytrace=False)
