"""Sorting the ILSVRC2012 validation images (chapter 11f, `t2t_course.data.imagenet_val`): the labels in every format
(the devkit's ground truth with its meta.mat, the devkit archive, Kaggle's CSV, a text map), read as torchvision's own
devkit parser reads them; the reorganiser as a function (move, copy, symlink, dry run, its errors, a hidden class name)
and as a command (`python -m t2t_course.data`, which is t2t_prepare_val)."""
import os, tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from t2t_course.data import ImageFolderDataset, prepare_imagenet_val, prepare_val_cli, read_val_labels

from tests.support.commands import PY, REPO
from tests.support.warm import warm_run


def _run(*args, **kw):
    "Run `python args...` from the repo root with the package importable."
    env = {**os.environ, 'PYTHONPATH': str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', '')}
    return warm_run([PY, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, **kw)


WNIDS = {1: 'n02119789', 2: 'n02100735', 3: 'n02110185', 4: 'n02096294'}
GT = [3, 1, 4, 1, 2, 2, 4]  # ILSVRC2012_IDs of images 1..7


def _fake_meta_mat(path):
    "A meta.mat in the devkit's layout: a (n, 1) struct array `synsets`, leaves first, then a non-leaf synset."
    from scipy.io import savemat
    fields = ['ILSVRC2012_ID', 'WNID', 'words', 'gloss', 'num_children', 'children', 'wordnet_height',
              'num_train_images']
    rows = [(i, w, f'class {i}, alias', 0) for i, w in WNIDS.items()] + [(1001, 'n00001740', 'entity', 2)]
    arr = np.zeros((len(rows), 1), dtype=[(f, 'O') for f in fields])
    for k, (i, w, words, nc) in enumerate(rows):
        arr[k, 0] = (np.array([[i]], np.uint16), np.array([w]), np.array([words]), np.array(['gloss']),
                     np.array([[nc]], np.uint16), np.arange(1, nc + 1, dtype=np.uint16).reshape(1, -1),
                     np.array([[0]], np.uint16), np.array([[1300]], np.uint16))
    savemat(path, {'synsets': arr})
    return path


def _flat_val(folder, n=len(GT)):
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(1, n + 1): Image.new('RGB', (6, 6), (30 * k, 0, 0)).save(folder / f'ILSVRC2012_val_{k:08d}.JPEG')
    return folder


@pytest.fixture
def labels(tmp_path):
    "The same labels in the three formats plus the devkit archive; returns a dict of paths and the expected mapping."
    kit = tmp_path / 'ILSVRC2012_devkit_t12' / 'data'
    kit.mkdir(parents=True)
    _fake_meta_mat(kit / 'meta.mat')
    (kit / 'ILSVRC2012_validation_ground_truth.txt').write_text('\n'.join(map(str, GT)) + '\n')
    tgz = tmp_path / 'ILSVRC2012_devkit_t12.tar.gz'
    with tarfile.open(tgz, 'w:gz') as tar: tar.add(tmp_path / 'ILSVRC2012_devkit_t12', arcname='ILSVRC2012_devkit_t12')
    expected = {f'ILSVRC2012_val_{k:08d}.JPEG': WNIDS[i] for k, i in enumerate(GT, start=1)}
    csv_path = tmp_path / 'LOC_val_solution.csv'
    lines = ['ImageId,PredictionString'] + [f'{Path(n).stem},{w} 1 2 3 4 {w} 5 6 7 8' for n, w in reversed(expected.items())]
    csv_path.write_text('\n'.join(lines) + '\n')
    txt = tmp_path / 'val_map.txt'
    txt.write_text('# filename wnid\n' + ''.join(f'{n} {w}\n' for n, w in expected.items()))
    return dict(gt=kit / 'ILSVRC2012_validation_ground_truth.txt', meta=kit / 'meta.mat', tgz=tgz, csv=csv_path,
                txt=txt), expected


def test_fake_devkit_matches_torchvision_parser(labels, tmp_path, monkeypatch):
    "torchvision's own devkit parser reads our fake archive, and agrees with read_val_labels."
    import torchvision.datasets.imagenet as tvi
    paths, expected = labels
    monkeypatch.setattr(tvi, '_verify_archive', lambda *a, **k: None)  # our archive is not the real one (md5)
    out = tmp_path / 'tv'; out.mkdir()
    import shutil; shutil.copy(paths['tgz'], out / 'ILSVRC2012_devkit_t12.tar.gz')
    tvi.parse_devkit_archive(str(out))
    wnid_to_classes, val_wnids = torch.load(out / tvi.META_FILE, weights_only=False)
    assert val_wnids == list(expected.values())
    assert set(wnid_to_classes) == set(WNIDS.values())  # the non-leaf synset is ignored
    assert [w for _, w in read_val_labels(paths['tgz'])] == val_wnids


@pytest.mark.parametrize('fmt', ['gt', 'tgz', 'csv', 'txt'])
def test_prepare_val_all_formats(labels, tmp_path, fmt):
    paths, expected = labels
    val = _flat_val(tmp_path / 'val')
    plan = prepare_imagenet_val(val, paths[fmt], dry_run=True)
    assert plan['placed'] == 7 and plan['classes'] == 4 and len(list(val.glob('*.JPEG'))) == 7  # dry run: untouched
    done = prepare_imagenet_val(val, paths[fmt])
    assert (done['placed'], done['already'], done['labels']) == (7, 0, 7)
    assert list(val.glob('*.JPEG')) == []
    got = {p.name: p.parent.name for p in val.glob('*/*.JPEG')}
    assert got == expected
    again = prepare_imagenet_val(val, paths[fmt])  # idempotent
    assert (again['placed'], again['already']) == (0, 7)
    ds = ImageFolderDataset(val, classes=sorted(WNIDS.values()))
    assert len(ds) == 7


@pytest.mark.parametrize('mode', ['copy', 'symlink'])
def test_prepare_val_copy_and_symlink(labels, tmp_path, mode):
    paths, expected = labels
    val = _flat_val(tmp_path / 'val')
    dest = tmp_path / 'sorted'
    done = prepare_imagenet_val(val, paths['csv'], dest=dest, mode=mode)
    assert done['placed'] == 7 and len(list(val.glob('*.JPEG'))) == 7  # the originals stay
    got = {p.name: p.parent.name for p in dest.glob('*/*.JPEG')}
    assert got == expected
    for p in dest.glob('*/*.JPEG'):
        assert p.is_symlink() == (mode == 'symlink')
        assert p.read_bytes() == (val / p.name).read_bytes()
    assert list(dest.rglob('*.part')) == []
    assert prepare_imagenet_val(val, paths['csv'], dest=dest, mode=mode)['already'] == 7


def test_prepare_val_errors(labels, tmp_path):
    paths, _ = labels
    # a labelled image is missing
    val = _flat_val(tmp_path / 'v1', n=6)
    with pytest.raises(FileNotFoundError, match=r'1 of the 7 labelled images.*ILSVRC2012_val_00000007'):
        prepare_imagenet_val(val, paths['txt'])
    assert len(list(val.glob('*.JPEG'))) == 6  # checked before touching anything
    # an image without a label
    val = _flat_val(tmp_path / 'v2', n=8)
    with pytest.raises(ValueError, match=r'count mismatch: 1 images .*ILSVRC2012_val_00000008'):
        prepare_imagenet_val(val, paths['gt'])
    assert len(list(val.glob('*.JPEG'))) == 8
    # refuses to overwrite
    val = _flat_val(tmp_path / 'v3')
    (val / 'n02119789').mkdir(); (val / 'n02119789' / 'ILSVRC2012_val_00000002.JPEG').write_bytes(b'other')
    with pytest.raises(FileExistsError, match='ILSVRC2012_val_00000002.JPEG already exists'):
        prepare_imagenet_val(val, paths['gt'])
    assert (val / 'n02119789' / 'ILSVRC2012_val_00000002.JPEG').read_bytes() == b'other'
    # ground truth without meta.mat
    lone = tmp_path / 'lone_gt.txt'; lone.write_text(paths['gt'].read_text())
    with pytest.raises(FileNotFoundError, match='meta.mat'): read_val_labels(lone)
    assert len(read_val_labels(lone, meta=paths['meta'])) == 7
    # a class-number map is not a wnid map; malformed lines; missing files; meta.mat as labels
    bad = tmp_path / 'caffe_val.txt'; bad.write_text('ILSVRC2012_val_00000001.JPEG 65\n')
    with pytest.raises(ValueError, match='must be a wnid'): read_val_labels(bad)
    bad.write_text('just_one_column\n')
    with pytest.raises(ValueError, match="line 1: expected 'filename wnid'"): read_val_labels(bad)
    with pytest.raises(FileNotFoundError, match='nope.txt'): read_val_labels(tmp_path / 'nope.txt')
    with pytest.raises(ValueError, match='class table'): read_val_labels(paths['meta'])
    with pytest.raises(FileNotFoundError, match='does not exist'): prepare_imagenet_val(tmp_path / 'none', paths['txt'])
    with pytest.raises(ValueError, match='mode'): prepare_imagenet_val(val, paths['txt'], mode='hardlink')


def test_a_hidden_class_name_is_refused(tmp_path):
    val = tmp_path / 'val'; val.mkdir()
    Image.new('RGB', (8, 8)).save(val / 'ILSVRC2012_val_00000001.JPEG')
    labels = tmp_path / 'labels.txt'; labels.write_text('ILSVRC2012_val_00000001.JPEG .n00\n')
    with pytest.raises(ValueError, match=r"class name '.n00' in the labels starts with '.'"):
        prepare_imagenet_val(val, labels)


def test_prepare_val_cli(labels, tmp_path, capsys):
    paths, expected = labels
    val = _flat_val(tmp_path / 'val')
    assert prepare_val_cli([str(val), str(paths['gt']), '--meta', str(paths['meta']), '--dry-run']) == 0  # exit status
    assert 'dry run: would have moved 7 images into 4 class folders' in capsys.readouterr().out
    with pytest.raises(SystemExit) as e: prepare_val_cli([str(val), str(tmp_path / 'nope.txt')])
    assert e.value.code == 2 and 'nope.txt does not exist' in capsys.readouterr().err
    with pytest.raises(SystemExit): prepare_val_cli([str(val), str(paths['csv']), '--copy', '--symlink'])
    # as `python -m t2t_course.data`: help, then a real run
    r = _run('-m', 't2t_course.data', '--help')
    assert r.returncode == 0, r.stderr
    for word in ('VAL_DIR', 'LABELS', '--meta', '--dest', '--copy', '--symlink', '--dry-run', 'default', 'meta.mat',
                 'LOC_val_solution.csv', 'ILSVRC2012_devkit_t12.tar.gz'):
        assert word in r.stdout, word
    r = _run('-m', 't2t_course.data', str(val), str(paths['tgz']), '--symlink')
    assert r.returncode == 0, r.stderr
    assert 'linked 7 images into 4 class folders' in r.stdout
    assert {p.name: p.parent.name for p in val.glob('*/*.JPEG')} == expected


def test_ctrl_c_is_one_line_and_130(tmp_path, monkeypatch, capsys):
    import t2t_course.data.imagenet_val as iv
    def stop(*a, **k): raise KeyboardInterrupt
    monkeypatch.setattr(iv, 'prepare_imagenet_val', stop)
    with pytest.raises(SystemExit) as e: iv.prepare_val_cli([str(tmp_path), str(tmp_path / 'labels.txt')])
    err = capsys.readouterr().err
    assert e.value.code == 130 and 'interrupted' in err and len(err.strip().splitlines()) == 1, err
