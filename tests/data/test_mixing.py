"""MixUp, CutMix and the label-smoothed loss (chapter 11d, `t2t_course.data.mixing`): mixed targets and pixels by their
formulas and the switches, and the loss with soft and hard targets against its definition."""
import pytest
import torch
import torch.nn.functional as F

from t2t_course.data import MixupCutmix, create_loss


def test_mixup_cutmix_targets_and_pixels():
    torch.manual_seed(0)
    B, K = 8, 12
    x = torch.arange(B, dtype=torch.float32).view(B, 1, 1, 1).expand(B, 3, 16, 16).clone()  # image i is all i
    y = torch.arange(B) + 2
    seen = set()
    mixer = MixupCutmix(K)  # the recipe: prob 1, switch 0.5
    for _ in range(40):
        xm, ym = mixer(x, y)
        assert ym.shape == (B, K) and ym.dtype == torch.float32
        assert torch.allclose(ym.sum(1), torch.ones(B))
        lam = ym[torch.arange(B), y]                          # weight of each sample's own class
        other = ym[torch.arange(B), y.roll(1)]                # weight of the partner's class
        assert torch.allclose(lam + other, torch.ones(B))
        is_cutmix = bool(((xm == x) | (xm == x.roll(1, 0))).all()) and not torch.allclose(lam, torch.ones(B))
        if is_cutmix:
            assert torch.allclose((xm == x).float().mean((1, 2, 3)), lam, atol=1e-6)
        else:
            l = lam.view(B, 1, 1, 1)
            assert torch.allclose(xm, l * x + (1 - l) * x.roll(1, 0), atol=1e-5)
        seen.add('cutmix' if is_cutmix else 'mixup')
    assert seen == {'mixup', 'cutmix'}  # both are chosen, per batch
    # switches
    xo, yo = MixupCutmix(K, prob=0.)(x, y)
    assert torch.equal(xo, x) and torch.equal(yo, F.one_hot(y, K).float())
    xo, yo = MixupCutmix(K, mixup_alpha=0., cutmix_alpha=0.)(x, y)
    assert torch.equal(xo, x) and not MixupCutmix(K, mixup_alpha=0., cutmix_alpha=0.).enabled
    for _ in range(5):
        xc, _ = MixupCutmix(K, switch_prob=1.)(x, y)
        assert ((xc == x) | (xc == x.roll(1, 0))).all()  # always CutMix: every pixel from one of the two
    with pytest.raises(ValueError, match='>= 0'): MixupCutmix(K, cutmix_alpha=-0.5)
    with pytest.raises(ValueError, match=r'\(B,\)'): MixupCutmix(K)(x, F.one_hot(y, K))


def test_loss_with_soft_and_hard_targets():
    torch.manual_seed(0)
    B, K, eps = 6, 5, 0.1
    logits, y = torch.randn(B, K), torch.randint(0, K, (B,))
    logp = logits.log_softmax(-1)
    train_loss = create_loss(True, eps)
    hard_ref = -(((1 - eps) * F.one_hot(y, K) + eps / K) * logp).sum(-1).mean()
    assert torch.allclose(train_loss(logits, y), hard_ref, atol=1e-6)
    soft = torch.softmax(torch.randn(B, K), -1)
    soft_ref = -(((1 - eps) * soft + eps / K) * logp).sum(-1).mean()
    assert torch.allclose(train_loss(logits, soft), soft_ref, atol=1e-6)
    assert create_loss(False).label_smoothing == 0.0
    assert torch.allclose(create_loss(False)(logits, y), F.nll_loss(logp, y))
    with pytest.raises(ValueError, match='label_smoothing'): create_loss(True, 1.0)
