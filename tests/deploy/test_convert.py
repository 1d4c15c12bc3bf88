"""Converting weights (chapter 24c, `t2t_course.deploy.convert`): `t2t_convert` turns an official-format release (the
golden T2T-ViT-7), one of our checkpoints (its EMA or, with --no-ema, its raw weights; its classes, size and crop), a
lone .safetensors file or another model folder into a model folder that rebuilds the same model without any unpickling;
every bad input is one line and status 2, nothing written; a write that fails is status 1; the command as a process."""
import argparse, errno, json, sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from t2t_course import create_model
from t2t_course.deploy.convert import convert, convert_main
from t2t_course.deploy.predict import imagenet_classes
from t2t_course.models.weights import save_safetensors

from tests.support.commands import REPO, call
from tests.support.no_pickle import no_unpickling
from tests.support.warm import warm_run

GOLDEN = REPO / 'reference' / 'golden' / 't2t_vit_7_224.pt'


@pytest.fixture(scope='module')
def official(tmp_path_factory):
    "The golden T2T-ViT-7 as the official script saves a release: EMA and raw weights under `module.`, its arguments pickled."
    g = torch.load(GOLDEN)
    path = tmp_path_factory.mktemp('official') / '71.7_T2T_ViT_7.pth.tar'
    torch.save({'epoch': 309, 'args': argparse.Namespace(model='t2t_vit_7'),
                'state_dict_ema': {f'module.{k}': v for k, v in g['state_dict'].items()},
                'state_dict': {f'module.{k}': torch.zeros_like(v) for k, v in g['state_dict'].items()}}, path)
    return path, g


def test_an_official_release_becomes_a_model_folder(official, tmp_path):
    "The EMA weights, the official logits, ImageNet's names and the default preprocessing; read back without a pickle."
    path, g = official
    code, out, err = call(convert_main, [str(path), str(tmp_path / 'm'), '--model', 't2t_vit_7'])
    assert code == 0 and err == '' and out.startswith(f"wrote {tmp_path / 'm'}: t2t_vit_7 (official-format checkpoint "
                                                      f"71.7_T2T_ViT_7.pth.tar, EMA), 1000 classes, 224 x 224 px, crop 0.9"), out
    assert "timm.create_model('local-dir:" in out and sorted(p.name for p in (tmp_path / 'm').iterdir()) == ['config.json', 'model.safetensors']
    with no_unpickling(): model = create_model(tmp_path / 'm').eval()
    with torch.no_grad(): torch.testing.assert_close(model(g['input']), g['logits'], atol=1e-4, rtol=0)
    cfg = json.loads((tmp_path / 'm' / 'config.json').read_text())
    assert cfg['label_names'] == imagenet_classes() and cfg['model_args'] == dict(num_classes=1000, img_size=[224, 224])
    assert (cfg['pretrained_cfg']['crop_pct'], cfg['pretrained_cfg']['input_size']) == (0.9, [3, 224, 224])


@pytest.mark.parametrize('ema', [None, True, False])
def test_our_checkpoint_keeps_its_classes_size_crop_and_chosen_weights(ema, tmp_path):
    "A t2t_train checkpoint (EMA = weights + 1): the EMA by default or with --ema, the raw weights with --no-ema."
    kw = dict(embed_dim=32, depth=1, num_heads=2)
    torch.manual_seed(0)
    sd = create_model('t2t_vit_7', num_classes=4, img_size=32, **kw).state_dict()
    torch.save(dict(state_dict=sd, state_dict_ema={k: v + 1 for k, v in sd.items()}, classes=['cat', 'dog', 'owl', 'fox'], epoch=3,
                    config=dict(model='t2t_vit_7', model_kwargs=kw, img_size=32, data='pets', data_preset='digits')), tmp_path / 'best.pth')
    flag = {None: [], True: ['--ema'], False: ['--no-ema']}[ema]
    code, out, err = call(convert_main, [str(tmp_path / 'best.pth'), str(tmp_path / 'm'), *flag])
    assert code == 0 and f"t2t_train checkpoint best.pth, {'weights' if ema is False else 'EMA'}), 4 classes, 32 x 32 px, crop 1.0" in out, err
    model = create_model(tmp_path / 'm')
    for k, v in sd.items(): assert torch.equal(model.state_dict()[k], v if ema is False else v + 1), k
    assert (model.default_cfg['label_names'], model.default_cfg['crop_pct']) == (['cat', 'dog', 'owl', 'fox'], 1.0)
    assert json.loads((tmp_path / 'm' / 'config.json').read_text())['model_args'] == dict(kw, num_classes=4, img_size=[32, 32])


def test_a_safetensors_file_and_a_folder_convert_too(official, tmp_path):
    path, g = official
    sd = {k: v for k, v in g['state_dict'].items()}
    save_safetensors(sd, tmp_path / 'w.safetensors')
    folder, net, what = convert(tmp_path / 'w.safetensors', tmp_path / 'a', model='t2t_vit_7')
    assert what == 'safetensors file w.safetensors, weights'
    again, _, what = convert(folder, tmp_path / 'b')
    assert what == 'model folder a'
    for k, v in create_model(again).state_dict().items(): assert torch.equal(v, sd[k]), k


def test_overwrite_replaces_the_files_of_a_folder(official, tmp_path):
    path, _ = official
    (tmp_path / 'm').mkdir(); (tmp_path / 'm' / 'README.md').write_text('mine')
    code, _, err = call(convert_main, [str(path), str(tmp_path / 'm'), '--model', 't2t_vit_7'])
    assert code == 2 and 'already exists and is not empty: choose another folder, or pass --overwrite' in err
    code, _, err = call(convert_main, [str(path), str(tmp_path / 'm'), '--model', 't2t_vit_7', '--overwrite'])
    assert code == 0 and sorted(p.name for p in (tmp_path / 'm').iterdir()) == ['README.md', 'config.json', 'model.safetensors']


BAD = {  # what: (arguments after SRC DST, the one line must say)
    'no --model': ([], 'is not a t2t_train checkpoint: name its architecture with --model'),
    'the wrong --model': (['--model', 't2t_vit_14'], 'the checkpoint does not fit this T2TViT (t2t_vit_14)'),
    'an unknown --model': (['--model', 'vgg16'], "unknown model 'vgg16'"),
    '--ema without EMA': (['--model', 't2t_vit_7', '--ema'], 'holds no EMA weights: drop --ema'),
    'not weights': (['--model', 't2t_vit_7'], 'not a PyTorch checkpoint'),
    'a missing source': (['--model', 't2t_vit_7'], 'no checkpoint file at'),
    'a destination that is a file': (['--model', 't2t_vit_7'], 'is a file, not a folder'),
    'a destination under a file': (['--model', 't2t_vit_7'], 'not a directory'),
}


@pytest.mark.parametrize('what', list(BAD))
def test_bad_input_is_one_line_status_2_and_nothing_written(what, official, tmp_path):
    more, message = BAD[what]
    src, dst = official[0], tmp_path / 'out'
    if what == '--ema without EMA': src = tmp_path / 'raw.pth'; torch.save({'state_dict': official[1]['state_dict']}, src)
    if what == 'not weights': src = tmp_path / 'notes.pth'; src.write_text('not weights')
    if what == 'a missing source': src = tmp_path / 'missing.pth'
    if what == 'a destination that is a file': dst.write_text('')
    if what == 'a destination under a file': (tmp_path / 'afile').write_text(''); dst = tmp_path / 'afile' / 'out'
    code, out, err = call(convert_main, [str(src), str(dst), *more])
    last = err.strip().splitlines()[-1]  # argparse prints its usage first
    assert code == 2 and message in last and last.startswith('t2t_convert: error:') and 'Traceback' not in err, err
    assert out == '' and (not dst.is_dir() or not any(dst.iterdir()))


def test_a_write_that_fails_is_status_1(official, tmp_path):
    with mock.patch('t2t_course.models.weights._write_atomically', side_effect=OSError(errno.ENOSPC, 'No space left on device')):
        code, out, err = call(convert_main, [str(official[0]), str(tmp_path / 'm'), '--model', 't2t_vit_7'])
    assert code == 1 and err.strip() == f"t2t_convert: error: cannot write {tmp_path / 'm'}: no space left on device", err


def test_t2t_convert_as_a_process(official, tmp_path):
    res = warm_run([sys.executable, '-m', 't2t_course.deploy.convert', str(official[0]), str(tmp_path / 'm'), '--model', 't2t_vit_7'],
                   capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith('wrote') and Path(tmp_path / 'm' / 'config.json').is_file(), res.stderr


def test_unusable_weights_and_ctrl_c_are_one_line(tmp_path, monkeypatch):
    "A NaN in the weights is refused naming the tensor (exit 2); a misspelt --model gets the closest names; Ctrl-C is exit 130."
    import io
    from contextlib import redirect_stderr
    from t2t_course import create_model
    import t2t_course.deploy.convert as convert
    sd = create_model('t2t_vit_7', img_size=32, depth=1).state_dict()
    sd['head.bias'][0] = float('nan')
    torch.save({'state_dict': sd}, tmp_path / 'nan.pth')
    def run(argv):
        err = io.StringIO()
        with redirect_stderr(err):
            try: code = convert.convert_main(argv)
            except SystemExit as e: code = e.code
        return code, err.getvalue()
    code, err = run([str(tmp_path / 'nan.pth'), str(tmp_path / 'out'), '--model', 't2t_vit_7'])
    assert code == 2 and 'head.bias holds 1 NaN or infinite values of 1,000' in err and len(err.strip().splitlines()) == 1, err
    code, err = run([str(tmp_path / 'nan.pth'), str(tmp_path / 'out'), '--model', 't2t_vit7'])
    assert code == 2 and "did you mean 't2t_vit_7'" in err, err
    def stop(*a, **k): raise KeyboardInterrupt
    monkeypatch.setattr(convert, 'convert', stop)
    code, err = run([str(tmp_path / 'nan.pth'), str(tmp_path / 'out'), '--model', 't2t_vit_7'])
    assert code == 130 and 'interrupted' in err and len(err.strip().splitlines()) == 1, err
