"Chapter 04 (`t2t_course.models.t2t_layer`): TokenTransformer against an independent reference of the official semantics."
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from t2t_course.models.attention import set_fused_attn
from t2t_course.models.t2t_layer import TokenAttention, TokenTransformer
from tests.support.official_reference import OFFICIAL_TOKEN_TRANSFORMER, token_transformer_reference, perturb_, max_rel_err



class LargestTensor(TorchDispatchMode):
    "Records the largest number of elements of any tensor an op returns."
    def __init__(self):
        super().__init__(); self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor): self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize('which, dim', [('attention1', 147), ('attention2', 576)])
def test_official_state_dict_layout(which, dim):
    layer = TokenTransformer(dim, 64, num_heads=1, mlp_ratio=1.)
    assert {k: tuple(v.shape) for k, v in layer.state_dict().items()} == OFFICIAL_TOKEN_TRANSFORMER[which]
    assert layer.attn.scale == dim ** -0.5                     # from the INPUT width, not 64


@pytest.mark.parametrize('dim', [147, 576])
@pytest.mark.parametrize('fused', [True, False])
def test_matches_independent_reference(dim, fused):
    torch.manual_seed(0)
    layer = perturb_(TokenTransformer(dim, 64), std=0.05).eval()
    set_fused_attn(layer, fused)
    x = torch.randn(2, 40, dim)
    ref = token_transformer_reference(x, layer.state_dict())
    with torch.no_grad(): out = layer(x)
    assert out.shape == (2, 40, 64)
    assert max_rel_err(out, ref) < 1e-4
    # the reference is sensitive to each official quirk: a wrong scale or a wrong q/k/v order disagrees
    assert max_rel_err(out, token_transformer_reference(x, layer.state_dict(), scale=64 ** -0.5)) > 1e-3
    assert max_rel_err(out, token_transformer_reference(x, layer.state_dict(), order='kqv')) > 1e-3


def test_state_dict_round_trip_strict():
    torch.manual_seed(0)
    a = perturb_(TokenTransformer(147, 64)).eval()
    b = TokenTransformer(147, 64).eval()
    b.load_state_dict(a.state_dict(), strict=True)
    x = torch.randn(1, 10, 147)
    with torch.no_grad(): assert torch.equal(a(x), b(x))


def test_fused_path_never_builds_n_by_n():
    torch.manual_seed(0)
    layer = TokenTransformer(147, 64).eval()
    x = torch.randn(1, 3136, 147)                                # the 224 px first layer
    with torch.no_grad():
        with LargestTensor() as fast: out_fast = layer(x)
        with LargestTensor() as naive: out_naive = set_fused_attn(layer, False)(x)
    assert naive.largest >= 3136 * 3136                          # the detector sees the materialized weights
    assert fast.largest < 3136 * 3136 // 10                      # nothing near N x N on the SDPA path
    assert max_rel_err(out_fast, out_naive) < 1e-5


def test_dropout_semantics():
    torch.manual_seed(0)
    layer = TokenTransformer(147, 64, attn_drop=0.5, drop=0.2).eval()
    x = torch.randn(2, 30, 147)
    ref = token_transformer_reference(x, layer.state_dict())
    with torch.no_grad():
        assert max_rel_err(layer(x), ref) < 1e-4
        assert max_rel_err(set_fused_attn(layer, False)(x), ref) < 1e-4
        for fused in (True, False):
            assert max_rel_err(set_fused_attn(layer, fused).train()(x), ref) > 1e-3
            layer.eval()


def test_multi_head_merges_v_per_head():
    "num_heads > 1 (not in the official models): each head's v is added to that head's output."
    torch.manual_seed(0)
    att = TokenAttention(40, 12, num_heads=3, qkv_bias=True).eval()
    x = torch.randn(2, 9, 40)
    Wq, Wk, Wv = att.qkv.weight.chunk(3); bq, bk, bv = att.qkv.bias.chunk(3)
    outs, vs = [], []
    for j in range(3):
        r = slice(4 * j, 4 * (j + 1))
        q, k, v = x @ Wq[r].T + bq[r], x @ Wk[r].T + bk[r], x @ Wv[r].T + bv[r]
        outs.append(torch.softmax(q @ k.transpose(1, 2) * (40 // 3) ** -0.5, -1) @ v); vs.append(v)
    ref = torch.cat(vs, -1) + att.proj(torch.cat(outs, -1))
    with torch.no_grad():
        assert torch.allclose(att(x), ref, atol=1e-5)
        assert torch.allclose(set_fused_attn(att, False)(x), ref, atol=1e-5)
    assert TokenTransformer(40, 12, num_heads=3)(x).shape == (2, 9, 12)


def test_errors():
    with pytest.raises(ValueError, match=r'in_dim \(64\) must be divisible by num_heads \(3\)'): TokenAttention(147, 64, num_heads=3)
    with pytest.raises(ValueError, match=r'expected tokens of shape \(B, N, 147\)'): TokenTransformer(147, 64)(torch.randn(2, 5, 576))
    with pytest.raises(ValueError, match=r'expected tokens of shape \(B, N, 147\)'): TokenAttention(147, 64)(torch.randn(5, 147))


@pytest.mark.slow
def test_9216_tokens_fused_equals_materialized():
    "384 px first layer: SDPA and the materialized path agree (the latter builds a 340 MB matrix)."
    torch.manual_seed(0)
    layer = TokenTransformer(147, 64).eval()
    x = torch.randn(1, 9216, 147)
    with torch.no_grad():
        with LargestTensor() as fast: a = layer(x)
        b = set_fused_attn(layer, False)(x)
    assert fast.largest < 9216 * 9216 // 10
    assert max_rel_err(a, b) < 1e-5
