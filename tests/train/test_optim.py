"""Optimisation (chapter 13, `t2t_course.train.optim`): the weight-decay groups, the warm-up cosine schedule and the EMA
against hand computation, the fused optimizer kernel, and an EMA update that never reads a value back from the device."""
import math

import torch

from t2t_course.models.t2t_vit import create_model
from t2t_course.train.optim import ModelEma, WarmupCosineSchedule, param_groups_weight_decay

from tests.support.commands import TINY
from tests.support.host_reads import count_reads


def test_weight_decay_groups():
    model = create_model('t2t_vit_7', num_classes=3, img_size=32, **TINY)
    model.head.weight.requires_grad_(False)  # a frozen parameter gets no group at all
    groups = param_groups_weight_decay(model, 0.05)
    ids = {id(p): n for n, p in model.named_parameters()}
    no_decay, decay = ({ids[id(p)] for p in g['params']} for g in groups)
    assert (groups[0]['weight_decay'], groups[1]['weight_decay']) == (0., 0.05)
    expect_no = {n for n, p in model.named_parameters() if p.requires_grad and (n.endswith('.bias') or 'norm' in n or n == 'cls_token')}
    expect_yes = {n for n, p in model.named_parameters() if p.requires_grad and n.endswith('.weight') and 'norm' not in n}
    assert no_decay == expect_no and decay == expect_yes
    assert 'head.weight' not in no_decay | decay and 'cls_token' in no_decay
    names = {n for n, _ in model.named_parameters()}
    assert 'pos_embed' not in names and not any(n.endswith('.w') for n in names)  # buffers, never optimised


def test_schedule_and_ema_against_hand_computation():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.)
    sched = WarmupCosineSchedule(opt, peak_lr=1e-3, warmup_steps=10, decay_steps=110, min_lr=1e-5, warmup_lr=1e-6)
    seen = []
    for s in range(130):
        seen.append(opt.param_groups[0]['lr']); sched.step()
    assert seen[0] == 1e-6 and math.isclose(seen[5], 1e-6 + (1e-3 - 1e-6) * 5 / 10)
    assert math.isclose(seen[10], 1e-3) and math.isclose(seen[60], (1e-3 + 1e-5) / 2)  # half-way down the cosine
    assert seen[110] == seen[129] == 1e-5
    lin = torch.nn.Linear(2, 1)
    ema = ModelEma(lin, decay=0.5)
    w0 = lin.weight.detach().clone()
    with torch.no_grad(): lin.weight.add_(1.)
    ema.update_parameters(lin)  # the first update copies the weights (AveragedModel's rule)
    torch.testing.assert_close(ema.module.weight, w0 + 1)
    with torch.no_grad(): lin.weight.add_(1.)
    ema.update_parameters(lin)  # after 1 update: decay min(0.5, 2/11) = 2/11: ema = 2/11 (w0 + 1) + 9/11 (w0 + 2)
    torch.testing.assert_close(ema.module.weight, w0 + 1 + 9 / 11)


def test_optimizer_uses_the_fused_kernel_when_available():
    from t2t_course.train.optim import create_optimizer
    opt = create_optimizer(create_model('t2t_vit_7', img_size=32, num_classes=10), lr=1e-3)
    assert opt.defaults.get('fused') in (True, None)  # None only on a torch without a fused CPU kernel
    if tuple(int(v) for v in torch.__version__.split('.')[:2]) >= (2, 4): assert opt.defaults['fused'] is True


def test_ema_update_reads_nothing_back(monkeypatch):
    "ModelEma keeps its update count on the host and its parameter lists cached: an update never waits for the device."
    from t2t_course.models.t2t_vit import create_model
    from t2t_course.train.optim import ModelEma
    model = create_model('t2t_vit_7', num_classes=3, img_size=32, **TINY)
    ema = ModelEma(model, 0.99)
    ema.update_parameters(model)
    pairs = ema._pairs
    reads = count_reads(monkeypatch)
    for _ in range(3): ema.update_parameters(model)
    monkeypatch.undo()
    assert reads == [] and ema._pairs is pairs and ema.num_updates == 4 and isinstance(ema.num_updates, int)
