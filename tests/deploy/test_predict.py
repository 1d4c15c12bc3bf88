"""Classifying photos (chapter 24b, `t2t_course.deploy.predict`): `t2t_predict` on the sample photo with an
official-format checkpoint and with one of ours, on every kind of bad input (one line, exit status 2, never a
traceback), on bad images among good ones (each reported, the good ones' results printed) and on a special file (never
opened); its image reader gives the pixels the training loader gives. At scale, on a small model trained on the digits:
a folder of 50 validation digits through the run's model folder, its best.pth and its ONNX export gives the same top-1
and top-5 (the ONNX file alone: its preprocessing and class names are inside it); folders, globs and bad files as CSV
and JSON rows; batches and loader workers change nothing; outputs named for their format. Weights that read but are
unusable refused in one line; Ctrl-C (mocked, and a real SIGINT to the process group) keeps what was classified."""
import csv, io, json, os, shutil, subprocess, sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from t2t_course import create_model
from t2t_course.core import sample_image_path
from t2t_course.data import load_rgb
from t2t_course.deploy import imagenet_classes, predict_main, read_image

from tests.support.commands import REPO
from tests.support.images import fifo
from tests.support.warm import WarmPopen, warm_run


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
    "An official-format checkpoint (T2T-ViT-7, random weights, under state_dict_ema) and one of ours (config and classes)."
    d = tmp_path_factory.mktemp('ck')
    torch.manual_seed(0)
    torch.save({'state_dict_ema': create_model('t2t_vit_7').state_dict(), 'epoch': 309}, d / 'official.pth.tar')
    kw = dict(embed_dim=64, depth=2, num_heads=2)
    sd = create_model('t2t_vit_7', num_classes=4, img_size=32, **kw).state_dict()
    torch.save(dict(state_dict=sd, state_dict_ema=sd, classes=['cat', 'dog', 'owl', 'fox'], epoch=1,
                    config=dict(model='t2t_vit_7', model_kwargs=kw, img_size=32, data='pets', data_preset='digits')), d / 'best.pth')
    return d


def _run(argv, capsys):
    status = predict_main([*map(str, argv), '--device', 'cpu'])
    out, err = capsys.readouterr()
    return status, out, err


def test_predict_official_checkpoint_on_the_sample_photo(checkpoints, capsys):
    status, out, err = _run([sample_image_path(), '--checkpoint', checkpoints / 'official.pth.tar', '--model', 't2t_vit_7'], capsys)
    assert status == 0 and err == ''
    lines = out.strip().splitlines()
    assert lines[0].startswith('t2t_vit_7 (official-format checkpoint official.pth.tar, EMA), 224 x 224, crop 0.9, bicubic')
    assert lines[1] == f'{sample_image_path()}:' and len(lines) == 7
    names, percents = set(imagenet_classes()), []
    for rank, line in enumerate(lines[2:], 1):
        head, pct, name = line.split(None, 2)
        assert head == f'{rank}.' and pct.endswith('%') and name in names
        percents.append(float(pct[:-1]))
    assert percents == sorted(percents, reverse=True) and 0 < sum(percents) <= 100.01


def test_predict_json_and_our_checkpoint(checkpoints, capsys):
    status, out, err = _run([sample_image_path(), sample_image_path(), '--checkpoint', checkpoints / 'best.pth', '--json',
                             '--topk', '9'], capsys)
    doc = json.loads(out)
    assert status == 0 and err == '' and doc['errors'] == [] and len(doc['predictions']) == 2
    assert doc['model'] == 't2t_vit_7 (t2t_train checkpoint best.pth, EMA), 32 x 32, crop 1.0, bicubic'  # the digits preset's crop
    top = doc['predictions'][0]['top']
    assert [t['rank'] for t in top] == [1, 2, 3, 4]                    # topk capped at the 4 classes
    assert sorted(t['class'] for t in top) == ['cat', 'dog', 'fox', 'owl']
    assert abs(sum(t['percent'] for t in top) - 100) < 0.05


BAD = {  # what: (arguments after the image, what the one line must say)
    'missing image': (None, 'no image file at'),
    'a folder without images': ('folder', 'no image files (.jpg .jpeg'),
    'text as image': ('notes.txt', 'not an image file PIL can read'),
    'truncated image': ('cut.jpg', 'truncated or damaged'),
    'empty checkpoint': ('empty.pth', 'is empty (0 bytes)'),
    'garbage checkpoint': ('garbage.pth', 'not a PyTorch checkpoint'),
    'truncated checkpoint': ('truncated.pth', 'not a PyTorch checkpoint, or a truncated or damaged one'),
    'numpy scalars': ('numpy.pth', 'it holds a pickled numpy'),
    'a list': ('list.pth', 'holds a list, not a dict of weights'),
    'no --model': ('nomodel', 'is not a t2t_train checkpoint: name its architecture with --model'),
    'wrong --model': ('wrongmodel', 'does not fit this T2TViT (t2t_vit_14)'),
    'our checkpoint with another --model': ('ours_other', 'was trained as t2t_vit_7'),
}


@pytest.mark.parametrize('what', list(BAD))
def test_predict_bad_input_is_one_line_and_status_2(what, checkpoints, tmp_path, capsys):
    arg, message = BAD[what]
    photo, official = sample_image_path(), checkpoints / 'official.pth.tar'
    image, ck, model = photo, official, ['--model', 't2t_vit_7']
    if arg is None: image = tmp_path / 'missing.jpg'
    elif arg == 'folder': image = tmp_path
    elif arg == 'notes.txt': image = tmp_path / arg; image.write_text('not an image')
    elif arg == 'cut.jpg': image = tmp_path / arg; image.write_bytes(photo.read_bytes()[:2000])
    elif arg == 'nomodel': model = []
    elif arg == 'wrongmodel': model = ['--model', 't2t_vit_14']
    elif arg == 'ours_other': ck, model = checkpoints / 'best.pth', ['--model', 't2t_vit_14']
    else:
        ck = tmp_path / arg
        if arg == 'empty.pth': ck.write_bytes(b'')
        elif arg == 'garbage.pth': ck.write_bytes(b'\x80\x02 garbage, not weights')
        elif arg == 'truncated.pth': ck.write_bytes(official.read_bytes()[:10_000])
        elif arg == 'numpy.pth': torch.save({'state_dict': {}, 'best_acc1': np.float64(71.7)}, ck)
        elif arg == 'list.pth': torch.save([1, 2, 3], ck)
    status, out, err = _run([image, '--checkpoint', ck, *model], capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith('t2t_predict: error:'), err
    assert message in lines[0] and 'Traceback' not in err


def test_one_bad_image_does_not_stop_the_others(checkpoints, tmp_path, capsys):
    (tmp_path / 'x.png').write_text('no')
    status, out, err = _run([tmp_path / 'x.png', sample_image_path(), '--checkpoint', checkpoints / 'best.pth'], capsys)
    assert status == 2 and err.count('\n') == 1 and 'x.png' in err
    assert f'{sample_image_path()}:' in out and out.count('%') == 4


@pytest.mark.parametrize('argv, message', [(['--topk', '0'], '--topk must be positive'),
                                           (['--model', 'vgg16'], "unknown model 'vgg16'")])
def test_predict_bad_arguments(argv, message, checkpoints, capsys):
    with pytest.raises(SystemExit) as e: predict_main([str(sample_image_path()), '--checkpoint', str(checkpoints / 'best.pth'), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_t2t_predict_as_a_process(checkpoints):
    "The command as a user runs it: top-5 with names on stdout and status 0; a bad file: one line on stderr and 2."
    cmd = [sys.executable, '-m', 't2t_course.deploy', str(sample_image_path()), '--checkpoint', str(checkpoints / 'official.pth.tar'),
           '--model', 't2t_vit_7', '--device', 'cpu']
    res = warm_run(cmd, capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.count('%') == 5, res.stderr
    res = warm_run(cmd[:5] + [str(checkpoints / 'nope.pth')] + cmd[6:], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.strip().count('\n') == 0 and 'no checkpoint file at' in res.stderr


def test_a_closed_pipe_is_not_a_traceback(checkpoints):
    "`t2t_predict ... | head -1`: the reader goes away before the output; the command stops quietly with status 1."
    cmd = [sys.executable, '-m', 't2t_course.deploy', str(sample_image_path()), '--checkpoint', str(checkpoints / 'best.pth'),
           '--device', 'cpu', '--json']
    p = WarmPopen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()                                                   # nobody reads what it prints
    err = p.stderr.read(); p.wait()
    assert p.returncode == 1 and 'Traceback' not in err and 'BrokenPipe' not in err, err


# ------------------------------------------------------------------ bad and odd images
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


def test_t2t_predict_refuses_a_special_file(tmp_path, trained):
    "A FIFO named like an image: one line and status 2 from t2t_predict."
    fifo_path = fifo(tmp_path / 'pipe.jpg')  # were it opened, the command would block: the timeout fails the test
    cmd = [sys.executable, '-m', 't2t_course.deploy', str(fifo_path), '--checkpoint', str(trained), '--device', 'cpu']
    res = warm_run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 2 and 'Traceback' not in res.stderr, res.stderr
    assert 'is not a regular file (a FIFO, socket or device)' in res.stderr


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


# ------------------------------------------------------------------ at scale, on a trained model: folders, CSV, JSON, ONNX
@pytest.fixture(scope='module')
def digits(tmp_path_factory):
    "A T2T-ViT-7 (D 64, 2 blocks, 32 px) trained 3 epochs on the embedded digits, and 50 validation digits in class folders."
    from t2t_course.data import digits_folder
    from t2t_course.train import TrainConfig, train
    d = tmp_path_factory.mktemp('digits')
    with redirect_stdout(io.StringIO()):
        run = train(TrainConfig(data='digits', img_size=32, epochs=3, lr=0.02, smoothing=0., device='cpu', output=str(d / 'run'),
                                model_kwargs=dict(embed_dim=64, depth=2, num_heads=2, mlp_ratio=2., token_dim=32), progress=False))
    assert run.metrics['ema_val_acc1'] > 70, run.metrics
    for c in range(10):
        (d / 'digits50' / str(c)).mkdir(parents=True)
        for f in sorted((digits_folder() / 'val' / str(c)).glob('*.png'))[:5]: shutil.copy(f, d / 'digits50' / str(c) / f.name)
    return run.output, d / 'digits50'


@pytest.fixture(scope='module')
def digits_onnx(digits, tmp_path_factory):
    pytest.importorskip('onnx'); pytest.importorskip('onnxruntime')
    from t2t_course.deploy import export_onnx
    return export_onnx(create_model(digits[0] / 'best_model'), tmp_path_factory.mktemp('onnx') / 'digits.onnx')


def _rows(path): return list(csv.DictReader(open(path, newline='')))
def _top(rows, k): return [[r[f'class_{i}'] for i in range(1, k + 1)] for r in rows]


def test_a_model_folder_its_checkpoint_and_its_onnx_file_agree_on_50_digits(digits, digits_onnx, tmp_path, capsys):
    "The same top-1 and top-5 (in order) for every image, and percentages within 0.05, from best_model/, best.pth and ONNX."
    run, images = digits
    outs = {}
    for name, source in (('folder', ['--checkpoint', run / 'best_model']), ('best', ['--checkpoint', run / 'best.pth']),
                         ('onnx', ['--onnx', digits_onnx])):
        status, out, err = _run([images, *source, '--csv', tmp_path / f'{name}.csv'], capsys)
        assert status == 0 and err == '', err
        assert out.strip().endswith(f"50 of 50 images classified; wrote {tmp_path / f'{name}.csv'}"), out
        outs[name] = _rows(tmp_path / f'{name}.csv')
    assert len(outs['folder']) == 50 and [r['image'] for r in outs['folder']] == sorted(str(p) for p in images.rglob('*.png'))
    for name in ('best', 'onnx'):
        assert [r['image'] for r in outs[name]] == [r['image'] for r in outs['folder']]
        assert _top(outs[name], 1) == _top(outs['folder'], 1) and _top(outs[name], 5) == _top(outs['folder'], 5), name
        gap = max(abs(float(a[f'percent_{k}']) - float(b[f'percent_{k}'])) for a, b in zip(outs[name], outs['folder']) for k in range(1, 6))
        assert gap <= 0.05, (name, gap)
    truth = [Path(r['image']).parent.name for r in outs['folder']]
    assert sum(r['class_1'] == t for r, t in zip(outs['folder'], truth)) >= 35         # a trained model: most are right


def test_the_onnx_file_alone_holds_the_preprocessing_and_class_names(digits_onnx):
    from t2t_course.deploy.export import read_onnx_metadata
    from t2t_course.deploy.predict import load_onnx_predictor
    meta = read_onnx_metadata(digits_onnx)
    assert meta['label_names'] == [str(i) for i in range(10)] and meta['architecture'] == 't2t_vit_7' and meta['num_classes'] == 10
    assert {k: meta['preprocessing'][k] for k in ('input_size', 'resize', 'crop', 'crop_pct', 'interpolation')} == \
        dict(input_size=[3, 32, 32], resize=32, crop=[32, 32], crop_pct=1.0, interpolation='bicubic')
    pred = load_onnx_predictor(digits_onnx)
    assert pred.description == 't2t_vit_7 (ONNX file digits.onnx, onnxruntime), 32 x 32, crop 1.0, bicubic' and pred.classes[3] == '3'


def test_folders_globs_and_bad_files_as_csv_and_json(digits, tmp_path, capsys):
    "Sources in order (a folder searched recursively, a glob, a missing file, a text file): a CSV row and a JSON entry each."
    run, images = digits
    (tmp_path / 'deep' / 'er').mkdir(parents=True)
    for i, f in enumerate(sorted((images / '3').glob('*.png'))[:2]): shutil.copy(f, tmp_path / 'deep' / ('er' if i else '') / f.name)
    (tmp_path / 'notes.png').write_text('not an image')
    argv = [tmp_path / 'deep', str(images / '7' / '*.png'), tmp_path / 'missing.png', tmp_path / 'notes.png', str(tmp_path / 'no*.jpg'),
            '--checkpoint', run / 'best_model', '--topk', '2']
    status, out, err = _run([*argv, '--csv', tmp_path / 'out.csv', '--json', tmp_path / 'out.json'], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 3 and 'Traceback' not in err, err
    rows = _rows(tmp_path / 'out.csv')
    assert list(rows[0]) == ['image', 'class_1', 'percent_1', 'index_1', 'class_2', 'percent_2', 'index_2', 'error']
    assert [Path(r['image']).name for r in rows][1:3] == sorted(f.name for f in (images / '3').glob('*.png'))[:2]
    assert len(rows) == 2 + 5 + 3 and [bool(r['error']) for r in rows] == [True] + [False] * 7 + [True, True]  # the pattern first
    assert rows[0]['error'] == f"no file matches {tmp_path / 'no*.jpg'}" and 'no image file at' in rows[-2]['error']
    assert 'not an image file PIL can read' in rows[-1]['error'] and rows[-1]['class_1'] == ''
    doc = json.loads((tmp_path / 'out.json').read_text())
    assert len(doc['predictions']) == 7 and len(doc['errors']) == 3 and doc['model'].startswith('t2t_vit_7 (model folder best_model)')
    assert [t['rank'] for t in doc['predictions'][0]['top']] == [1, 2]
    status, out, _ = _run([images / '0', '--checkpoint', run / 'best_model', '--csv'], capsys)    # to stdout
    assert status == 0 and len(list(csv.DictReader(io.StringIO(out)))) == 5


def test_batches_and_loader_workers_change_nothing(digits, tmp_path, capsys):
    run, images = digits
    for name, more in (('one', ['--batch-size', '1', '--workers', '0']), ('many', ['--batch-size', '7', '--workers', '2'])):
        status, _, err = _run([images, '--checkpoint', run / 'best_model', '--csv', tmp_path / f'{name}.csv', *more], capsys)
        assert status == 0, err
    one, many = _rows(tmp_path / 'one.csv'), _rows(tmp_path / 'many.csv')
    assert [r['image'] for r in one] == [r['image'] for r in many] and _top(one, 5) == _top(many, 5)


def test_a_progress_bar_when_asked(digits, capsys):
    run, images = digits
    status, out, err = _run([images / '1', '--checkpoint', run / 'best_model', '--json', '--progress'], capsys)
    assert status == 0 and 't2t_predict:' in err and '/5 [' in err and len(json.loads(out)['predictions']) == 5


@pytest.mark.parametrize('argv, message', [
    (['--json', 'photo.png'], "'photo.png': the output file must end in .json"),
    (['--csv', 'out.txt'], "'out.txt': the output file must end in .csv"),
    (['--csv', '-', '--json'], '--csv and --json cannot both go to stdout'),
    (['--onnx', 'm.onnx', '--model', 't2t_vit_7'], '--model names the architecture of a checkpoint'),
    (['--batch-size', '0'], '--batch-size must be positive'),
])
def test_bad_output_and_source_arguments(argv, message, trained, capsys):
    src = [] if '--onnx' in argv else ['--checkpoint', str(trained)]
    with pytest.raises(SystemExit) as e: predict_main([str(sample_image_path()), *src, *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_an_onnx_file_without_metadata_is_refused(tmp_path, capsys):
    "An ONNX file exported by other means carries no preprocessing: refused with the reason, not fed with a guess."
    pytest.importorskip('onnx'); pytest.importorskip('onnxruntime')
    import contextlib, warnings
    m = create_model('t2t_vit_7', img_size=32, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(m, (torch.randn(1, 3, 32, 32),), dynamo=True, input_names=['image']).save(str(tmp_path / 'bare.onnx'))
    status, _, err = _run([sample_image_path(), '--onnx', tmp_path / 'bare.onnx'], capsys)
    assert status == 2 and 'carries no preprocessing in its metadata: export it with export_onnx' in err
    (tmp_path / 'garbage.onnx').write_bytes(b'not onnx')
    status, _, err = _run([sample_image_path(), '--onnx', tmp_path / 'garbage.onnx'], capsys)
    assert status == 2 and 'cannot read ONNX file' in err and len(err.strip().splitlines()) == 1


def test_a_safetensors_file_with_model(checkpoints, tmp_path, capsys):
    from t2t_course.models.weights import save_safetensors
    sd = torch.load(checkpoints / 'official.pth.tar', weights_only=True)['state_dict_ema']
    save_safetensors(sd, tmp_path / 'official.safetensors')
    status, out, err = _run([sample_image_path(), '--checkpoint', tmp_path / 'official.safetensors', '--model', 't2t_vit_7'], capsys)
    assert status == 0 and out.startswith('t2t_vit_7 (safetensors file official.safetensors, weights), 224 x 224'), err
    status, _, err = _run([sample_image_path(), '--checkpoint', tmp_path / 'official.safetensors'], capsys)
    assert status == 2 and 'name its architecture with --model' in err


# ------------------------------------------------------------------ checkpoints that read but are not usable; Ctrl-C (issue 47)
MALFORMED = {'values not tensors': (lambda sd: {'cls_token': 5, 'head.weight': 3}, 'cls_token is a int, not a tensor'),
             'a key not a string': (lambda sd: {1: torch.zeros(3), **sd}, 'key 1 is a int, not a name'),
             'one NaN': (lambda sd: dict(sd, **{'head.bias': torch.full_like(sd['head.bias'], float('nan'))}), 'head.bias holds 1,000 NaN'),
             'every tensor int64': (lambda sd: {k: v.long() for k, v in sd.items()}, 'is torch.int64 where the model has torch.float32'),
             'a meta tensor': (lambda sd: dict(sd, **{'head.weight': sd['head.weight'].to('meta')}), 'head.weight is a meta tensor')}


@pytest.mark.parametrize('what', list(MALFORMED))
def test_predict_refuses_weights_that_read_but_are_unusable(what, checkpoints, tmp_path, capsys):
    damage, message = MALFORMED[what]
    sd = torch.load(checkpoints / 'official.pth.tar', weights_only=True)['state_dict_ema']
    torch.save({'state_dict_ema': damage(sd)}, tmp_path / 'bad.pth')
    status, out, err = _run([sample_image_path(), '--checkpoint', tmp_path / 'bad.pth', '--model', 't2t_vit_7'], capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and message in lines[0] and out == '', err


def test_predict_suggests_a_model_name(checkpoints, capsys):
    with pytest.raises(SystemExit) as e: _run([sample_image_path(), '--checkpoint', checkpoints / 'official.pth.tar', '--model', 't2t_vit7'], capsys)
    assert e.value.code == 2 and "did you mean 't2t_vit_7'" in capsys.readouterr().err


def test_ctrl_c_prints_what_was_classified(checkpoints, tmp_path, capsys, monkeypatch):
    "Ctrl-C after two of three images: their predictions are printed (and the CSV written), one line says so, exit 130."
    import t2t_course.deploy.predict as predict
    real = predict.predict_files
    def two_then_ctrl_c(*a, **k):
        for i, row in enumerate(real(*a, **k)):
            if i == 2: raise KeyboardInterrupt
            yield row
    monkeypatch.setattr(predict, 'predict_files', two_then_ctrl_c)
    photos = []
    for i in range(3): photos.append(tmp_path / f'p{i}.jpg'); shutil.copy(sample_image_path(), photos[-1])
    status, out, err = _run([*photos, '--checkpoint', checkpoints / 'official.pth.tar', '--model', 't2t_vit_7', '-b', '1'], capsys)
    assert status == 130 and f'{photos[0]}:' in out and f'{photos[1]}:' in out and f'{photos[2]}:' not in out, (out, err)
    assert err.strip().splitlines() == ['t2t_predict: error: interrupted (Ctrl-C): 2 of 3 images done, written above'], err
    status, out, err = _run([*photos, '--checkpoint', checkpoints / 'official.pth.tar', '--model', 't2t_vit_7', '--csv', tmp_path / 'p.csv'], capsys)
    assert status == 130 and len((tmp_path / 'p.csv').read_text().splitlines()) == 3  # the header and two rows


def test_a_real_ctrl_c_keeps_the_rows_already_written(checkpoints, tmp_path):
    "SIGINT to t2t_predict's whole process group (as a terminal's Ctrl-C sends it) after its first CSV row: the rows written stay, one line, exit 130, no traceback."
    import signal
    for i in range(30): shutil.copy(sample_image_path(), tmp_path / f'p{i:02d}.jpg')
    code = 'import sys; from t2t_course.deploy import predict_main; sys.exit(predict_main(sys.argv[1:]))'
    p = subprocess.Popen([sys.executable, '-c', code, str(tmp_path), '--checkpoint', str(checkpoints / 'official.pth.tar'), '--model',
                          't2t_vit_7', '--csv', '-', '-b', '1', '--workers', '2', '--device', 'cpu'], cwd=REPO, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    rows = [p.stdout.readline(), p.stdout.readline()]  # the header, the first image
    os.killpg(p.pid, signal.SIGINT)
    rest, err = p.communicate(timeout=120)
    rows += rest.splitlines()
    assert p.returncode == 130 and 'Traceback' not in err, err[-3000:]
    done = int(err.split('interrupted (Ctrl-C): ')[1].split()[0])
    assert err.strip().splitlines() == [f't2t_predict: error: interrupted (Ctrl-C): {done} of 30 images done, written above']
    assert 1 <= done < 30 and len([r for r in rows if r.strip()]) == done + 1
