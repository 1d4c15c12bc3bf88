"""Shared pytest configuration: the `slow`, `cuda` and `docs` markers, the CPU pin of every test not marked `cuda`, and
the fixtures that tests in several folders use (`trained`). A folder's own fixtures are in its conftest.py.

- `slow` tests are skipped unless pytest gets `--runslow` (mirrors nbdev's `#| slow` cells, which
  run with `nbdev_test --flags slow`).
- `cuda` tests are skipped when no CUDA GPU is visible, unless the environment sets `T2T_REQUIRE_CUDA=1`: then each
  of them fails, saying why CUDA is not available (a driver too old for the wheel's CUDA must not pass silently on a
  GPU machine). `tools/gpu_check.sh` sets it.
- Every test that is not marked `cuda` runs on the CPU whatever the machine (`cpu_pin`): `torch.cuda.is_available()`
  answers False and `CUDA_VISIBLE_DEVICES` is '' (so the subprocesses it starts see no GPU either). Their expected
  values (bit-exact resumes, fp32 tolerances) are the CPU's.
- `pytest -m cuda` (the GPU machine's run) collects only the test modules that hold a cuda-marked test
  (`pytest_ignore_collect`).
- `docs` tests compare prose with numbers (the experiments guide's tables, the numbers the chapters and guides quote): `pytest -m docs` runs
  them alone, `pytest -m "not docs"` leaves them out.
"""
import contextlib, os

import pytest, torch

import t2t_course


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
    config.addinivalue_line("markers", "docs: compares prose (README.md, the guides, the notebooks' markdown) with the numbers it quotes")


def pytest_ignore_collect(collection_path, config):
    """Under `-m cuda` exactly, leave out the test modules that hold no cuda-marked test (no `mark.cuda` in their text).

    `-m` deselects tests only after their module is imported, so without this `pytest -m cuda tests` imports every test
    module, and one whose module-level imports fail (timm or onnx of another version than ours, on the GPU machine's own
    Python) is a collection error that stops the run before any cuda test. None of those modules has a test that `-m
    cuda` would select, so not importing them changes nothing that runs. Any other mark expression collects as usual."""
    if (config.option.markexpr or '').strip() != 'cuda': return None
    if collection_path.suffix != '.py' or not collection_path.name.startswith('test_'): return None
    try: text = collection_path.read_text(encoding='utf-8', errors='replace')
    except OSError: return None
    return None if 'mark.cuda' in text else True


def pytest_collection_modifyitems(config, items):
    skip_slow = pytest.mark.skip(reason="slow test: run with --runslow")
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    has_cuda = torch.cuda.is_available()
    for item in items:
        if "slow" in item.keywords and not config.getoption("--runslow"): item.add_marker(skip_slow)
        if "cuda" in item.keywords and not has_cuda and not require_cuda(): item.add_marker(skip_cuda)


def no_cuda() -> bool:
    "`torch.cuda.is_available` while a test is pinned to the CPU."
    return False


@contextlib.contextmanager
def cpu_pin(item):
    """Pin `item` to the CPU unless it is marked `cuda`: `torch.cuda.is_available()` is False (device 'auto' resolves
    through it, in `t2t_course.train.distributed.resolve_device`) and `CUDA_VISIBLE_DEVICES=''` for the processes it starts.
    The library calls `torch.cuda.is_available` by attribute everywhere, so replacing the attribute is enough."""
    if "cuda" in item.keywords:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, 'is_available', no_cuda)
        mp.setenv('CUDA_VISIBLE_DEVICES', '')
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Every test not marked `cuda` runs pinned to the CPU, its fixtures' setup and teardown included.

    A hook around the whole test, not an autouse fixture: pytest sets up module- and session-scoped fixtures before
    function-scoped ones, autouse or not, so a fixture would leave out e.g. tests/train/test_run.py's module-scoped
    `uninterrupted` run, a subprocess whose bit-exact comparisons hold on the CPU."""
    with cpu_pin(item):
        yield


def pytest_runtest_setup(item):
    if "cuda" in item.keywords and require_cuda() and not torch.cuda.is_available():
        pytest.fail(f"T2T_REQUIRE_CUDA=1 but CUDA is not available: {cuda_unavailable_reason()}", pytrace=False)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    "One of our checkpoints: a tiny T2T-ViT-7 with 4 classes at 32 px (random weights)."
    d = tmp_path_factory.mktemp('ck')
    kw = dict(embed_dim=64, depth=2, num_heads=2)
    torch.manual_seed(0)
    sd = t2t_course.create_model('t2t_vit_7', num_classes=4, img_size=32, **kw).state_dict()
    torch.save(dict(state_dict=sd, state_dict_ema=sd, classes=['cat', 'dog', 'owl', 'fox'], epoch=1,
                    config=dict(model='t2t_vit_7', model_kwargs=kw, img_size=32, data='pets', data_preset='digits')),
               d / 'best.pth')
    return d / 'best.pth'
