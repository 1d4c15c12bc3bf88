"""Deployment (chapter 24): `torch.export` and ONNX with a dynamic batch, height and width, checked against onnxruntime
at three sizes (a non-square one among them) on small models of each kind of tokenizer; and `t2t_predict` on the
sample photo with an official-format checkpoint and with one of ours, and on every kind of bad input (one line,
exit status 2, never a traceback)."""
import json, subprocess, sys

import numpy as np
import pytest
import torch

from support.warm import WarmPopen, warm_run
from t2t_course import create_model
from t2t_course.core import sample_image_path
from t2t_course.deploy import check_onnx, export_onnx, export_program, imagenet_classes, predict_main

TINY = dict(img_size=64, embed_dim=64, depth=2, num_heads=2, num_classes=10)
SIZES = [(64, 64), (96, 96), (80, 112)]  # the built size, a larger square, a non-square one
KINDS = ['t2t_vit_7', 't2t_vit_t_14', 'vit_baseline']  # Performer T2T layers, transformer T2T layers, a hard split


def _tiny(name):
    torch.manual_seed(0)
    return create_model(name, **TINY).eval()


@pytest.mark.parametrize('name', KINDS)
def test_export_program_any_batch_and_size(name):
    model = _tiny(name)
    ep = export_program(model)
    for batch in (1, 3):
        for h, w in SIZES:
            x = torch.randn(batch, 3, h, w)
            with torch.no_grad(): torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


@pytest.fixture(scope='module', params=KINDS)
def onnx_export(request, tmp_path_factory):
    pytest.importorskip('onnx'); pytest.importorskip('onnxruntime')
    model = _tiny(request.param)
    return model, export_onnx(model, tmp_path_factory.mktemp('onnx') / f'{request.param}.onnx')


def test_onnx_matches_onnxruntime_at_three_sizes(onnx_export):
    model, path = onnx_export
    for batch in (1, 3):
        diffs = check_onnx(path, model, sizes=SIZES, batch=batch, atol=1e-4)
        assert set(diffs) == set(SIZES) and max(diffs.values()) <= 1e-4, diffs


def test_onnx_graph_is_dynamic(onnx_export):
    import onnx
    _, path = onnx_export
    graph = onnx.load(str(path)).graph
    (inp,), (out,) = graph.input, graph.output
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert inp.name == 'image' and out.name == 'logits'
    assert isinstance(dims[0], str) and dims[1] == 3 and isinstance(dims[2], str) and isinstance(dims[3], str), dims


def test_check_onnx_reports_a_mismatch(onnx_export):
    model, path = onnx_export
    with torch.no_grad(): model.head.bias += 1e-2
    try:
        with pytest.raises(ValueError, match=r'differs from the model by more than 0.0001 at \{\(64, 64\)'):
            check_onnx(path, model, sizes=[(64, 64)])
    finally:
        with torch.no_grad(): model.head.bias -= 1e-2


# ---------------------------------------------------------------- t2t_predict
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
    'folder as image': ('folder', 'is a folder, not an image file'),
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
