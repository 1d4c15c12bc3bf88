"""tests/conftest.py, the suite's configuration. The GPU machine's run, `python3 -m pytest -m cuda tests`, on its own
Python: it collects every cuda test whatever timm and onnx it has (conftest's `pytest_ignore_collect` leaves out the
modules without a cuda test, and tests/deploy/test_timm.py skips itself when timm's internals are missing); every other test is
pinned to the CPU (conftest's `cpu_pin`), while a cuda test sees the GPU; and T2T_REQUIRE_CUDA=1 turns a cuda test's
skip into a failure that names the reason."""
import ast, os, re, subprocess, sys, types
from pathlib import Path

import pytest
import torch

from tests import conftest  # tests/conftest.py, as pytest imports it (tests/ is a package)
from tests.support.warm import warm_run

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / 'tests'
ERROR = re.compile(r'\berrors?\b', re.I)  # pytest's "ERROR collecting", "1 error", "Interrupted: 1 error"


def _is_cuda_mark(d) -> bool:
    "Is the decorator `d` `pytest.mark.cuda`?"
    return isinstance(d, ast.Attribute) and d.attr == 'cuda' and isinstance(d.value, ast.Attribute) and d.value.attr == 'mark'


def cuda_tests() -> list:
    "The node ids (without parameters) of the tests marked `@pytest.mark.cuda` in tests/."
    ids = []
    for f in sorted(TESTS.rglob('test_*.py')):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith('test_') and any(map(_is_cuda_mark, node.decorator_list)):
                ids.append(f'{f.relative_to(REPO).as_posix()}::{node.name}')
    return ids


def _blockers(root:Path, version:str=None) -> Path:
    "A folder of fake timm, onnx and onnxruntime packages whose import raises ImportError('blocked'); or, given a "
    "`version`, a timm of that version with an empty timm.models (a timm whose internals moved)."
    for name in ('timm', 'onnx', 'onnxruntime'):
        (root / name).mkdir(parents=True)
        (root / name / '__init__.py').write_text('raise ImportError("blocked")\n')
    if version:
        (root / 'timm' / '__init__.py').write_text(f'__version__ = {version!r}\n')
        (root / 'timm' / 'models').mkdir()
        (root / 'timm' / 'models' / '__init__.py').write_text('')
    return root


def _pytest(args, fakes:Path):
    """`python -m pytest ARGS` in the repository with `fakes` first on PYTHONPATH; the CompletedProcess. Started warm
    (`tests/support/warm.py`: forked from an interpreter that has imported torch and t2t_course, never timm or onnx, so the
    fakes still decide what those imports do; the launcher applies PYTHONPATH as a fresh interpreter would)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fakes), *filter(None, [os.environ.get('PYTHONPATH')])]),
               PYTHONWARNINGS='ignore')
    env.pop('PYTEST_ADDOPTS', None)
    return warm_run([sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', *args], cwd=REPO, env=env,
                    capture_output=True, text=True, timeout=300)


# ------------------------------------------------------------------ collection under -m cuda
def test_the_known_cuda_tests_are_found():
    ids = cuda_tests()
    assert {i.split('::')[0] for i in ids} >= {'tests/train/test_distributed.py', 'tests/data/pipelines/test_gpu.py', 'tests/train/test_loop.py'}, ids


def test_cuda_run_collects_every_cuda_test_without_timm_or_onnx(tmp_path):
    "`-m cuda` with timm, onnx and onnxruntime unimportable: exit 0, every cuda test collected, no error."
    p = _pytest(['-m', 'cuda', '--collect-only', '-q', 'tests'], _blockers(tmp_path / 'fakes'))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    missing = [i for i in cuda_tests() if not any(l == i or l.startswith(i + '[') for l in p.stdout.splitlines())]
    assert missing == [], (missing, out[-3000:])
    assert 'blocked' not in out and not ERROR.search(out), out[-3000:]
    assert 'tests/deploy/' not in out  # not even imported (test_timm.py, test_export.py: no cuda test)


@pytest.mark.parametrize('version', [None, '0.0.fake'])
def test_plain_collection_skips_test_timm_with_the_reason(tmp_path, version):
    "Without -m: a timm that cannot be imported, or one without the internals the tests use, skips test_timm.py with "
    "the reason (not a collection error); tests/deploy/test_export.py collects (onnx is imported by the tests that use it)."
    p = _pytest(['--collect-only', '-q', '-rs', 'tests/deploy/test_timm.py', 'tests/deploy/test_export.py'],
                _blockers(tmp_path / 'fakes', version))
    out = p.stdout + p.stderr
    assert p.returncode == 0 and not ERROR.search(out), out[-3000:]  # the reason's ImportError is no word 'error'
    skip = next((l for l in p.stdout.splitlines() if l.startswith('SKIPPED') and 'test_timm.py' in l), '')
    assert 'timm' in skip and ('blocked' in skip if version is None else 'timm 0.0.fake' in skip and 'FeatureInfo' in skip), out[-3000:]
    assert 'tests/deploy/test_export.py::test_export_program_any_batch_and_size' in p.stdout, out[-3000:]


# ------------------------------------------------------------------ the CPU pin
def test_a_test_not_marked_cuda_is_pinned_to_the_cpu():
    assert torch.cuda.is_available() is False and torch.cuda.is_available is conftest.no_cuda
    assert os.environ['CUDA_VISIBLE_DEVICES'] == ''
    from t2t_course.train.distributed import resolve_device
    assert resolve_device('auto').type == 'cpu'  # how the library resolves device 'auto'
    p = subprocess.run([sys.executable, '-c', 'import os, torch; print(os.environ["CUDA_VISIBLE_DEVICES"] == "", torch.cuda.is_available())'],
                       capture_output=True, text=True, timeout=120)
    assert p.stdout.split() == ['True', 'False'], p.stdout + p.stderr  # and so are the processes it starts


def test_the_pin_leaves_cuda_tests_alone(monkeypatch):
    "`cpu_pin` on a cuda-marked item changes nothing; on any other item it pins, and restores everything after."
    real = lambda: True
    monkeypatch.setattr(torch.cuda, 'is_available', real)  # stands for the unpinned state of a GPU machine
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '0')
    with conftest.cpu_pin(types.SimpleNamespace(keywords={'cuda': True, 'test_x': True})):
        assert torch.cuda.is_available is real and os.environ['CUDA_VISIBLE_DEVICES'] == '0'
    with conftest.cpu_pin(types.SimpleNamespace(keywords={'slow': True, 'test_x': True})):
        assert torch.cuda.is_available is conftest.no_cuda and os.environ['CUDA_VISIBLE_DEVICES'] == ''
    assert torch.cuda.is_available is real and os.environ['CUDA_VISIBLE_DEVICES'] == '0'


@pytest.mark.cuda
def test_a_cuda_test_sees_the_gpu():
    "On the GPU machine: a cuda test is not pinned (on a CPU machine it is skipped, like every cuda test)."
    assert torch.cuda.is_available is not conftest.no_cuda and torch.cuda.is_available()
    assert os.environ.get('CUDA_VISIBLE_DEVICES') != ''


# ------------------------------------------------------------------ T2T_REQUIRE_CUDA
@pytest.mark.skipif(torch.cuda.is_available(), reason='checks what a machine without CUDA does')
def test_require_cuda_turns_cuda_skips_into_failures():
    "T2T_REQUIRE_CUDA=1: a cuda test fails, naming the reason, instead of being skipped."
    test = 'tests/data/pipelines/test_gpu.py::test_gpu_pipeline_decodes_with_nvjpeg_and_falls_back'
    run = lambda env: warm_run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', test], cwd=REPO,
                               env=dict(os.environ, **env), capture_output=True, text=True, timeout=300)
    p = run({'T2T_REQUIRE_CUDA': '0'})
    assert p.returncode == 0 and '1 skipped' in p.stdout, p.stdout[-2000:]
    p = run({'T2T_REQUIRE_CUDA': '1'})
    assert p.returncode == 1 and 'T2T_REQUIRE_CUDA=1 but CUDA is not available' in p.stdout, p.stdout[-2000:]
