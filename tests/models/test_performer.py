"Chapter 05 (`t2t_course.models.performer`): FAVOR+ properties, TokenPerformer against the official semantics, mixed precision."
import math

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from t2t_course.core import set_fast_paths
from t2t_course.models.performer import (gaussian_features, positive_features, trig_features, linear_attention,
                                  favor_attention, orthonormal_features, TokenPerformer)
from tests.support.official_reference import OFFICIAL_TOKEN_PERFORMER, token_performer_reference, perturb_, max_rel_err


def _gen(seed): return torch.Generator().manual_seed(seed)


def _exact(q, k, v, scale):
    return torch.softmax(q @ k.transpose(-2, -1) * scale, -1) @ v


# ---------------------------------------------------------------- random features
def test_gaussian_features():
    w = gaussian_features(300, 16, generator=_gen(0))
    assert w.shape == (300, 16) and w.dtype == torch.float32
    assert torch.equal(w, gaussian_features(300, 16, generator=_gen(0)))        # reproducible
    wo = gaussian_features(40, 16, orthogonal=True, generator=_gen(0))           # 3 blocks, the last one partial
    assert wo.shape == (40, 16)
    u = wo / wo.norm(dim=-1, keepdim=True)
    for b in range(3):
        blk = u[16 * b:16 * (b + 1)]
        assert torch.allclose(blk @ blk.T, torch.eye(len(blk)), atol=1e-5)      # orthogonal within a block
    norms2 = gaussian_features(20_000, 16, orthogonal=True, generator=_gen(1)).pow(2).sum(-1)
    assert abs(norms2.mean().item() - 16) < 0.3 and abs(norms2.var().item() - 32) < 2.5   # chi^2(16) like Gaussian rows
    assert gaussian_features(np.int64(4), 3).shape == (4, 3)
    for bad in [(0, 4), (4, -1), (2.5, 4)]:
        with pytest.raises(ValueError, match='m and d must be positive ints'): gaussian_features(*bad)


def test_feature_signs():
    w = gaussian_features(64, 16, generator=_gen(0))
    x = torch.randn(500, 16, generator=_gen(1)) * 0.8
    assert (positive_features(x, w) > 0).all()
    assert (trig_features(x, w) < 0).any()
    assert positive_features(x, w).shape == (500, 64) and trig_features(x, w).shape == (500, 128)
    with pytest.raises(ValueError, match='x has width 8 but w has 16 columns'): positive_features(x[:, :8], w)
    with pytest.raises(ValueError, match='x has width 8 but w has 16 columns'): trig_features(x[:, :8], w)


@pytest.mark.parametrize('orthogonal', [False, True])
@pytest.mark.parametrize('phi', [positive_features, trig_features])
def test_kernel_estimate_unbiased(phi, orthogonal):
    "Mean of phi(x).phi(y) over many features is within 3% of exp(x.y) at small norms."
    g = _gen(0)
    for _ in range(3):
        x, y = torch.randn(2, 16, generator=g)
        x, y = 0.5 * x / x.norm(), 0.5 * y / y.norm()
        w = gaussian_features(40_000, 16, orthogonal=orthogonal, generator=g)
        est = (phi(x[None], w) @ phi(y[None], w).T).item()
        assert abs(est / math.exp(x @ y) - 1) < 0.03


def test_positive_estimator_variance_formula():
    "Relative std of one positive estimate with m i.i.d. features is sqrt((exp|x+y|^2 - 1) / m)."
    g = _gen(3)
    x = torch.randn(16, generator=g); x = 0.3 * x / x.norm()
    z = torch.randn(16, generator=g); z = z / z.norm()                  # |x + y|^2 = 1
    y = z - x
    m, R = 64, 2000
    ws = gaussian_features(m * R, 16, generator=g).view(R, m, 16)
    est = (positive_features(x[None], ws) * positive_features(y[None], ws)).sum(-1).squeeze(-1)  # (R,)
    rel_std = (est.std() / torch.exp(x @ y)).item()
    assert abs(rel_std / math.sqrt((math.e - 1) / m) - 1) < 0.15


def _favor_error(sigma, ms, orthogonal, d=64, N=128, draws=20, seed=0):
    g = _gen(seed)
    q, k = (torch.randn(2, N, d, generator=g) * sigma).unbind(0)
    v = torch.randn(N, d, generator=g)
    exact = _exact(q, k, v, d ** -0.5)
    errs = []
    for m in ms:
        e = [((favor_attention(q, k, v, gaussian_features(m, d, orthogonal, g)) - exact).norm() / exact.norm()) ** 2
             for _ in range(draws)]
        errs.append(torch.stack(e).mean().sqrt().item())
    return np.array(errs)


MS = np.array([8, 16, 32, 64, 128, 256, 512, 1024])


def test_error_falls_like_inverse_sqrt_m_at_small_norms():
    "q, k ~ N(0, 0.25^2 I) before the d^-1/4 scaling: log-log slope of the error vs m in [-0.6, -0.4]."
    iid, orth = _favor_error(0.25, MS, False), _favor_error(0.25, MS, True)
    slope = np.polyfit(np.log(MS), np.log(iid), 1)[0]
    assert -0.6 < slope < -0.4
    assert (orth <= iid * 1.1).all()                                  # orthogonal features no worse than i.i.d.
    assert orth.mean() < iid.mean()


def test_error_law_fails_at_large_norms():
    "At large norms the error stays near its maximum over this range of m: the slope is far from -1/2."
    err = _favor_error(2.0, MS, False, draws=8)
    assert np.polyfit(np.log(MS), np.log(err), 1)[0] > -0.2
    assert err.min() > 0.5


def test_linear_attention_equals_quadratic_and_favor():
    g = _gen(0)
    q, k, v = torch.randn(3, 2, 50, 16, generator=g).unbind(0)
    w = gaussian_features(32, 16, orthogonal=True, generator=g)
    qp, kp = positive_features(q * 16 ** -0.25, w), positive_features(k * 16 ** -0.25, w)
    a = qp @ kp.transpose(1, 2)
    quad = (a / a.sum(-1, keepdim=True)) @ v
    assert torch.allclose(linear_attention(qp, kp, v), quad, atol=1e-5)
    assert torch.allclose(favor_attention(q, k, v, w), linear_attention(qp, kp, v), atol=1e-6)
    s = 0.3
    qp2, kp2 = positive_features(q * s ** 0.5, w), positive_features(k * s ** 0.5, w)
    assert torch.allclose(favor_attention(q, k, v, w, scale=s), linear_attention(qp2, kp2, v), atol=1e-6)
    tq, tk = trig_features(q * 16 ** -0.25, w), trig_features(k * 16 ** -0.25, w)
    assert torch.allclose(favor_attention(q, k, v, w, kind='trig'), linear_attention(tq, tk, v), atol=1e-5)
    with pytest.raises(ValueError, match="kind must be 'positive' or 'trig'"): favor_attention(q, k, v, w, kind='relu')
    with pytest.raises(ValueError, match='same number of tokens'): linear_attention(qp, kp[:, :10], v)
    with pytest.raises(ValueError, match='same number of features'): linear_attention(qp[..., :8], kp, v)


def test_favor_approaches_softmax_attention():
    g = _gen(1)
    q, k = (torch.randn(2, 1, 128, 64, generator=g) * 0.25).unbind(0)
    v = torch.randn(1, 128, 64, generator=g)
    exact = _exact(q, k, v, 64 ** -0.5)
    err = lambda m: ((favor_attention(q, k, v, gaussian_features(m, 64, True, generator=g)) - exact).norm() / exact.norm()).item()
    assert err(8192) < 0.02 < err(16)


def test_cost_linear_in_sequence_length():
    w = gaussian_features(32, 64, generator=_gen(0))

    def flops(f, N):
        q, k, v = torch.randn(3, 1, N, 64).unbind(0)
        with FlopCounterMode(display=False) as fc: f(q, k, v)
        return fc.get_total_flops()

    fav = lambda q, k, v: favor_attention(q, k, v, w)
    ex = lambda q, k, v: _exact(q, k, v, 0.125)
    assert flops(fav, 2048) == 2 * flops(fav, 1024)
    assert flops(ex, 2048) == 4 * flops(ex, 1024)


# ---------------------------------------------------------------- TokenPerformer
@pytest.mark.parametrize('which, dim', [('attention1', 147), ('attention2', 576)])
def test_official_state_dict_layout(which, dim):
    layer = TokenPerformer(dim, 64)
    assert {k: tuple(v.shape) for k, v in layer.state_dict().items()} == OFFICIAL_TOKEN_PERFORMER[which]
    assert 'w' in dict(layer.named_buffers()) and 'w' not in dict(layer.named_parameters())
    assert layer.m == 32 and layer.epsilon == 1e-8
    assert torch.allclose(layer.w @ layer.w.T, 32 * torch.eye(32), atol=1e-4)   # orthonormal rows times sqrt(32)
    assert layer.dp.p == 0.1 and layer.mlp[3].p == 0.1
    assert isinstance(layer.mlp[1], torch.nn.GELU)


def test_head_cnt_and_kernel_ratio_follow_the_official_code():
    layer = TokenPerformer(147, 64, head_cnt=2, kernel_ratio=0.25, dp1=0.2, dp2=0.3)
    assert layer.emb == 128 and layer.m == 32
    assert layer.kqv.weight.shape == (384, 147) and layer.w.shape == (32, 128)
    assert layer.dp.p == 0.2 and layer.mlp[3].p == 0.3
    assert layer.eval()(torch.randn(1, 5, 147)).shape == (1, 5, 128)


@pytest.mark.parametrize('dim', [147, 576])
@pytest.mark.parametrize('batched_favor', [True, False])
def test_matches_independent_reference(dim, batched_favor):
    torch.manual_seed(0)
    layer = perturb_(TokenPerformer(dim, 64), std=0.01).eval()
    layer.batched_favor = batched_favor
    x = torch.randn(2, 60, dim)
    ref = token_performer_reference(x, layer.state_dict())
    with torch.no_grad(): out = layer(x)
    assert out.shape == (2, 60, 64)
    assert max_rel_err(out, ref) < 1e-4
    # sensitivity: the k,q,v order and the absence of a temperature both matter
    assert max_rel_err(out, token_performer_reference(x, layer.state_dict(), order='qkv')) > 1e-3
    assert max_rel_err(out, token_performer_reference(x, layer.state_dict(), temperature=64 ** -0.25)) > 1e-3


def test_w_is_fixed_and_travels_with_the_state_dict():
    torch.manual_seed(0)
    a = TokenPerformer(147, 64)
    w0 = a.w.clone()
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    for _ in range(2):
        a.train()(torch.randn(2, 20, 147)).square().mean().backward(); opt.step()
    assert torch.equal(a.w, w0)                                       # never redrawn, never trained
    b = TokenPerformer(147, 64)
    assert not torch.equal(b.w, w0)                                   # a new layer draws its own map ...
    b.load_state_dict(a.state_dict(), strict=True)
    assert torch.equal(b.w, w0)                                       # ... and a checkpoint brings it back
    x = torch.randn(1, 10, 147)
    with torch.no_grad(): assert torch.equal(a.eval()(x), b.eval()(x))
    with pytest.raises(RuntimeError, match='w'):
        sd = a.state_dict(); sd.pop('w'); TokenPerformer(147, 64).load_state_dict(sd, strict=True)



def test_dropouts_only_in_training():
    torch.manual_seed(0)
    layer = TokenPerformer(147, 64).eval()
    x = torch.randn(2, 30, 147)
    with torch.no_grad():
        a, b = layer(x), layer(x)
        assert torch.equal(a, b)
        assert max_rel_err(layer.train()(x), a) > 1e-3
    assert max_rel_err(TokenPerformer(147, 64, dp1=0., dp2=0.).train()(x), TokenPerformer(147, 64).eval()(x)) > 0  # smoke


def test_errors():
    with pytest.raises(ValueError, match=r'expected tokens of shape \(B, N, 147\)'): TokenPerformer(147, 64)(torch.randn(2, 5, 576))
    with pytest.raises(ValueError, match='need m >= 1'): TokenPerformer(147, 1, kernel_ratio=0.5)
    with pytest.raises(ValueError, match='need 0 < m <= d'): orthonormal_features(65, 64)


# ---------------------------------------------------------------- mixed precision
def _official_unguarded(layer, x):
    "The official single_attn, op for op, with no float32 guard (what the official code runs under autocast)."
    k, q, v = torch.split(layer.kqv(x), layer.emb, dim=-1)

    def prm_exp(t):
        xd = ((t * t).sum(dim=-1, keepdim=True)).repeat(1, 1, layer.m) / 2
        wtx = torch.einsum('bti,mi->btm', t.float(), layer.w)
        return torch.exp(wtx - xd) / math.sqrt(layer.m)

    kp, qp = prm_exp(k), prm_exp(q)
    D = torch.einsum('bti,bi->bt', qp, kp.sum(dim=1)).unsqueeze(dim=2)
    kptv = torch.einsum('bin,bim->bnm', v.float(), kp)
    y = torch.einsum('bti,bni->btn', qp, kptv) / (D.repeat(1, 1, layer.emb) + layer.epsilon)
    return v + layer.dp(layer.proj(y))


@pytest.mark.parametrize('factor', [1, 3, 10, 20])
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('fast', [True, False])
def test_autocast_finite_and_close(factor, dtype, fast):
    "kqv weights x3, x10, x20 (and x1): outputs under CPU autocast are finite and within 10% of float32, on both paths."
    torch.manual_seed(8)
    layer = set_fast_paths(TokenPerformer(147, 64).eval(), fast)
    x = torch.randn(2, 256, 147)
    with torch.no_grad():
        layer.kqv.weight.mul_(factor)
        ref = layer(x)
        with torch.autocast('cpu', dtype=dtype): out = layer(x)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    assert max_rel_err(out, ref) < 0.1


def test_official_ops_fail_under_fp16_autocast():
    "Shows the test above can fail: the unguarded official computation gives non-finite outputs."
    torch.manual_seed(8)
    layer = TokenPerformer(147, 64).eval()
    x = torch.randn(2, 256, 147)
    with torch.no_grad():
        layer.kqv.weight.mul_(10)
        with torch.autocast('cpu', dtype=torch.float16): bad = _official_unguarded(layer, layer.norm1(x))
    assert not torch.isfinite(bad).all()


def test_attention_term_under_autocast_is_accurate():
    "At x1 (where the attention term is not zero) the float32 core keeps it accurate under bf16 autocast."
    torch.manual_seed(0)
    layer = perturb_(TokenPerformer(147, 64), std=0.02).eval()
    x = torch.randn(2, 256, 147)
    with torch.no_grad():
        y = layer.norm1(x)
        ref = layer.single_attn(y) - layer.kqv(y)[..., 128:]                  # proj(attention) alone, float32
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = layer.single_attn(y).float() - layer.kqv(y)[..., 128:].float()
    assert ref.abs().max() > 0.05                                              # the term is really there
    assert max_rel_err(out, ref) < 0.1


def test_backward_under_autocast_and_half_model():
    torch.manual_seed(0)
    layer = TokenPerformer(147, 64)
    x = torch.randn(2, 64, 147, requires_grad=True)
    with torch.autocast('cpu', dtype=torch.bfloat16): out = layer(x)
    out.float().square().mean().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in layer.parameters())
    with torch.no_grad():
        ref = layer.eval()(x)
        bf = layer.to(torch.bfloat16)(x.to(torch.bfloat16))             # a bf16 model, no autocast
    assert bf.dtype == torch.bfloat16 and max_rel_err(bf, ref) < 0.1


# ---------------------------------------------------------------- the fixed map's bias
def _sphere_ratio(z2, m=32, d=64, terms=200):
    "Exact E[phi(x).phi(y)] / exp(x.y) when the rows of w are sqrt(m) times uniform unit vectors in R^d."
    c, total = 1., 1.
    for k in range(1, terms):
        c *= m * z2 / ((d + 2 * k - 2) * 2 * k)
        total += c
    return total * math.exp(-z2 / 2)


def test_fixed_map_is_biased_as_predicted():
    torch.manual_seed(0)
    ws = torch.stack([orthonormal_features(32, 64) for _ in range(400)])   # draws of the official map
    g = _gen(6)
    for r in (0.5, 1.5, 3.0):
        z = torch.randn(64, generator=g); z = r * z / z.norm()
        x = 0.05 * torch.randn(64, generator=g); y = z - x
        phx = torch.exp(ws @ x - (x @ x) / 2) / math.sqrt(32)
        phy = torch.exp(ws @ y - (y @ y) / 2) / math.sqrt(32)
        ratio = ((phx * phy).sum(-1).mean() / torch.exp(x @ y)).item()
        assert abs(math.log(ratio / _sphere_ratio(r * r))) < 0.1
        assert abs(math.log(ratio / math.exp(-(1 - 32 / 64) * r * r / 2))) < 0.2
    assert ratio < 0.2                                                      # far from unbiased at |x+y|^2 = 9


@pytest.mark.parametrize('dtype, core', [(torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16), (None, torch.float32)])
@pytest.mark.parametrize('fast', [True, False])
def test_float32_region_only_under_float16(dtype, core, fast, monkeypatch):
    "fp16 autocast: the feature map, D and the division in float32; bf16 (float32's range) and float32 run as they are."
    torch.manual_seed(0)
    layer = set_fast_paths(TokenPerformer(147, 64).eval(), fast)
    seen = []
    name = '_attn_batched' if fast else '_attn_naive'
    inner = getattr(layer, name)
    monkeypatch.setattr(layer, name, lambda k, q, v: (seen.append(k.dtype), inner(k, q, v))[1])
    x = torch.randn(2, 64, 147)
    with torch.no_grad(), torch.autocast('cpu', dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        out = layer(x)
    assert seen == [core] and torch.isfinite(out).all()


def test_bf16_model_without_autocast_runs_in_bf16():
    "A model cast to bfloat16 (no autocast): its buffer w follows, the core runs in bf16 and stays within 5% of float32."
    torch.manual_seed(0)
    layer = perturb_(TokenPerformer(147, 64), std=0.02).eval()
    x = torch.randn(2, 256, 147)
    with torch.no_grad():
        ref = layer(x)
        out = layer.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and max_rel_err(out, ref) < 0.05
