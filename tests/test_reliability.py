"""Reliability of the newer paths (issue: the study, built-in datasets, t2t_predict, special files, the models): one
test function per kind of fault, the cases as parameters. The study's own faults are in test_study_faults.py."""
import json, os, subprocess, sys, warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import t2t_course
from support.warm import warm_run
from t2t_course.core import set_fast_paths
from t2t_course.data import ImageFolderDataset, build_folder_once, digits_folder, load_rgb, prepare_imagenet_val
from t2t_course.deploy import predict_main, read_image
from t2t_course.models.t2t_vit import CheckpointError, read_checkpoint
from t2t_course.train.optim import SetupError

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the models
EMPTY_KINDS = ['t2t_vit_7', 't2t_vit_t_14', 't2t_vit_14_wide', 't2t_vit_16_ghost', 't2t_vit_dense', 'vit_baseline',
               'resnet_baseline']


@pytest.mark.parametrize('fast', [True, False], ids=['fast', 'readable'])
@pytest.mark.parametrize('name', EMPTY_KINDS)
def test_models_accept_an_empty_batch(name, fast):
    "A batch of 0 images gives 0 rows of logits (the fast soft split used to fail reshaping 0 elements)."
    kw = {} if name == 'resnet_baseline' else dict(embed_dim=64, depth=2, num_heads=2)
    if name in ('t2t_vit_14_wide', 't2t_vit_16_ghost', 't2t_vit_dense'): kw = {}
    model = t2t_course.create_model(name, img_size=64, num_classes=10, **kw).eval()
    set_fast_paths(model, fast)
    with torch.no_grad(): out = model(torch.zeros(0, 3, 64, 64))
    assert out.shape == (0, 10)


# ------------------------------------------------------------------ special files
def _fifo(path):
    os.mkfifo(path)
    return path


@pytest.mark.parametrize('where', ['data folder', 't2t_predict'])
def test_special_files_are_not_opened(where, tmp_path, trained):
    "A FIFO named like an image: skipped and named by the folder scan; one line and status 2 from t2t_predict."
    if where == 'data folder':
        for c in ('a', 'b'):
            (tmp_path / 'train' / c).mkdir(parents=True)
            Image.new('RGB', (8, 8), (255, 0, 0)).save(tmp_path / 'train' / c / 'ok.png')
        _fifo(tmp_path / 'train' / 'a' / 'pipe.JPEG')
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            ds = ImageFolderDataset(tmp_path / 'train')
        assert len(ds) == 2 and [Path(p).name for p, _ in ds.skipped_links] == ['pipe.JPEG']
        assert 'not a regular file' in str(w[0].message)
        return
    fifo = _fifo(tmp_path / 'pipe.jpg')  # were it opened, the command would block: the timeout fails the test
    cmd = [sys.executable, '-m', 't2t_course.deploy', str(fifo), '--checkpoint', str(trained), '--device', 'cpu']
    res = warm_run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 2 and 'Traceback' not in res.stderr, res.stderr
    assert 'is not a regular file (a FIFO, socket or device)' in res.stderr


# ------------------------------------------------------------------ t2t_predict reads as training does
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


def _odd_image(kind, path):
    if kind == '16-bit PNG':
        Image.fromarray((np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16)).save(path)
    elif kind == 'RGBA PNG':
        a = np.zeros((32, 32, 4), np.uint8); a[..., 0] = 200; a[:, 16:, 3] = 255  # left half transparent
        Image.fromarray(a, 'RGBA').save(path)
    elif kind == 'CMYK JPEG':
        Image.new('CMYK', (32, 32), (0, 255, 255, 0)).save(path)
    return path


@pytest.mark.parametrize('kind, suffix', [('16-bit PNG', '.png'), ('RGBA PNG', '.png'), ('CMYK JPEG', '.jpg')])
def test_predict_reads_images_as_training_does(kind, suffix, tmp_path):
    "t2t_predict's reader gives the pixels the training loader gives (16 bits scaled, alpha on white), not convert('RGB')'s."
    path = _odd_image(kind, tmp_path / f'img{suffix}')
    ours, loader = np.asarray(read_image(path)), np.asarray(load_rgb(path))
    assert ours.dtype == np.uint8 and np.array_equal(ours, loader)
    if kind == '16-bit PNG': assert abs(ours.mean() - 127.5) < 2, ours.mean()      # convert('RGB') gave 254.5
    if kind == 'RGBA PNG': assert (ours[:, :16] == 255).all()                      # the transparent half is white


def _bomb(path):
    "A small PNG whose header claims 20000 x 20000 pixels: over twice PIL's MAX_IMAGE_PIXELS, refused at open."
    import io, struct, zlib
    buf = io.BytesIO(); Image.new('L', (1, 1)).save(buf, 'PNG'); data = bytearray(buf.getvalue())
    ihdr = struct.pack('>II', 20000, 20000) + bytes(data[24:29])      # width, height, then depth, colour, ... as before
    data[16:29] = ihdr; data[29:33] = struct.pack('>I', zlib.crc32(b'IHDR' + ihdr))
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize('fmt', ['text', 'json'])
def test_predict_reports_every_image(fmt, tmp_path, trained):
    """Bad images among good ones, in one command: a decompression bomb and a text file named .jpg are each an error in
    the same output (status 2), the good ones' results are always printed, one of them a file whose name is not UTF-8
    (printed escaped under a strict UTF-8 stdout)."""
    good = tmp_path / 'good.png'
    Image.new('RGB', (40, 40), (10, 200, 30)).save(good)
    bomb = _bomb(tmp_path / 'bomb.png')
    text = tmp_path / 'notes.jpg'; text.write_text('not an image')
    odd = Path(os.fsdecode(bytes(tmp_path) + b'/caf\xe9.png'))  # Latin-1 bytes: not valid UTF-8
    Image.new('RGB', (40, 40)).save(os.fsencode(odd))
    cmd = [sys.executable, '-m', 't2t_course.deploy', str(good), str(bomb), str(odd), str(text), '--checkpoint', str(trained),
           '--device', 'cpu'] + (['--json'] if fmt == 'json' else [])
    res = warm_run([os.fsencode(a) for a in cmd], capture_output=True, timeout=120, cwd=REPO,
                         env=dict(os.environ, PYTHONIOENCODING='utf-8:strict'))
    out, err = res.stdout.decode('utf-8', 'replace'), res.stderr.decode('utf-8', 'replace')
    assert 'Traceback' not in err and 'Traceback' not in out, err
    assert res.returncode == 2, (res.returncode, err)
    if fmt == 'json':
        doc = json.loads(out)
        assert [p['image'] for p in doc['predictions']][0] == str(good) and '\\xe9' in doc['predictions'][1]['image']
        assert [Path(e['image']).name for e in doc['errors']] == ['bomb.png', 'notes.jpg']
        assert 'too large to decode safely' in doc['errors'][0]['error']
    else:
        assert f'{good}:' in out and out.count('%') == 8                      # 4 classes, top 4, for each good image
        assert 'too large to decode safely' in err and 'notes.jpg' in err


# ------------------------------------------------------------------ built-in datasets
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


# ------------------------------------------------------------------ smaller items
def _malicious(path):
    class Evil:
        def __reduce__(self): return (os.system, ('echo this should never run',))
    torch.save({'state_dict': Evil()}, path)


@pytest.mark.parametrize('item', ['num_classes -1', 'out_indices ()', 'workers above the CPUs', 'malicious pickle',
                                  'hidden class name'])
def test_smaller_items(item, tmp_path):
    if item == 'num_classes -1':
        with pytest.raises(ValueError, match=r'num_classes must be an int >= 0 .* got -1'):
            t2t_course.create_model('t2t_vit_7', num_classes=-1)
        model = t2t_course.create_model('t2t_vit_7', img_size=32)
        with pytest.raises(ValueError, match='num_classes must be an int >= 0'): model.reset_classifier(-3)
    elif item == 'out_indices ()':
        model = t2t_course.create_model('t2t_vit_7', img_size=32)
        with pytest.raises(ValueError, match=r'name at least one block \(of 7\)'):
            model.forward_intermediates(torch.zeros(1, 3, 32, 32), indices=())
    elif item == 'workers above the CPUs':
        from t2t_course.train.cli import main
        from t2t_course.train.config import TrainConfig, resolve_config
        with pytest.raises(SetupError, match=r"workers \(\d+\) must be at most this machine's \d+ CPUs"):
            resolve_config(TrainConfig(data='digits', workers=(os.cpu_count() or 1) + 1))
    elif item == 'malicious pickle':
        _malicious(tmp_path / 'evil.pth')
        with pytest.raises(CheckpointError, match=r'holds pickled code or objects \(posix.system\) that are refused'):
            read_checkpoint(tmp_path / 'evil.pth')
    else:
        val = tmp_path / 'val'; val.mkdir()
        Image.new('RGB', (8, 8)).save(val / 'ILSVRC2012_val_00000001.JPEG')
        labels = tmp_path / 'labels.txt'; labels.write_text('ILSVRC2012_val_00000001.JPEG .n00\n')
        with pytest.raises(ValueError, match=r"class name '.n00' in the labels starts with '.'"):
            prepare_imagenet_val(val, labels)


# ------------------------------------------------------------------ resume
@pytest.mark.parametrize('case', ['flags forgotten', 'a flag changed', 'architecture changed', 'pipeline switched'])
def test_resume_takes_the_checkpoints_settings(case, tmp_path):
    "`--resume auto` with flags left out keeps the checkpoint's settings; a given flag that changes one is noted."
    from test_train import TINY_ARGS, call, make_folder
    from t2t_course.train.cli import main
    from t2t_course.train.checkpoint import read_checkpoint_dict
    data, out = make_folder(tmp_path / 'data', n_train=8, n_val=2), tmp_path / 'run'
    first = ['--data', str(data), *TINY_ARGS, '-b', '8', '--workers', '0', '--output', str(out), '--epochs', '1']
    code, _, err = call(main, [*first, '--weight-decay', '0.2', '--smoothing', '0.2', '--seed', '3', '--pipeline', 'pil'])
    assert code == 0, err
    again = ['--data', str(data), '--output', str(out), '--resume', 'auto', '--epochs', '2', '--no-progress', '--workers', '0']
    if case == 'flags forgotten':
        code, stdout, err = call(main, again)
        cfg = read_checkpoint_dict(out / 'last.pth')['config']
        assert code == 0, err
        assert (cfg['weight_decay'], cfg['smoothing'], cfg['seed'], cfg['pipeline'], cfg['epochs']) == (0.2, 0.2, 3, 'pil', 2)
        assert cfg['model_kwargs'] == {'embed_dim': 32, 'depth': 1, 'num_heads': 2, 'mlp_ratio': 2.0, 'token_dim': 16}
        note = next(line for line in stdout.splitlines() if 'note: resuming' in line)
        assert 'epochs 1 -> 2' in note and 'weight_decay' not in note and 'seed' not in note
    elif case == 'a flag changed':
        code, stdout, err = call(main, [*again, '--weight-decay', '0.05'])
        assert code == 0, err
        assert 'weight_decay 0.2 -> 0.05' in stdout and read_checkpoint_dict(out / 'last.pth')['config']['weight_decay'] == 0.05
    elif case == 'architecture changed':
        code, _, err = call(main, [*again, '--img-size', '32'])
        assert code == 2 and 'cannot resume' in err and 'img_size' in err and 'Traceback' not in err, err
    else:
        code, stdout, err = call(main, [*again, '--pipeline', 'draft'])
        assert code == 0 and 'pipeline pil -> draft' in stdout, err


# ------------------------------------------------------------------ paths the OS refuses
LONG = 'x' * 300  # one path component over the 255 bytes file systems allow


@pytest.mark.parametrize('command', ['t2t_train --output', 't2t_train --data', 't2t_train --resume', 't2t_eval',
                                     't2t_eval --data', 't2t_predict image', 't2t_study --output', 't2t_study --data',
                                     't2t_train --output under a file'])
def test_paths_the_os_refuses(command, tmp_path, trained):
    "A name too long, or a folder under a regular file: one line naming the path and the reason, exit 2, no traceback."
    from test_train import call
    from t2t_course.train.cli import eval_main, main
    from t2t_course.study import study_main
    long = str(tmp_path / LONG)
    (tmp_path / 'afile').write_text('')
    fn, argv = {
        't2t_train --output': (main, ['--epochs', '1', '--output', long]),
        't2t_train --data': (main, ['--data', long]),
        't2t_train --resume': (main, ['--resume', long + '.pth']),
        't2t_eval': (eval_main, [long + '.pth']),
        't2t_eval --data': (eval_main, [str(trained), '--data', long]),
        't2t_predict image': (predict_main, [long + '.png', '--checkpoint', str(trained), '--device', 'cpu']),
        't2t_study --output': (study_main, ['--quick', '--output', long]),
        't2t_study --data': (study_main, ['--quick', '--data', long, '--output', str(tmp_path / 'study')]),
        't2t_train --output under a file': (main, ['--epochs', '1', '--output', str(tmp_path / 'afile' / 'run')]),
    }[command]
    code, out, err = call(fn, argv)
    last = err.strip().splitlines()[-1]  # argparse's usage line may come first, for a bad flag
    assert code == 2 and 'Traceback' not in err and last.split(': ')[1] == 'error', err
    assert ('too long' in last or 'not a directory' in last) and ('x' * 50 in last or 'afile' in last), err
