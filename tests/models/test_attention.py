"Chapter 03 (`t2t_course.models.attention`): attention functions, Attention, Mlp, DropPath, Block; both paths."
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from t2t_course.models.attention import (attention, attention_naive, set_fused_attn, Attention, Mlp, drop_path,
                                  DropPath, Block)
from tests.support.official_reference import softmax_attention_loops, block_reference, OFFICIAL_BLOCK_384, perturb_, max_rel_err


def _qkv(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(3)]



# ---------------------------------------------------------------- attention functions
@pytest.mark.parametrize('scale', [None, 0.3])
def test_naive_matches_loops(scale):
    q, k, v = _qkv(2, 3, 9, 8)
    out, w = attention_naive(q, k, v, scale=scale, return_weights=True)
    s = 8 ** -0.5 if scale is None else scale
    for b in range(2):
        for h in range(3):
            ref = softmax_attention_loops(q[b, h], k[b, h], v[b, h], s)
            assert torch.allclose(out[b, h].double(), ref, atol=1e-5)
    assert torch.allclose(w.sum(-1), torch.ones(2, 3, 9), atol=1e-6)


def test_naive_three_dim_and_cross_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 5, 8, generator=g), torch.randn(2, 7, 8, generator=g), torch.randn(2, 7, 4, generator=g)
    out = attention_naive(q, k, v)                      # (B, N, d) inputs, 5 queries, 7 keys
    assert out.shape == (2, 5, 4)
    ref = softmax_attention_loops(q[1], k[1], v[1], 8 ** -0.5)
    assert torch.allclose(out[1].double(), ref, atol=1e-5)
    assert torch.allclose(attention(q, k, v), out, atol=1e-6)


@pytest.mark.parametrize('scale', [None, 147 ** -0.5, 1.0])
def test_attention_is_sdpa(scale):
    "The fast path is PyTorch's SDPA with the scale passed through (its agreement with the readable path: test_fast_paths)."
    q, k, v = _qkv(2, 4, 33, 16)
    assert torch.allclose(attention(q, k, v, scale=scale), F.scaled_dot_product_attention(q, k, v, scale=scale), atol=1e-6)


def test_dropout_only_in_training():
    q, k, v = _qkv(2, 2, 12, 8)
    ref = attention_naive(q, k, v)
    for fused in (True, False):  # not training: dropout_p is ignored on both paths (SDPA would apply it!)
        assert torch.allclose(attention(q, k, v, dropout_p=0.5, training=False, fused=fused), ref, atol=1e-6)
        assert torch.allclose(attention(q, k, v, dropout_p=0., training=True, fused=fused), ref, atol=1e-6)
        assert (attention(q, k, v, dropout_p=0.5, training=True, fused=fused) - ref).abs().max() > 1e-2


@pytest.mark.parametrize('fused', [True, False])
def test_dropout_is_unbiased(fused):
    "Dropout on the weights rescales the kept ones: the mean output over many draws is the eval output."
    torch.manual_seed(0)
    q, k, v = _qkv(1, 1, 6, 4)
    ref = attention_naive(q, k, v)
    q, k, v = (t.expand(4000, 1, 6, 4) for t in (q, k, v))   # 4000 independent dropout draws
    mean = attention(q, k, v, dropout_p=0.3, training=True, fused=fused).mean(0, keepdim=True)
    assert (mean - ref).abs().max() < 0.05


@pytest.mark.parametrize('bad, msg', [
    (lambda q, k, v: attention(q, k[..., :4], v), 'q and k must have the same width'),
    (lambda q, k, v: attention(q, k, v[..., :3, :]), 'same number of tokens'),
    (lambda q, k, v: attention(q[0, 0], k[0, 0], v[0, 0]), '(B, h, N, d)'),
    (lambda q, k, v: attention(q, k[:1], v[:1]), 'same batch and head sizes'),
    (lambda q, k, v: attention_naive(q, k, v, dropout_p=-0.1), 'dropout_p must be in [0, 1]'),
])
def test_attention_errors(bad, msg):
    q, k, v = _qkv(2, 2, 5, 8)
    with pytest.raises(ValueError, match=msg.replace('(', r'\(').replace(')', r'\)').replace('[', r'\[').replace(']', r'\]')):
        bad(q, k, v)
    with pytest.raises(TypeError, match='q must be a tensor'): attention([1.], k, v)


# ---------------------------------------------------------------- Attention module
def test_attention_layout_matches_multihead_attention():
    torch.manual_seed(0)
    attn = Attention(32, num_heads=4, qkv_bias=True).eval()
    mha = nn.MultiheadAttention(32, 4, bias=True, batch_first=True).eval()
    mha.load_state_dict({'in_proj_weight': attn.qkv.weight, 'in_proj_bias': attn.qkv.bias,
                         'out_proj.weight': attn.proj.weight, 'out_proj.bias': attn.proj.bias})
    x = torch.randn(2, 11, 32)
    with torch.no_grad():
        ref = mha(x, x, x, need_weights=False)[0]
        assert torch.allclose(attn(x), ref, atol=1e-5)
        assert torch.allclose(set_fused_attn(attn, False)(x), ref, atol=1e-5)


def test_attention_qk_scale_and_errors():
    assert Attention(64, num_heads=8).scale == 8 ** -0.5
    assert Attention(64, num_heads=8, qk_scale=0.1).scale == 0.1
    assert set(Attention(64).state_dict()) == {'qkv.weight', 'proj.weight', 'proj.bias'}
    assert set(Attention(64, qkv_bias=True).state_dict()) == {'qkv.weight', 'qkv.bias', 'proj.weight', 'proj.bias'}
    with pytest.raises(ValueError, match=r'dim \(30\) must be divisible by num_heads \(4\)'): Attention(30, num_heads=4)


def test_set_fused_attn():
    model = nn.Sequential(Block(16, 2), nn.Linear(16, 16), Block(16, 4))
    assert set_fused_attn(model, False) is model
    flags = [m.fused_attn for m in model.modules() if hasattr(m, 'fused_attn')]
    assert flags == [False, False]
    set_fused_attn(model, True)
    assert all(m.fused_attn for m in model.modules() if hasattr(m, 'fused_attn'))
    with pytest.raises(TypeError, match='enabled must be a bool'): set_fused_attn(model, 0)
    with pytest.raises(TypeError, match='model must be an nn.Module'): set_fused_attn([model], True)


# ---------------------------------------------------------------- Mlp, DropPath
def test_mlp():
    torch.manual_seed(0)
    mlp = Mlp(8, 24, 5)
    assert set(mlp.state_dict()) == {'fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias'}
    assert isinstance(mlp.act, nn.GELU) and mlp.act.approximate == 'none'
    x = torch.randn(3, 4, 8)
    assert torch.allclose(mlp(x), F.linear(F.gelu(F.linear(x, mlp.fc1.weight, mlp.fc1.bias)), mlp.fc2.weight, mlp.fc2.bias))
    assert Mlp(8)(x).shape == (3, 4, 8)
    drop = Mlp(8, 24, drop=0.5).train()
    assert not torch.allclose(drop(x), drop.eval()(x))


def test_drop_path_semantics():
    torch.manual_seed(0)
    x = torch.randn(5000, 3, 4) + 2.
    out = drop_path(x, 0.3, training=True)
    dropped = (out == 0).flatten(1).all(1)
    kept = ~dropped
    assert ((out != 0).flatten(1).all(1) | dropped).all()            # one draw per sample: all or nothing
    assert torch.allclose(out[kept], x[kept] / 0.7)                  # rescaled by the keep probability
    assert abs(kept.float().mean().item() - 0.7) < 0.03
    assert drop_path(x, 0.3, training=False) is x                    # eval: identity
    assert drop_path(x, 0., training=True) is x                      # rate 0: identity
    assert (drop_path(x, 1., training=True) == 0).all()
    m = DropPath(0.3)
    assert m.eval()(x) is x and 'drop_prob=0.3' in repr(m)
    assert (m.train()(x) == 0).flatten(1).all(1).any()
    with pytest.raises(ValueError, match=r'drop_prob must be in \[0, 1\]'): DropPath(-0.1)
    with pytest.raises(ValueError, match=r'drop_prob must be in \[0, 1\]'): drop_path(x, 2., True)


# ---------------------------------------------------------------- Block
def test_block_official_layout_and_reference():
    torch.manual_seed(0)
    blk = Block(384, num_heads=6, mlp_ratio=3., qkv_bias=False)
    assert {k: tuple(v.shape) for k, v in blk.state_dict().items()} == OFFICIAL_BLOCK_384
    blk = perturb_(Block(48, num_heads=6, mlp_ratio=3.), std=0.1).eval()
    x = torch.randn(2, 13, 48)
    ref = block_reference(x, blk.state_dict(), num_heads=6)
    with torch.no_grad():
        assert max_rel_err(blk(x), ref) < 1e-5
        assert max_rel_err(set_fused_attn(blk, False)(x), ref) < 1e-5
        wrong = block_reference(x, blk.state_dict(), num_heads=3)   # a reference that must disagree
        assert max_rel_err(blk(x), wrong) > 1e-3


def test_block_eval_ignores_dropouts_on_both_paths():
    torch.manual_seed(0)
    blk = Block(32, num_heads=4, drop=0.3, attn_drop=0.3, drop_path=0.3).eval()
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        ref = block_reference(x, blk.state_dict(), num_heads=4)
        assert max_rel_err(blk(x), ref) < 1e-5
        assert max_rel_err(set_fused_attn(blk, False)(x), ref) < 1e-5
        blk.train()
        assert max_rel_err(blk(x), ref) > 1e-3
