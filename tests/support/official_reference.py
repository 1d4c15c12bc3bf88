"""Independent references for the attention, T2T transformer and T2T Performer layers.

Written from the official T2T-ViT code's layers (its `token_transformer.py`, `token_performer.py` and ViT blocks), as plain
functions of a state_dict (a dict of tensors), in float64, without importing anything from
`t2t_course`. Tests load a layer's state_dict into these functions and compare outputs, so the tests
check the library against the facts, not against itself.

Also holds the official state_dict layouts (key -> shape) of the token layers and of one backbone
block, copied from reference/official_state_dicts.json (t2t_vit_14, t2t_vit_t_14).
"""
import math

import torch
import torch.nn.functional as F

# tokens_to_token.attention1.* and attention2.* of t2t_vit_t_14 (tokens_type 'transformer')
OFFICIAL_TOKEN_TRANSFORMER = {
    'attention1': {
        'norm1.weight': (147,), 'norm1.bias': (147,), 'attn.qkv.weight': (192, 147),
        'attn.proj.weight': (64, 64), 'attn.proj.bias': (64,), 'norm2.weight': (64,), 'norm2.bias': (64,),
        'mlp.fc1.weight': (64, 64), 'mlp.fc1.bias': (64,), 'mlp.fc2.weight': (64, 64), 'mlp.fc2.bias': (64,)},
    'attention2': {
        'norm1.weight': (576,), 'norm1.bias': (576,), 'attn.qkv.weight': (192, 576),
        'attn.proj.weight': (64, 64), 'attn.proj.bias': (64,), 'norm2.weight': (64,), 'norm2.bias': (64,),
        'mlp.fc1.weight': (64, 64), 'mlp.fc1.bias': (64,), 'mlp.fc2.weight': (64, 64), 'mlp.fc2.bias': (64,)},
}

# tokens_to_token.attention1.* and attention2.* of t2t_vit_14 (tokens_type 'performer'); `w` is frozen
OFFICIAL_TOKEN_PERFORMER = {
    'attention1': {
        'w': (32, 64), 'kqv.weight': (192, 147), 'kqv.bias': (192,), 'proj.weight': (64, 64), 'proj.bias': (64,),
        'norm1.weight': (147,), 'norm1.bias': (147,), 'norm2.weight': (64,), 'norm2.bias': (64,),
        'mlp.0.weight': (64, 64), 'mlp.0.bias': (64,), 'mlp.2.weight': (64, 64), 'mlp.2.bias': (64,)},
    'attention2': {
        'w': (32, 64), 'kqv.weight': (192, 576), 'kqv.bias': (192,), 'proj.weight': (64, 64), 'proj.bias': (64,),
        'norm1.weight': (576,), 'norm1.bias': (576,), 'norm2.weight': (64,), 'norm2.bias': (64,),
        'mlp.0.weight': (64, 64), 'mlp.0.bias': (64,), 'mlp.2.weight': (64, 64), 'mlp.2.bias': (64,)},
}

# blocks.0.* of t2t_vit_14 (embed_dim 384, 6 heads, mlp_ratio 3, no qkv bias)
OFFICIAL_BLOCK_384 = {
    'norm1.weight': (384,), 'norm1.bias': (384,), 'attn.qkv.weight': (1152, 384), 'attn.proj.weight': (384, 384),
    'attn.proj.bias': (384,), 'norm2.weight': (384,), 'norm2.bias': (384,), 'mlp.fc1.weight': (1152, 384),
    'mlp.fc1.bias': (1152,), 'mlp.fc2.weight': (384, 1152), 'mlp.fc2.bias': (384,)}

LN_EPS = 1e-5


def _d(sd):
    "The state_dict in float64."
    return {k: v.detach().double() for k, v in sd.items()}


def _ln(x, sd, name):
    return F.layer_norm(x, (x.shape[-1],), sd[name + '.weight'], sd[name + '.bias'], LN_EPS)


def _lin(x, sd, name):
    y = x @ sd[name + '.weight'].T
    return y + sd[name + '.bias'] if name + '.bias' in sd else y


def softmax_attention_loops(q, k, v, scale):
    "softmax(scale q k^T) v for one sequence (N, d), one query at a time, in float64."
    q, k, v = q.double(), k.double(), v.double()
    out = torch.empty(q.shape[0], v.shape[1], dtype=torch.float64)
    for i in range(q.shape[0]):
        s = (k @ q[i]) * scale                      # scores of query i against every key
        p = torch.exp(s - s.max()); p = p / p.sum()
        out[i] = p @ v
    return out


def block_reference(x, sd, num_heads, scale=None):
    "Official pre-norm backbone block: x + Attn(LN1(x)); then + MLP(LN2(x)). qkv rows q|k|v, heads contiguous."
    sd, x = _d(sd), x.double()
    B, N, D = x.shape
    d = D // num_heads
    scale = d ** -0.5 if scale is None else scale
    y = _ln(x, sd, 'norm1')
    qkv = _lin(y, sd, 'attn.qkv')                    # (B, N, 3D)
    heads = []
    for h in range(num_heads):
        q = qkv[..., h * d:(h + 1) * d]
        k = qkv[..., D + h * d:D + (h + 1) * d]
        v = qkv[..., 2 * D + h * d:2 * D + (h + 1) * d]
        heads.append(torch.softmax(q @ k.transpose(1, 2) * scale, -1) @ v)
    x = x + _lin(torch.cat(heads, -1), sd, 'attn.proj')
    h = F.gelu(_lin(_ln(x, sd, 'norm2'), sd, 'mlp.fc1'))
    return x + _lin(h, sd, 'mlp.fc2')


def token_transformer_reference(x, sd, scale=None, order='qkv'):
    "Official T2T transformer layer (single head): LN; q,k,v = split of qkv (order q,k,v); scale dim**-0.5 from the INPUT width; out = v + proj(attn); out + MLP(LN(out))."
    sd, x = _d(sd), x.double()
    C = x.shape[-1]
    e = sd['attn.proj.weight'].shape[0]
    scale = C ** -0.5 if scale is None else scale
    parts = dict(zip(order, _lin(_ln(x, sd, 'norm1'), sd, 'attn.qkv').split(e, -1)))
    q, k, v = parts['q'], parts['k'], parts['v']
    out = v + _lin(torch.softmax(q @ k.transpose(1, 2) * scale, -1) @ v, sd, 'attn.proj')
    h = F.gelu(_lin(_ln(out, sd, 'norm2'), sd, 'mlp.fc1'))
    return out + _lin(h, sd, 'mlp.fc2')


def token_performer_reference(x, sd, order='kqv', temperature=None, eps=1e-8):
    "Official T2T Performer layer: LN; k,q,v = split of kqv (with bias; order k,q,v); phi(x) = exp(w x - |x|^2/2)/sqrt(m); y = phi(q)(phi(k)^T v)/(D + eps); v + proj(y); + MLP(LN(.))."
    sd, x = _d(sd), x.double()
    e = sd['proj.weight'].shape[0]
    w = sd['w']
    m = w.shape[0]
    parts = dict(zip(order, _lin(_ln(x, sd, 'norm1'), sd, 'kqv').split(e, -1)))
    q, k, v = parts['q'], parts['k'], parts['v']
    if temperature is not None: q, k = q * temperature, k * temperature   # NOT official: for sensitivity tests

    def phi(t):
        return torch.exp(t @ w.T - (t * t).sum(-1, keepdim=True) / 2) / math.sqrt(m)

    qp, kp = phi(q), phi(k)                                               # (B, N, m)
    A = qp @ kp.transpose(1, 2)                                           # (B, N, N) kernel matrix
    y = (A @ v) / (A.sum(-1, keepdim=True) + eps)
    out = v + _lin(y, sd, 'proj')
    h = F.gelu(_lin(_ln(out, sd, 'norm2'), sd, 'mlp.0'))
    return out + _lin(h, sd, 'mlp.2')


def perturb_(module, std=0.05, seed=0):
    "Add Gaussian noise to every parameter (not buffers), so biases and LayerNorm affines are not trivial."
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters(): p.add_(std * torch.randn(p.shape, generator=g))
    return module


def max_rel_err(a, b):
    "Largest absolute difference, relative to the largest entry of `b`."
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def model_grads(model, x, seed=1):
    "Output, input gradients and every parameter gradient (None where none flows) of a fixed random projection of model(*x); the global RNG is reseeded first, so both paths of a layer draw the same dropout masks."
    xs = [t.detach().clone().requires_grad_() for t in (x if isinstance(x, (tuple, list)) else [x])]
    model.zero_grad(set_to_none=True)
    torch.manual_seed(123)
    out = model(*xs)
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))).sum().backward()
    return [out.detach()] + [t.grad for t in xs] + [None if p.grad is None else p.grad.clone() for p in model.parameters()]
