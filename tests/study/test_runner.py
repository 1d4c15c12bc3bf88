"""Running a study (chapter 20b, `t2t_course.study.runner`) under faults, one test per kind, as the training command's
fault tests, through t2t_study: signals (one stops the grid, its children die with it even on SIGKILL), a second study
on the same folder, damaged results.csv files, paths the OS refuses, a copied study, any selection of models. Each case
runs one or two small runs of the quick grid."""
import os, shutil, signal, subprocess, time

import pytest

from t2t_course.study import read_results

from tests.support.commands import PY, REPO, call, warm_study
from tests.support.warm import WarmPopen

ONE = ['--quick', '--models', 'vit_48', '--seeds', '0', '--no-progress']   # one run of a few seconds


def study(out, *extra, cwd=None):
    """t2t_study's entry point called in this process (a process of its own costs about 9 s of imports; the signal cases
    start one); the CompletedProcess-like result. An exception escaping the command (a traceback in a shell) fails the
    test; `cwd` runs it from another working directory."""
    with pytest.MonkeyPatch.context() as mp:
        if cwd is not None: mp.chdir(cwd)
        code, out_, err = call(warm_study, ['--output', str(out), *ONE, *extra])
    return subprocess.CompletedProcess([], code, out_, err)


def _children(marker:str) -> list:
    "pids of t2t_train runs whose command line holds `marker`."
    out = subprocess.run(['pgrep', '-f', marker], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if int(p) != os.getpid()]


def _wait_for(pred, timeout=60.):
    t = time.time()
    while time.time() - t < timeout:
        if pred(): return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_study_signals(tmp_path, sig):
    "One signal stops the grid: the running run saves and stops, the queued one never starts, --resume finishes both."
    out = tmp_path / 'study'
    p = WarmPopen([PY, '-m', 't2t_course.study', '--output', str(out), '--quick', '--models', 'vit_48', 'vit_64',
                          '--seeds', '0', '--jobs', '1', '--no-progress'],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert _wait_for(lambda: (out / 'vit_48' / 'seed0' / 'log.txt').exists() and _children(str(out)))
    time.sleep(1.5)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == (-9 if sig == signal.SIGKILL else 128 + sig), err
    assert _wait_for(lambda: not _children(str(out)), 30), "a t2t_train run outlived its study"
    assert not (out / 'vit_64').exists()                                        # the queued run never started
    if sig != signal.SIGKILL: assert 'continue with --resume' in err and 'Traceback' not in err
    if sig == signal.SIGINT: return          # stops as SIGTERM does (one handler): its resume is SIGTERM's
    p2 = study(out, '--resume', '--models', 'vit_48', 'vit_64')
    assert p2.returncode == 0, p2.stderr[-2000:]
    assert {r['model'] for r in read_results(out / 'results.csv')} == {'vit_48', 'vit_64'}


def test_study_folder_lock(tmp_path):
    "A second study into a folder in use is refused, naming the holder."
    out = tmp_path / 'study'
    p = WarmPopen([PY, '-m', 't2t_course.study', '--output', str(out), *ONE], cwd=REPO, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    assert _wait_for(lambda: (out / '.lock').exists())
    q = study(out, '--resume')
    assert q.returncode == 2 and 'in use by another run' in q.stderr and f'pid {p.pid}' in q.stderr, q.stderr
    p.communicate(timeout=120)
    assert p.returncode == 0


@pytest.mark.parametrize('damage, code, message', [
    ('model,seed,val_acc1\nvit_48,0,abc\n', 0, 'line 2 is damaged (its val_acc1 is not a number'),
    ('name,score\nx,1\n', 2, "its header has no model, seed, val_acc1 column"),
    (b'\x89PNG\r\n\x1a\n\x00\x00binary', 2, 'is not text'),
    ('truncate', 0, 'is damaged (it has a different number of fields'),
])
def test_study_damaged_results(tmp_path, damage, code, message):
    "A damaged results.csv: a bad row is named and run again; a file that is not a results.csv is refused in one line."
    out = tmp_path / 'study'
    if damage == 'truncate':
        assert study(out).returncode == 0
        text = (out / 'results.csv').read_text()
        (out / 'results.csv').write_text(text[:len(text) - len(text.splitlines()[-1]) // 2 - 1])   # the row cut in half
    else:
        out.mkdir()
        (out / 'results.csv').write_bytes(damage if isinstance(damage, bytes) else damage.encode())
    p = study(out, '--resume')
    assert p.returncode == code and message in p.stderr, p.stderr[-2000:]
    if code == 0:
        rows = read_results(out / 'results.csv')
        assert [(r['model'], r['seed']) for r in rows] == [('vit_48', 0)] and isinstance(rows[0]['val_acc1'], float)


@pytest.mark.parametrize('where', ['under_a_file', 'long_name', 'read_only'])
def test_study_paths_the_os_refuses(tmp_path, where):
    "An --output the OS refuses: one line naming the path and the reason, exit 2."
    if where == 'under_a_file':
        (tmp_path / 'f').write_text('x'); out = tmp_path / 'f' / 'study'
    elif where == 'long_name': out = tmp_path / ('x' * 300)
    else:
        ro = tmp_path / 'ro'; ro.mkdir()
        if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', str(ro)], capture_output=True).returncode:
            pytest.skip('cannot mount a read-only file system here (needs root)')
        out = ro / 'study'
    try:
        p = study(out)
        assert p.returncode == 2 and 'error:' in p.stderr and str(out)[:40] in p.stderr, p.stderr[-2000:]
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    finally:
        if where == 'read_only': subprocess.run(['umount', str(tmp_path / 'ro')])


def test_study_copied_and_any_selection(tmp_path):
    """A study copied elsewhere and resumed from another folder reads its own runs; one model alone gets a report; resumed
    with another recipe (here --epochs) it refuses, naming what differs."""
    out = tmp_path / 'study'
    p = study(out)
    assert p.returncode == 0 and 'no claim has both of its sides' in p.stdout, p.stdout[-2000:]
    copy = tmp_path / 'elsewhere' / 'copy'
    shutil.copytree(out, copy); shutil.rmtree(out)
    (copy / '.lock').unlink()
    p = study(copy, '--resume', cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (copy / read_results(copy / 'results.csv')[0]['run'] / 'metrics.csv').is_file()
    kept = (copy / 'results.csv').read_bytes()      # continued with another recipe: refused with what differs, nothing run
    p = study(copy, '--resume', '--epochs', '2', cwd=tmp_path)
    assert p.returncode == 2 and 'vit_48 seed 0' in p.stderr and '--epochs 1 there, --epochs 2 here' in p.stderr, p.stderr[-2000:]
    assert 'Traceback' not in p.stderr and (copy / 'results.csv').read_bytes() == kept
