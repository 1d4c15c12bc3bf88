"""tools/gpu_check.sh, the GPU check for a CUDA node without network, checked on a CPU before it runs on a GPU node
(a GPU node's time is short): its dry run (every phase-1 command on the CPU with tiny sizes) passes and leaves files
that can be copied back; on a machine without CUDA, or with a Python without torch, it stops at once with one line
saying what is missing, never passing by skipping; its plan fits its limits (phase 1 within 300 s, phase 2 within
180 s, so that a second try fits in a short slot); and phase 2 without the wheel folder says to run tools/wheels.sh.
The GPU numbers themselves are not measured here."""
import json, os, re, shlex, subprocess, sys, time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / 'tools' / 'gpu_check.sh'
NAME = re.compile(r'^[A-Za-z0-9._-]+$')  # the output folder's file names: letters, digits, '.', '_', '-'
PHASE1_STEPS = ['preflight', 'nvidia-smi', 'pytest_cuda', 'data_pipeline', 'gpu_train']


def gpu_check(*args, python=sys.executable, timeout=150):
    "Run the script as on a GPU node (bash, from anywhere), with PYTHON set; (exit status, stdout, stderr, seconds)."
    env = {k: v for k, v in os.environ.items() if k not in ('T2T_REQUIRE_CUDA', 'PYTHONPATH')}
    env['PYTHON'] = str(python)
    t = time.monotonic()
    p = subprocess.run(['bash', str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env,
                       cwd='/')
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t


def plan(*args):
    "The plan's steps {name: limit} and its stated total, from --plan."
    code, out, err, _ = gpu_check(*args, '--plan', timeout=30)
    assert code == 0, err
    steps = dict(re.findall(r'^  (\S+)\s+limit\s+(\d+)s', out, re.M))
    total = int(re.search(r'limits sum to (\d+) s', out).group(1))
    return {k: int(v) for k, v in steps.items()}, total


def test_plan_fits_the_device_time():
    "Phase 1's limits sum to at most 300 s and phase 2's to 180 s (a short GPU slot holds both phases and a retry)."
    steps, total = plan()
    assert list(steps) == PHASE1_STEPS and sum(steps.values()) == total <= 300, steps
    dry, _ = plan('--dry-run')
    assert list(dry) == list(steps)  # the dry run is the same steps
    steps2, total2 = plan('--phase', '2')
    def has_cuda_cell(p):
        return any(c['cell_type'] == 'code' and ''.join(c['source']).startswith('#| cuda')
                   for c in json.loads(p.read_text(encoding='utf-8'))['cells'])
    notebooks = sorted(p.stem for p in (REPO / 'nbs').glob('*.ipynb') if has_cuda_cell(p))
    assert list(steps2) == ['preflight', 'install'] + [f'nb_{n}' for n in notebooks], steps2
    assert notebooks and sum(steps2.values()) == total2 <= 180, steps2


def test_plan_runs_only_the_cuda_modules_on_the_device_python():
    "pytest -m cuda gets the test modules that name the cuda mark, not all of tests/; the interpreter is python3 by default."
    env = {k: v for k, v in os.environ.items() if k != 'PYTHON'}
    out = subprocess.run(['bash', str(SCRIPT), '--plan'], capture_output=True, text=True, env=env, timeout=30).stdout
    line = next(l for l in out.splitlines() if l.strip().startswith('pytest_cuda'))
    mods = sorted(re.findall(r'tests/(?:\w+/)*test_\w+\.py', line))
    assert mods == sorted(p.relative_to(REPO).as_posix() for p in (REPO / 'tests').rglob('test_*.py') if 'mark.cuda' in p.read_text())
    assert ' python3 -m pytest -q -m cuda ' in line and '-p no:cacheprovider' in line


@pytest.mark.skipif(torch.cuda.is_available(), reason='this machine has a CUDA GPU: the check would run')
def test_no_cuda_stops_at_once_with_one_line(tmp_path):
    "On a machine without CUDA the real check stops after the preflight, within 60 s, non-zero, one line naming CUDA."
    code, out, err, dt = gpu_check(tmp_path / 'out', timeout=90)
    assert code != 0 and dt < 60, (code, dt)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('gpu_check: no usable CUDA GPU: ') and 'torch' in lines[0], err
    summary = (tmp_path / 'out' / 'summary.txt').read_text()
    assert 'FAIL preflight' in summary and 'SKIP gpu_train' in summary and 'result: FAIL' in summary
    assert 'PASS' not in summary


def test_a_python_without_torch_stops_with_one_line(tmp_path):
    "PYTHON without torch (this one, isolated and without site-packages): non-zero, one line saying it has no torch."
    fake = tmp_path / 'python-without-torch'
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} -S -I "$@"\n'); fake.chmod(0o755)
    probe = subprocess.run([str(fake), '-c', 'import torch'], capture_output=True, text=True)
    if probe.returncode == 0: pytest.skip('torch is importable without site-packages here')
    code, out, err, dt = gpu_check(tmp_path / 'out', python=fake, timeout=60)
    lines = err.strip().splitlines()
    assert code != 0 and dt < 60 and len(lines) == 1, (code, err)
    assert re.match(r"gpu_check: .*python-without-torch has no torch: ModuleNotFoundError: No module named 'torch'",
                    lines[0]), lines[0]


def test_phase2_without_wheels_names_tools_wheels_sh(tmp_path):
    "Phase 2 without the wheel folder: non-zero at once, one line naming the folder and tools/wheels.sh."
    code, out, err, dt = gpu_check('--phase', '2', '--wheels', tmp_path / 'none', tmp_path / 'out', timeout=30)
    assert code != 0 and dt < 10 and 'tools/wheels.sh' in err and str(tmp_path / 'none') in err, (code, err)
    assert not (tmp_path / 'out').exists()  # nothing ran


def python_without_the_project(tmp_path):
    """This Python with its packages but not the project's editable install (`-S`: no .pth file runs; its site-packages
    on PYTHONPATH after what the script puts first), as on a GPU node, where the checkout is importable only because
    the script puts it on PYTHONPATH."""
    import site
    dirs = os.pathsep.join(d for d in [*site.getsitepackages(), site.getusersitepackages()] if os.path.isdir(d))
    py = tmp_path / 'python-without-the-project'
    py.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}"{shlex.quote(dirs)} '
                  f'exec {shlex.quote(sys.executable)} -S "$@"\n')
    py.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    probe = subprocess.run([str(py), '-c', 'import torch, pytest; import t2t_course'], capture_output=True, text=True,
                           cwd='/', env=env)
    assert "No module named 't2t_course'" in probe.stderr, probe.stderr[-2000:]  # torch and pytest import; the project not
    return py


def test_dry_run_passes_and_leaves_files_that_come_back(tmp_path):
    "The dry run (CPU, tiny sizes, cuda tests skipping) passes with a Python that has not the project installed (as on "
    "a GPU node: only the script's PYTHONPATH finds it); at most 8 files, all with plain names, to copy back."
    out_dir = tmp_path / 'dry'
    code, out, err, dt = gpu_check('--dry-run', out_dir, python=python_without_the_project(tmp_path), timeout=240)
    assert code == 0, out[-3000:] + err[-2000:]
    files = [p for p in out_dir.rglob('*') if p.is_file()]
    assert 0 < len(files) <= 8 and all(NAME.match(p.name) for p in files), files
    logs = {'summary.txt', 'preflight.log', 'pytest_cuda.log', 'gpu_train.log', 'data_pipeline.log'}
    assert {p.name for p in files} >= logs, files
    summary = (out_dir / 'summary.txt').read_text()
    for step in PHASE1_STEPS:
        assert re.search(rf'^  (PASS|INFO) {re.escape(step)} ', summary, re.M), (step, summary)
    assert 'result: PASS' in summary and 'pytest -m cuda: ' in summary and 'skipped' in summary
    assert 'train batch' in summary and 'img/s per worker' in summary  # the numbers grepped from the logs
    assert len(summary.splitlines()) <= 70  # one page
