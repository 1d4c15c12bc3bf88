"""The study's command line (chapter 20d, `t2t_course.study.cli`): `t2t_study --quick` writes results.csv, its report
and figures; it resumes with nothing left to run and refuses a second study in its folder; a row re-runs from its
recorded arguments to the same accuracy; tools/study_progress.py keeps a study and restores it; bad arguments get clear
messages."""
import csv, shlex
from pathlib import Path

import pytest

from t2t_course.study import read_results
from t2t_course.train.cli import main

from tests.support.commands import REPO, call, run, warm_study


def test_t2t_study_quick_writes_results_resumes_and_reproduces(tmp_path):
    out = tmp_path / 'study'
    p = run(['-m', 't2t_course.study', '--quick', '--output', str(out), '--no-progress'], timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_results(out / 'results.csv')
    assert len(rows) == 10 and {r['seed'] for r in rows} == {0, 1}
    assert {'model', 'family', 'seed', 'val_acc1', 'params', 'macs', 'train_s', 'torch', 'threads', 'args', 'run', 'curve'} <= set(rows[0])
    assert all((out / r['run'] / 'metrics.csv').is_file() and not Path(r['run']).is_absolute() for r in rows)
    assert (out / 'families.png').read_bytes()[:4] == b'\x89PNG' and (out / 'curves.png').is_file()
    assert (out / 'report.md').read_text().startswith('| model | family | seeds | top-1 % |') and '| (a) t2t_64 vs hard |' in (out / 'report.md').read_text()
    assert '(a) t2t_64 vs hard' in p.stdout and '95% interval' in p.stdout
    row = next(r for r in rows if r['model'] == 'vit_48' and r['seed'] == 1)   # one row, re-run from its recorded arguments
    code, _, err = call(main, shlex.split(row['args']) + ['--output', str(tmp_path / 'again'), '--no-progress'])
    assert code == 0, err
    again = list(csv.DictReader(open(tmp_path / 'again' / 'metrics.csv')))[-1]
    assert float(again['val_acc1']) == pytest.approx(row['val_acc1'], abs=1e-6)
    code, _, err = call(warm_study, ['--quick', '--output', str(out), '--resume', '--no-progress'])   # in this process:
    assert code == 0 and len(read_results(out / 'results.csv')) == len(rows), err[-2000:]       # nothing left to run
    code, _, err = call(warm_study, ['--quick', '--output', str(out), '--no-progress'])
    assert code == 2 and 'already holds a study' in err
    progress = _study_progress()   # kept in a repository folder, restored into a new study, continued with nothing to run
    keep, new = tmp_path / 'kept', tmp_path / 'continued'
    progress.save(out, keep)
    assert (keep / 'results.csv').read_text() == (out / 'results.csv').read_text()
    channels = list(csv.DictReader(open(keep / 'channels.csv')))
    assert {(c['model'], int(c['seed'])) for c in channels} == {(r['model'], r['seed']) for r in rows if r['family']}
    assert sorted(f.name for f in (keep / 'checkpoints').iterdir()) == ['t2t_64_seed0.pth', 'vit_64_seed0.pth']
    progress.save(out, keep)                                                      # again: nothing new, nothing doubled
    assert len(list(csv.DictReader(open(keep / 'channels.csv')))) == len(channels)
    progress.restore(keep, new)
    with pytest.raises(SystemExit, match='already holds a results.csv'): progress.restore(keep, new)
    code, _, err = call(warm_study, ['--quick', '--output', str(new), '--resume', '--no-progress'])
    assert code == 0 and (new / 'results.csv').read_text() == (out / 'results.csv').read_text(), err[-2000:]


def _study_progress():
    "tools/study_progress.py as a module."
    import importlib.util
    spec = importlib.util.spec_from_file_location('study_progress', REPO / 'tools' / 'study_progress.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize('argv, message', [(['--models', 'nope'], '--models must be labels of the claims grid'),
                                           (['--models', 't2t64'], "'t2t64' is not one; did you mean 't2t_64'"),
                                           (['--data', '/no/such/folder'], 'neither a built-in dataset nor a folder'),
                                           (['--jobs', '0'], '--jobs must be positive'),
                                           (['--seeds', '0', '0'], '--seeds must be distinct'),
                                           (['--quick', '--output', '/tmp/never', '--train-args', '--seed', '3'],
                                            'the study sets --seed itself')])
def test_t2t_study_bad_arguments(argv, message):
    code, _, err = call(warm_study, argv)
    assert code == 2 and message in err, err
