"""The built-in datasets (chapter 11e, `t2t_course.data.datasets`): the digits folder against scikit-learn's arrays
(also when another process wins the race to publish it, and with two processes building it at once); a built folder
changed afterwards is refused with the difference named, and stale builds are deleted; the cluttered digits and their
tuning split (split by source digit), and one epoch of `t2t_train --data cluttered_digits`."""
import json, os, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import t2t_course.data.datasets as datasets  # the built-in datasets' module (chapter 11e)
from t2t_course.data import (FOLDER_MARKER, ImageFolderDataset, build_folder_once, cluttered_digits_folder,
                             cluttered_tune_folder, digits_folder)
from t2t_course.data.datasets import folder_files
from t2t_course.train.cli import main

from tests.support.commands import PY, REPO, call
from tests.support.warm import WarmPopen


def test_digits_folder(tmp_path, monkeypatch):
    from sklearn.datasets import load_digits
    ref = load_digits()
    monkeypatch.setenv('T2T_COURSE_CACHE', str(tmp_path / 'cache'))
    root = digits_folder()
    assert root == tmp_path / 'cache' / 'digits' and (root / FOLDER_MARKER).is_file()
    train, val = ImageFolderDataset(root / 'train'), ImageFolderDataset(root / 'val')
    assert (len(train), len(val)) == (1437, 360)
    assert train.classes == val.classes == [str(c) for c in range(10)]
    per_class = np.bincount(train.targets, minlength=10) + np.bincount(val.targets, minlength=10)
    assert per_class.tolist() == np.bincount(ref.target).tolist()
    assert np.all(np.abs(np.bincount(val.targets) - 0.2 * np.bincount(ref.target)) <= 1)  # stratified
    stems = [int(Path(p).stem) for p, _ in train.samples + val.samples]
    assert sorted(stems) == list(range(1797))  # every image exactly once
    for k in (0, 500, 1436):
        p, t = train.samples[k]
        i = int(Path(p).stem)
        with Image.open(p) as im: assert im.mode == 'L' and im.size == (8, 8); px = np.asarray(im)
        assert int(train.classes[t]) == ref.target[i]
        assert np.abs(px.astype(float) - ref.images[i] * 255 / 16).max() <= 0.5
    # idempotent: the second call reuses the folder without rewriting it
    mtime = (root / FOLDER_MARKER).stat().st_mtime_ns
    assert digits_folder(tmp_path / 'cache') == root and (root / FOLDER_MARKER).stat().st_mtime_ns == mtime
    # the split is the same in another cache
    other = digits_folder(tmp_path / 'other')
    assert sorted(p.name for p in (other / 'val').rglob('*.png')) == sorted(p.name for p in (root / 'val').rglob('*.png'))
    # an incomplete folder is an error, not silently reused
    (tmp_path / 'broken' / 'digits' / 'train').mkdir(parents=True)
    with pytest.raises(ValueError, match='incomplete'): digits_folder(tmp_path / 'broken')


def test_digits_folder_lost_race(tmp_path, monkeypatch):
    "Another process publishes its copy while we write ours: our rename fails, we use theirs and leave no temp folder."
    real = datasets._write_digits
    def write_and_lose(folder, *a, **kw):
        counts = real(folder, *a, **kw)
        theirs = tmp_path / 'theirs'
        (theirs / FOLDER_MARKER).parent.mkdir(parents=True)
        (theirs / FOLDER_MARKER).write_text(json.dumps(real(theirs)))  # a finished copy, as build_folder_once publishes it
        os.rename(theirs, tmp_path / 'digits')  # the other process wins
        (tmp_path / 'digits' / 'winner').write_text('theirs')
        return counts
    monkeypatch.setattr(datasets, '_write_digits', write_and_lose)
    root = digits_folder(tmp_path)
    assert (root / 'winner').read_text() == 'theirs'
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith('.digits-')] == []


def test_digits_folder_two_processes_at_once(tmp_path):
    code = 'import sys; from t2t_course.data import digits_folder; print(digits_folder(sys.argv[1]))'
    env = {**os.environ, 'PYTHONPATH': str(REPO)}
    procs = [WarmPopen([PY, '-c', code, str(tmp_path)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert {o.strip() for o, _ in outs} == {str(tmp_path / 'digits')}
    assert sorted(p.name for p in tmp_path.iterdir()) == ['digits']  # no temp folder left behind
    assert len(list((tmp_path / 'digits').rglob('*.png'))) == 1797


@pytest.mark.parametrize('change', ['image deleted', 'class folder added', 'record unreadable', 'killed build'])
def test_builtin_dataset_is_verified_on_use(change, tmp_path):
    "A built-in dataset folder changed after its build is refused with the difference named; stale builds are deleted."
    root = digits_folder(tmp_path)
    if change == 'image deleted':
        victim = sorted((root / 'train' / '3').iterdir())[0]; victim.unlink()
        with pytest.raises(ValueError, match=r"was changed after it was built \(train/3: 1\d\d files, built with 1\d\d\)"):
            digits_folder(tmp_path)
    elif change == 'class folder added':
        (root / 'val' / 'x').mkdir(); Image.new('L', (8, 8)).save(root / 'val' / 'x' / 'a.png')
        with pytest.raises(ValueError, match=r"val/x was not built.*delete the folder and it is built again"):
            digits_folder(tmp_path)
    elif change == 'record unreadable':
        (root / '.complete.json').write_text('{not json')
        with pytest.raises(ValueError, match=r"its record .complete.json cannot be read"):
            digits_folder(tmp_path)
    else:
        dead = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True)
        stale = tmp_path / f'.other-{int(dead.stdout)}-abc123-build'; stale.mkdir(); (stale / 'half.png').write_bytes(b'x')
        alive = tmp_path / f'.other-{os.getpid()}-def456-build'; alive.mkdir()
        build_folder_once(tmp_path / 'other', lambda tmp: (tmp / 'train' / 'a').mkdir(parents=True) or {})
        assert not stale.exists() and alive.exists() and (tmp_path / 'other' / 'train' / 'a').is_dir()
        return


# ------------------------------------------------------------------ the cluttered digits
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


# ------------------------------------------------------------------ what a folder of classes holds (issue 47)
def test_hidden_folders_are_named_and_training_needs_two_classes(tmp_path):
    from t2t_course.data.datasets import check_classes, class_folders
    for c in ('cats', '.dogs', '...'): (tmp_path / c).mkdir()
    (tmp_path / '.dogs' / 'a.jpg').write_bytes(b'x')
    classes, skipped = class_folders(tmp_path)
    assert classes == ['cats'] and [n for n, _ in skipped] == ['...', '.dogs'] and '1 entry' in skipped[1][1]
    assert check_classes(tmp_path)[0] == ['cats']  # evaluation and prediction: one class will do
    with pytest.raises(ValueError, match=r"has 1 class folder \(cats\): training a classifier needs at least 2; skipped \.\.\., \.dogs"):
        check_classes(tmp_path, 2)


def test_a_cache_that_cannot_be_written_is_named(tmp_path):
    from t2t_course.data.datasets import build_folder_once
    with pytest.raises(ValueError, match=r"cannot write /proc/no_such/digits \(.*\): .*T2T_COURSE_CACHE"):
        build_folder_once('/proc/no_such/digits', lambda tmp: {})
