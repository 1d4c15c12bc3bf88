"""Reading a checkpoint file safely (chapter 08a, `t2t_course.models.weights`): every file that cannot be read (text,
truncated, empty, pickled numpy, a list, a dict without weights) is one message naming the file and what was expected,
through `create_model(pretrained=path)` and `load_checkpoint`; a pickle that calls a function is refused, never run.
safetensors files and model folders in timm's layout: written atomically, read back equal without any unpickling, and
every damaged file or folder named. What was read, checked: a compressed bomb refused before it is inflated (its peak
memory measured in a capped child), values that are not tensors, keys that are not names, meta tensors, NaN, integers
where the model has floats; 16-bit weights widened, integer buffers kept."""
import os

import numpy as np
import pytest
import torch

from t2t_course import create_model
from t2t_course.core import CheckpointError
from t2t_course.models.t2t_vit import load_checkpoint
from t2t_course.models.weights import read_checkpoint


@pytest.mark.parametrize('kind, message', [
    ('garbage', r"cannot read checkpoint .*garbage\.pth: not a PyTorch checkpoint, or a truncated or damaged one .*expected a file written by torch\.save"),
    ('truncated', r"cannot read checkpoint .*truncated\.pth: not a PyTorch checkpoint, or a truncated or damaged one"),
    ('empty', r"checkpoint file .*empty\.pth is empty \(0 bytes\)"),
    ('numpy', r"cannot read checkpoint .*numpy\.pth: it holds a pickled numpy\S*scalar, not only tensors and plain data"),
    ('list', r"checkpoint .*list\.pth holds a list: expected a state_dict, or a dict holding one"),
    ('foreign', r"foreign\.pth: the checkpoint does not fit this T2TViT \(t2t_vit_7\)"),
])
def test_unreadable_checkpoints_are_named(kind, message, tmp_path):
    "create_model(pretrained=path) and load_checkpoint name the file and what was expected, never a raw unpickling error."
    from t2t_course.models.t2t_vit import CheckpointError
    path = tmp_path / f'{kind}.pth'
    good = tmp_path / 'good.pth'
    torch.save({'state_dict': create_model('t2t_vit_7', img_size=32).state_dict()}, good)
    if kind == 'garbage': path.write_bytes(b'this is text, not weights\n')
    elif kind == 'truncated': path.write_bytes(good.read_bytes()[:len(good.read_bytes()) // 2])
    elif kind == 'empty': path.write_bytes(b'')
    elif kind == 'numpy': torch.save({'state_dict': {}, 'metric': np.float64(0.5)}, path)
    elif kind == 'list': torch.save([1, 2], path)
    else: torch.save({'weights': torch.zeros(3)}, path)
    with pytest.raises(CheckpointError, match=message): create_model('t2t_vit_7', img_size=32, pretrained=path)
    with pytest.raises(ValueError, match=message): load_checkpoint(create_model('t2t_vit_7', img_size=32), path)


def _malicious(path):
    class Evil:
        def __reduce__(self): return (os.system, ('echo this should never run',))
    torch.save({'state_dict': Evil()}, path)


def test_a_malicious_pickle_is_refused(tmp_path):
    _malicious(tmp_path / 'evil.pth')
    with pytest.raises(CheckpointError, match=r'holds pickled code or objects \(posix.system\) that are refused'):
        read_checkpoint(tmp_path / 'evil.pth')


# ------------------------------------------------------------------ safetensors and model folders
from unittest import mock

from t2t_course.models.weights import (folder_cfg, is_model_folder, read_model_config, read_safetensors, read_weights,
                                       save_safetensors, write_model_folder)
from tests.support.no_pickle import no_unpickling


def _state():
    return {'w': torch.randn(4, 3), 'table': torch.arange(6.).view(2, 3).t(), 'half': torch.randn(5).bfloat16(),
            'steps': torch.tensor(7)}


def test_safetensors_round_trip_without_pickle(tmp_path):
    "Floats, a transposed view, bfloat16 and an int come back equal; no temporary file is left; reading runs no unpickler."
    sd = _state()
    path = save_safetensors(sd, tmp_path / 'w.safetensors', metadata={'note': 'test'})
    with no_unpickling(): back = read_safetensors(path)
    assert sorted(back) == sorted(sd) and all(torch.equal(back[k], sd[k]) and back[k].dtype == sd[k].dtype for k in sd)
    assert [p.name for p in tmp_path.iterdir()] == ['w.safetensors']


def test_an_interrupted_safetensors_write_keeps_the_old_file(tmp_path):
    "The file is written beside the target and renamed over it: a failed write leaves the old file whole, and no temporary."
    path = save_safetensors({'w': torch.zeros(3)}, tmp_path / 'w.safetensors')
    with mock.patch('os.replace', side_effect=OSError(28, 'No space left on device')):
        with pytest.raises(OSError, match='No space left'): save_safetensors({'w': torch.ones(3)}, path)
    assert torch.equal(read_safetensors(path)['w'], torch.zeros(3)) and [p.name for p in tmp_path.iterdir()] == ['w.safetensors']


@pytest.mark.parametrize('kind, message', [
    ('truncated', r"cannot read weights .*bad\.safetensors: not a safetensors file, or a truncated or damaged one"),
    ('pickle', r"cannot read weights .*bad\.safetensors: not a safetensors file"),
    ('empty', r"weights file .*bad\.safetensors is empty \(0 bytes\)"),
])
def test_unreadable_safetensors_are_named(kind, message, tmp_path):
    good = save_safetensors(_state(), tmp_path / 'good.safetensors')
    bad = tmp_path / 'bad.safetensors'
    if kind == 'truncated': bad.write_bytes(good.read_bytes()[:60])
    elif kind == 'pickle': torch.save(_state(), bad)
    else: bad.write_bytes(b'')
    with pytest.raises(CheckpointError, match=message): read_safetensors(bad)
    with pytest.raises(CheckpointError, match=message): read_weights(bad, what='weights')


def test_a_model_folder_is_read_without_pickle(tmp_path):
    "A folder in timm's layout: both files, read by `read_model_config` and `read_weights` with every unpickler refusing."
    sd = _state()
    folder = write_model_folder(tmp_path / 'm', sd, dict(architecture='x', num_classes=4, label_names=list('abcd')))
    assert sorted(p.name for p in folder.iterdir()) == ['config.json', 'model.safetensors']
    assert is_model_folder(folder) and is_model_folder(f'local-dir:{folder}') and not is_model_folder(tmp_path / 'nope')
    with no_unpickling():
        assert read_model_config(folder)['label_names'] == list('abcd')
        assert all(torch.equal(v, sd[k]) for k, v in read_weights(f'local-dir:{folder}').items())


def test_a_folder_of_timms_pickle_is_read_safely(tmp_path):
    "A folder with only `pytorch_model.bin` (timm's save_for_hf without safetensors) is read with weights_only."
    (tmp_path / 'config.json').write_text('{"architecture": "x"}')
    torch.save({'w': torch.ones(2)}, tmp_path / 'pytorch_model.bin')
    assert torch.equal(read_weights(tmp_path)['w'], torch.ones(2))


@pytest.mark.parametrize('case, message', [
    ('no config', 'has no config.json: not a model folder'),
    ('not json', 'config.json: not JSON'),
    ('no architecture', 'names no architecture'),
    ('no weights', 'has no model.safetensors'),
])
def test_what_is_not_a_model_folder_is_named(case, message, tmp_path):
    if case != 'no config': (tmp_path / 'config.json').write_text({'not json': '{"architecture": ', 'no architecture': '{"num_classes": 3}'}
                                                                  .get(case, '{"architecture": "x"}'))
    read = read_weights if case == 'no weights' else read_model_config
    with pytest.raises(CheckpointError, match=message): read(tmp_path)


def test_a_config_json_cannot_hold_is_refused_before_writing(tmp_path):
    with pytest.raises(ValueError, match=r'config.json cannot hold config.model_args.norm_layer \(type\)'):
        write_model_folder(tmp_path / 'm', _state(), dict(architecture='x', model_args=dict(norm_layer=torch.nn.LayerNorm)))
    assert not (tmp_path / 'm').exists()


def test_folder_cfg_gives_the_preprocessing_and_fitting_labels():
    cfg = dict(pretrained_cfg=dict(crop_pct=1.0, mean=[0.5] * 3, interpolation='bilinear', file='x', input_size=[3, 32, 32]),
               label_names=['a', 'b'])
    assert folder_cfg(cfg, 2) == dict(crop_pct=1.0, mean=(0.5,) * 3, interpolation='bilinear', label_names=['a', 'b'])
    assert 'label_names' not in folder_cfg(cfg, 3) and folder_cfg({}, 2) == {}


# ------------------------------------------------------------------ what was read, checked (issue 47)
def test_a_compressed_bomb_is_refused_before_it_is_inflated(tmp_path):
    "1 GB of zeros deflated into a file of about 1 MB: refused from the zip's directory, the refusal peaking under 100 MB above the interpreter (a child under an address-space cap); read when the limit is raised."
    import subprocess, sys, zipfile
    torch.save({'state_dict': {'w': torch.zeros(2**28)}}, tmp_path / 'plain.pth')  # 1 GiB
    with zipfile.ZipFile(tmp_path / 'plain.pth') as zin, zipfile.ZipFile(tmp_path / 'bomb.pth', 'w', zipfile.ZIP_DEFLATED) as zout:
        for i in zin.infolist(): zout.writestr(i.filename, zin.read(i.filename))
    (tmp_path / 'plain.pth').unlink()
    assert (tmp_path / 'bomb.pth').stat().st_size < 2 * 2**20
    probe = ("import resource, sys\nfrom t2t_course.train.checkpoint import read_checkpoint_dict\n"
             "vm = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1]) * 1024\n"
             "resource.setrlimit(resource.RLIMIT_AS, (vm + 2**31, vm + 2**31))\n"
             "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             "try: read_checkpoint_dict(sys.argv[1]); print('read')\nexcept ValueError as e: print(e)\n"
             "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)")
    p = subprocess.run([sys.executable, '-c', probe, str(tmp_path / 'bomb.pth')], capture_output=True, text=True, timeout=300)
    msg, peak = p.stdout.strip().splitlines()
    assert 'would inflate to 1,024 MB from' in msg and 'refused before reading it' in msg and 'T2T_COURSE_MAX_CHECKPOINT_MB=' in msg, p.stdout + p.stderr
    assert int(peak) < 100, peak
    with pytest.raises(CheckpointError, match='refused before reading it'): create_model('t2t_vit_7', img_size=32, pretrained=tmp_path / 'bomb.pth')


def test_the_size_limit_can_be_raised(tmp_path, monkeypatch):
    from t2t_course.models.weights import SIZE_LIMIT_ENV, check_archive_size
    torch.save({'w': torch.zeros(1000)}, tmp_path / 'w.pth')
    with pytest.raises(CheckpointError, match='the limit is 0.00 MB'): check_archive_size(tmp_path / 'w.pth', limit=100)
    monkeypatch.setenv(SIZE_LIMIT_ENV, 'lots')
    with pytest.raises(CheckpointError, match='must be a number of megabytes'): read_checkpoint(tmp_path / 'w.pth')
    monkeypatch.setenv(SIZE_LIMIT_ENV, '1')
    assert read_checkpoint(tmp_path / 'w.pth')['w'].shape == (1000,)


def _sd(): return create_model('t2t_vit_7', img_size=32, depth=1).state_dict()

@pytest.mark.parametrize('case, damage, message', [
    ('not tensors', lambda sd: {'cls_token': 5, 'head.weight': 3}, 'cls_token is a int, not a tensor'),
    ('a key not a string', lambda sd: {1: torch.zeros(3), **sd}, 'key 1 is a int, not a name'),
    ('a meta tensor', lambda sd: dict(sd, **{'head.weight': sd['head.weight'].to('meta')}), 'head.weight is a meta tensor'),
    ('NaN and inf', lambda sd: dict(sd, **{'head.bias': torch.full_like(sd['head.bias'], float('nan')), 'cls_token': sd['cls_token'] / 0}),
     'holds 256 NaN or infinite values of 256 (and 1 more tensors)'),
    ('int64', lambda sd: {k: v.long() for k, v in sd.items()}, 'is torch.int64 where the model has torch.float32'),
])
def test_create_model_refuses_unusable_weights(case, damage, message, tmp_path):
    "create_model(pretrained=path) and load_checkpoint refuse what reads but cannot be used, in one line naming the tensor."
    torch.save({'state_dict': damage(_sd())}, tmp_path / 'w.pth')
    with pytest.raises(CheckpointError) as e: create_model('t2t_vit_7', img_size=32, depth=1, pretrained=tmp_path / 'w.pth')
    assert message in str(e.value) and str(tmp_path / 'w.pth') in str(e.value) and '\n' not in str(e.value), e.value


def test_16_bit_weights_are_widened_and_integer_buffers_stay_integers():
    "A ResNet's weights in float16 come back in float32 with a warning; its batch-norm counters stay int64; the model loads them."
    from t2t_course.models.weights import check_state_dict
    m = create_model('resnet_baseline', img_size=32, num_classes=4)
    ref = m.state_dict()
    assert any(not v.is_floating_point() for v in ref.values())  # the counters
    half = {k: v.half() if v.is_floating_point() else v for k, v in ref.items()}
    with pytest.warns(UserWarning, match=r"tensor\(s\) in torch.float16 .* widened to the model's torch.float32"):
        out = check_state_dict(half, 'w.pth', ref)
    assert {k: v.dtype for k, v in out.items()} == {k: v.dtype for k, v in ref.items()}
    m.load_state_dict(out)
