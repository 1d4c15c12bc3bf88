"""timm's model contract on our models (chapter 23, `t2t_course.deploy.contract`): `import t2t_course` alone, with timm
unimportable, gives every model the contract's methods; `forward_intermediates` with no block named is refused. What
timm itself asks of our models: tests/deploy/test_timm.py."""
import subprocess, sys

import pytest
import torch

import t2t_course


def test_timm_contract_without_timm():
    "`import t2t_course` alone (timm unimportable) gives every model timm's contract methods (chapter 23's `contract`)."
    code = ("import sys; sys.modules['timm'] = None; import torch, t2t_course; "
            "from t2t_course.models.backbone import feature_take_indices; "
            "m = t2t_course.create_model('t2t_vit_7', img_size=32, depth=2); m.set_grad_checkpointing(); "
            "r = t2t_course.create_model('resnet_baseline', num_classes=3, img_size=32).eval(); "
            "print(len(m.feature_info), m.group_matcher()['stem'], len(m.forward_intermediates(torch.zeros(1, 3, 32, 32), 1)[1]), "
            "m.grad_checkpointing, m.head_hidden_size, m.pretrained_cfg is m.default_cfg, feature_take_indices(3, 1), "
            "len(r.forward_intermediates(torch.zeros(1, 3, 32, 32))))")
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == '2 ^cls_token|^pos_embed|^tokens_to_token 1 True 256 True [2] 5'


def test_forward_intermediates_needs_a_block():
    model = t2t_course.create_model('t2t_vit_7', img_size=32)
    with pytest.raises(ValueError, match=r'name at least one block \(of 7\)'):
        model.forward_intermediates(torch.zeros(1, 3, 32, 32), indices=())
