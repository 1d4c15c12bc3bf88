"""The experiments (chapters 11, 20): the main job on a real token grid, the cluttered digits and their tuning split,
the claims grid's families and ablations, the statistics of the verdicts (t-intervals, matched MACs and parameters
read off family curves, never extrapolated), and the study command (t2t_study): results.csv, resume, reproducing a
row from its recorded arguments, the ImageNet plan, bad arguments."""
import csv, json, shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from test_train import REPO, call, run
from t2t_course.train.cli import main
from t2t_course.train.config import TrainConfig
from t2t_course.data import ImageFolderDataset, cluttered_digits_folder, cluttered_tune_folder
from t2t_course.data.datasets import FOLDER_MARKER, folder_files
from t2t_course.models.t2t_vit import create_model
from t2t_course.study import (CLAIMS, EPOCHS, GRIDS, FAMILY_LR, TUNE_EPOCHS, WARMUP, budget_table, claim_table, complete_seeds, family_table,
                              grid_models, interpolate, family_curve, read_results, report, seeds_to_settle, study_main, summarize,
                              t_interval, verdict)
from support.warm import WarmPopen


def warm_study(argv):
    "`t2t_study`'s entry point in this process, its runs forked warm (tests/support/warm.py) instead of started fresh."
    return study_main(argv, popen=WarmPopen)


def test_main_job_runs_on_a_real_grid():
    "t2t_train without flags: 64 px, so the backbone sees 4 x 4 = 16 tokens and every soft split works on a real grid."
    cfg = TrainConfig().resolve()
    assert cfg.data == 'digits' and cfg.img_size >= 64
    t2t = create_model(cfg.model, num_classes=10, img_size=cfg.img_size, **cfg.model_kwargs).tokens_to_token
    H0 = t2t.soft_split0.output_size((cfg.img_size,) * 2); H1 = t2t.soft_split1.output_size(H0)
    assert min(H0) >= 16 and min(H1) >= 8 and t2t.num_patches >= 16


def test_readme_reports_the_committed_claims_grid():
    "The README's experiments tables are the committed claims grid's report on its whole seeds, as chapter 20 prints it, digit for digit."
    kept = read_results(REPO / 'nbs' / 'study' / 'claims' / 'results.csv')
    rows = complete_seeds(kept, grid_models('claims'))
    assert rows and {r['epochs'] for r in rows} == {EPOCHS}
    readme = (REPO / 'README.md').read_text()
    for table in report(rows, markdown=True).split('\n\n'):
        assert table in readme, f"README.md's experiments section is not the committed rows' report; it should hold:\n{table}"


def _committed_grid_numbers():
    """Every number a text may quote from a committed run of the claims grid (today's and the earlier ones kept beside it):
    each claim's interval (difference, low, high) at every size `family_table` reads, and per model its seed mean and
    every single run's top-1."""
    intervals, accs = set(), {}
    for f in [REPO / 'nbs' / 'study' / 'claims' / 'results.csv', *sorted((REPO / 'nbs' / 'study').glob('claims_*.csv'))]:
        rows = complete_seeds(read_results(f), grid_models('claims'))
        intervals |= {(c['diff'], c['lo'], c['hi']) for c in claim_table(rows) + family_table(rows) if c['n']}
        for r in rows: accs.setdefault(r['model'], set()).add(r['val_acc1'])
        for s in summarize(rows): accs[s['model']].add(s['acc_mean'])
    return intervals, accs


def _quotes(text:str, pattern):
    "The matches of `pattern` in `text`, with any run of white space (a line break of the prose) read as one space."
    return pattern.findall(' '.join(text.split()))


def test_the_texts_quote_the_committed_grid():
    """The prose of chapters 20 and 21 and of the README quotes the grid's numbers by hand: every interval written as
    `+8.0 [+3.3, +12.7]` (or `+8.0 points [...]`) is one the committed rows give, to the digits written, and so is every
    top-1 written after a model's label (`t2t_64 89.1%`: a seed mean or one run). A grid re-run without the prose
    rewritten fails here."""
    import re
    intervals, accs = _committed_grid_numbers()
    num = r'([+-]\d+\.\d+)'
    interval = re.compile(num + r'(?: points)? \[' + num + ', ' + num + r'\]')
    top1 = re.compile(r'`?\b(' + '|'.join(accs) + r')\b`?:? (?:reaches |at )?(\d+\.\d+)%')
    texts = {'README.md': (REPO / 'README.md').read_text()}
    for nb in ('20a_grids', '20b_runner', '20c_analysis', '21_visualise'):
        cells = json.loads((REPO / 'nbs' / f'{nb}.ipynb').read_text())['cells']
        texts[nb] = '\n\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'markdown')
    same = lambda quoted, x: round(x, len(quoted.split('.')[1])) == float(quoted)
    checked, wrong = 0, []
    for name, text in texts.items():
        for q in _quotes(text, interval):
            checked += 1
            if not any(all(same(a, b) for a, b in zip(q, iv)) for iv in intervals): wrong.append(f"{name}: {q[0]} [{q[1]}, {q[2]}]")
        for label, acc in _quotes(text, top1):
            checked += 1
            if not any(same(acc, x) for x in accs[label]): wrong.append(f"{name}: {label} {acc}%")
    assert not wrong, "quoted, but no committed run of the claims grid gives it (to the digits written):\n" + '\n'.join(wrong)
    assert checked >= 20   # the verdicts of chapter 20 and the README are quoted, not only tabulated


def test_complete_seeds_keeps_whole_seeds_only():
    rows = [dict(model=m, seed=s) for s in (0, 1) for m in 'ab'] + [dict(model='a', seed=2)]
    assert {r['seed'] for r in complete_seeds(rows)} == {0, 1}
    assert complete_seeds(rows, ['a']) == rows and complete_seeds(rows, ['a', 'c']) == []

def test_cluttered_digits_split_by_source_and_trainable(tmp_path, monkeypatch):
    """The built folders' counts and splits (by source digit; the tune split inside the training split), then one epoch
    of `t2t_train --data cluttered_digits` through the registered name and its recipe, on a copy of the built folder
    cut to 12 images per class (a folder with its own record, in a cache folder of its own): the same path from the
    name to the checkpoint as on the whole folder, whose epoch costs a minute of CPU (chapter 20's grid trains on it)."""
    root, tune = cluttered_digits_folder(), cluttered_tune_folder()
    train, val = ImageFolderDataset(root / 'train'), ImageFolderDataset(root / 'val')
    src = lambda ds: {Path(p).name.split('_')[0] for p, _ in ds.samples}
    assert (len(train), len(val)) == (11496, 1440) and not src(train) & src(val)
    record = json.loads((root / FOLDER_MARKER).read_text())
    assert record['canvas'] == 64
    fit, held = ImageFolderDataset(tune / 'train'), ImageFolderDataset(tune / 'val')
    assert src(fit) | src(held) == src(train) and not src(fit) & src(held) and not src(held) & src(val)  # val is never used
    cut = tmp_path / 'cache' / root.name
    for split in ('train', 'val'):
        for c in sorted(d.name for d in (root / split).iterdir()):
            (cut / split / c).mkdir(parents=True)
            for f in sorted((root / split / c).iterdir())[:12]: (cut / split / c / f.name).symlink_to(f)
    (cut / FOLDER_MARKER).write_text(json.dumps(dict(record, files=folder_files(cut))))
    monkeypatch.setenv('T2T_COURSE_CACHE', str(tmp_path / 'cache'))
    assert cluttered_digits_folder() == cut
    code, out, err = call(main, ['--data', 'cluttered_digits', '--epochs', '1', '--model-kwargs', 'embed_dim=32', 'depth=1',
                                 'num_heads=2', 'mlp_ratio=2.0', 'token_dim=16', '--no-progress', '--output', str(tmp_path / 'run')])
    assert code == 0, err
    ck = torch.load(tmp_path / 'run' / 'last.pth', weights_only=True)
    assert ck['config']['data'] == 'cluttered_digits' and ck['config']['img_size'] == 64 and len(ck['classes']) == 10
    assert 'on cluttered digits: ' in out and '(120 train / 120 val images, 10 classes), 64 px' in out, out


def test_the_claims_grid_has_families_whose_ranges_overlap():
    rows = {r['label']: r for r in budget_table('claims')}
    models = {sm.label: sm for sm in GRIDS['claims']['models']}
    fams = {f: [l for l, sm in models.items() if sm.family == f] for f in ('T2T-ViT', 'ViT', 'ResNet')}
    assert all(len(v) >= 3 for v in fams.values()) and {'hard', 'wide', 't2t_t'} <= set(rows)
    ref = rows['t2t_64']
    for f in ('ViT', 'ResNet'):   # the reference size of the ablations lies inside both other families' ranges
        for by in ('macs', 'params'):
            xs = [rows[l][by] for l in fams[f]]
            assert min(xs) < ref[by] < max(xs), (f, by)
    for label, tol in (('wide', .1), ('hard', .15), ('t2t_t', .01)):   # the ablations at matched parameters
        assert abs(rows[label]['params'] / ref['params'] - 1) < tol
    assert abs(rows['wide']['macs'] / ref['macs'] - 1) < .1
    assert all(sm.train_args[:2] == ('--lr', f"{FAMILY_LR[sm.family or 'T2T-ViT']:g}") for sm in models.values())
    assert GRIDS['claims']['seeds'] == (0, 1, 2, 3, 4) and GRIDS['tune']['data'] == 'cluttered_digits_tune'
    # the tune grid ran once, short (5 epochs, half an epoch of warm-up); the claims grid trains until the curves flatten
    assert (GRIDS['tune']['epochs'], GRIDS['claims']['epochs']) == (TUNE_EPOCHS, EPOCHS) and TUNE_EPOCHS < EPOCHS
    assert all(sm.train_args[2:4] == WARMUP for sm in models.values())


def _rows(label, accs, family='', macs=1, params=1):
    return [dict(model=label, family=family, seed=s, val_acc1=a, ema_val_acc1=a, params=params, macs=macs, train_s=10.)
            for s, a in enumerate(accs)]


def test_t_interval_and_the_one_rule():
    mean, lo, hi = t_interval([1., 2., 3., 4., 5.])
    assert mean == 3 and hi - mean == pytest.approx(2.776445 * np.std([1, 2, 3, 4, 5], ddof=1) / 5 ** .5, rel=1e-5)
    assert (verdict(0.5, 2.), verdict(-2., -0.5), verdict(-1., 1.)) == ('holds', 'reversed', 'not settled at this scale')
    assert verdict(-0.8, 0.5, margin=-1.) == 'holds'                        # a non-inferiority claim: above -1 point
    assert seeds_to_settle([1., -1., 2., 0., 1.]) > 5 and seeds_to_settle([0., 0.1, -0.1, 0., 0.]) is None


def test_family_curves_interpolate_in_log_cost_and_never_extrapolate():
    r = _rows('s', [10, 20], 'F', macs=1e6) + _rows('l', [30, 40], 'F', macs=1e8)
    c = family_curve(r, 'F')
    assert interpolate(c, 1e7, 0) == pytest.approx(20) and interpolate(c, 1e7, 1) == pytest.approx(30)   # halfway in log
    assert interpolate(c, 1e9, 0) is None and interpolate(c, 1e5, 0) is None


def test_claim_verdicts_on_made_up_results():
    r = (_rows('t2t_64', [80, 81, 82, 80, 81], 'T2T-ViT', 6e6, 2e5) + _rows('t2t_48', [75, 76, 77, 75, 76], 'T2T-ViT', 5e6, 1e5)
         + _rows('t2t_96', [85, 86, 85, 86, 85], 'T2T-ViT', 1e7, 5e5)
         + _rows('hard', [70, 71, 72, 70, 71]) + _rows('wide', [90, 91, 92, 90, 91]) + _rows('t2t_t', [80, 80, 81, 80, 80])
         + _rows('vit_48', [60, 61, 62, 60, 61], 'ViT', 2e6, 1e5) + _rows('vit_96', [70, 71, 72, 70, 71], 'ViT', 9e6, 5e5))
    v = {(c['claim'], c['comparison']): c for c in claim_table(r)}
    assert v['a', 'same seed']['verdict'] == 'holds' and v['c', 'same seed']['verdict'] == 'reversed'
    assert v['d', 'same seed']['verdict'] == 'holds' and v['d', 'same seed']['diff'] == pytest.approx(0.6)
    assert v['b', 'matched MACs']['at'] == 't2t_64' and v['b', 'matched MACs']['verdict'] == 'holds'
    assert v['b', 'matched params']['verdict'] == 'holds'
    assert not any(k[0] in 'ef' for k in v)          # no ResNet in these results: those claims are left out
    at = {row['at'] for row in family_table(r) if row['comparison'] == 'matched MACs'}
    assert at == {'t2t_48', 't2t_64'}                # t2t_96 (10M MACs) lies outside ViT's range (2M-9M): not extrapolated
    s = {x['model']: x for x in summarize(r)}
    assert s['t2t_64']['acc_mean'] == 80.8 and s['t2t_64']['family'] == 'T2T-ViT'


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
                                           (['--data', '/no/such/folder'], 'neither a built-in dataset nor a folder'),
                                           (['--jobs', '0'], '--jobs must be positive'),
                                           (['--seeds', '0', '0'], '--seeds must be distinct'),
                                           (['--quick', '--output', '/tmp/never', '--train-args', '--seed', '3'],
                                            'the study sets --seed itself')])
def test_t2t_study_bad_arguments(argv, message):
    code, _, err = call(warm_study, argv)
    assert code == 2 and message in err, err
