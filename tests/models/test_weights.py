"""Reading a checkpoint file safely (chapter 08a, `t2t_course.models.weights`): every file that cannot be read (text,
truncated, empty, pickled numpy, a list, a dict without weights) is one message naming the file and what was expected,
through `create_model(pretrained=path)` and `load_checkpoint`; a pickle that calls a function is refused, never run."""
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
