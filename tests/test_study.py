"""The experiments (chapters 11, 20): the main job on a real token grid, the cluttered digits, and the study runner
and command (t2t_study): results.csv, resume, the claims' verdicts, bad arguments."""
import csv, json, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch

from test_train import PY, REPO, call, run
from t2t_course.cli import main
from t2t_course.config import TrainConfig
from t2t_course.data import ImageFolderDataset, cluttered_digits_folder
from t2t_course.models import create_model
from t2t_course.study import (GRIDS, budget_table, claim_table, grid_models, read_results, run_study, study_main,
                              summarize)


def test_main_job_runs_on_a_real_grid():
    "t2t_train without flags: 64 px, so the backbone sees 4 x 4 = 16 tokens and every soft split works on a real grid."
    cfg = TrainConfig().resolve()
    assert cfg.data == 'digits' and cfg.img_size >= 64
    t2t = create_model(cfg.model, num_classes=10, img_size=cfg.img_size, **cfg.model_kwargs).tokens_to_token
    H0 = t2t.soft_split0.output_size((cfg.img_size,) * 2); H1 = t2t.soft_split1.output_size(H0)
    assert min(H0) >= 16 and min(H1) >= 8 and t2t.num_patches >= 16


def test_cluttered_digits_split_by_source_and_trainable(tmp_path):
    root = cluttered_digits_folder()
    train, val = ImageFolderDataset(root / 'train'), ImageFolderDataset(root / 'val')
    src = lambda ds: {Path(p).name.split('_')[0] for p, _ in ds.samples}
    assert (len(train), len(val)) == (2874, 720) and not src(train) & src(val)
    assert json.loads((root / '.complete.json').read_text())['canvas'] == 64
    code, out, err = call(main, ['--data', 'cluttered_digits', '--epochs', '1', '--model-kwargs', 'embed_dim=32', 'depth=1',
                                 'num_heads=2', 'mlp_ratio=2.0', 'token_dim=16', '--no-progress', '--output', str(tmp_path / 'run')])
    assert code == 0, err
    ck = torch.load(tmp_path / 'run' / 'last.pth', weights_only=True)
    assert ck['config']['data'] == 'cluttered_digits' and ck['config']['img_size'] == 64 and len(ck['classes']) == 10


def test_the_claims_grid_matches_parameters():
    rows = budget_table('claims')
    params = [r['params'] for r in rows]
    assert {r['label'] for r in rows} == {'t2t', 't2t_t', 'hard', 'vit', 'wide'} and max(params) / min(params) < 1.1
    assert all(len(GRIDS[g]['models']) >= 4 for g in GRIDS)


def test_claim_verdicts_on_made_up_results():
    def rows(label, accs): return [dict(model=label, seed=s, val_acc1=a, ema_val_acc1=a, params=1, macs=1, train_s=10.)
                                   for s, a in enumerate(accs)]
    r = rows('t2t', [80, 81, 82]) + rows('hard', [70, 71, 72]) + rows('vit', [80, 82, 81]) + rows('wide', [90, 91, 92]) + rows('t2t_t', [81, 80, 82])
    v = {c['claim']: c['verdict'] for c in claim_table(r)}
    assert v == {'a': 'holds', 'b': 'within the spread', 'c': 'reversed', 'd': 'holds (same accuracy within the spread)'}
    s = {x['model']: x for x in summarize(r)}
    assert s['t2t']['acc_mean'] == 81 and s['t2t']['acc_std'] == pytest.approx(1.0)


def test_t2t_study_quick_writes_results_and_resumes(tmp_path):
    out = tmp_path / 'study'
    p = run(['-m', 't2t_course.study', '--quick', '--output', str(out), '--no-progress'], timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = list(csv.DictReader(open(out / 'results.csv')))
    assert len({r['model'] for r in rows}) >= 4
    assert {'model', 'seed', 'val_acc1', 'params', 'macs', 'train_s'} <= set(rows[0])
    assert (out / 'summary.png').read_bytes()[:4] == b'\x89PNG' and (out / 'curves.png').is_file()
    assert '(a) t2t vs hard' in p.stdout
    p = run(['-m', 't2t_course.study', '--quick', '--output', str(out), '--resume', '--no-progress'], timeout=300)
    assert p.returncode == 0 and len(read_results(out / 'results.csv')) == len(rows), p.stderr[-2000:]
    p = run(['-m', 't2t_course.study', '--quick', '--output', str(out), '--no-progress'], timeout=300)
    assert p.returncode == 2 and 'already holds a study' in p.stderr and 'Traceback' not in p.stderr


@pytest.mark.parametrize('argv, message', [(['--models', 'nope'], '--models must be labels of the claims grid'),
                                           (['--data', '/no/such/folder'], 'neither a built-in dataset nor a folder'),
                                           (['--jobs', '0'], '--jobs must be positive')])
def test_t2t_study_bad_arguments(argv, message):
    code, _, err = call(study_main, argv)
    assert code == 2 and message in err, err
