"""An independent reference for the five CNN-inspired T2T-ViT designs (paper Section 4.2, Table 6).

Written from reading the official code (yitu-opensource/T2T-ViT, last commit 2022-06), not copied from it, and
importing nothing from `t2t_course`: `t2t_vit_14_resnext` and `t2t_vit_14_wide` are the plain `T2T_ViT` of
models/t2t_vit.py with other numbers; models/t2t_vit_se.py, models/t2t_vit_dense.py and models/t2t_vit_ghost.py
define the other three. In the style of official_reference.py, the models are plain functions of a state_dict
(a dict of tensors) computing in float64:

- `official_layout(design, **arch)`: every key -> shape of the official model of that design, in the official
  order (the model's own parameters, cls_token and pos_embed, then its submodules in construction order);
- `official_state_dict(design, seed, **arch)`: a state_dict in that layout with random values (the position table
  the official sinusoid, the Performer's `w` orthogonal rows scaled by sqrt(m));
- `official_logits(design, images, state_dict, **arch)`: the official model's logits in eval mode.

What the official code does, as the references compute it (every design: the Performer T2T module of T2T-ViT,
cls token, sinusoid table, final LayerNorm, head on the cls token):
- resnext, wide: the plain pre-norm block (official_reference.block_reference), 32 heads of 12 / D 768 x 4 blocks.
- se: in the attention, after `proj`: y * sigmoid(W2 relu(W1 mean_over_tokens(y))), W1 (D/16, D), W2 (D, D/16),
  no biases (`attn.se_layer.fc.0`, `fc.2`); the MLP branch is plain.
- dense: stages of blocks; block l runs the plain block at its input width D_l and appends
  `dense_linear`(output) (g channels); between stages `linear` to floor(D/2), then GELU; heads fixed, so the head
  width is D_l / num_heads. norm and head are as wide as the last stage.
- ghost: q = [W_q y, a * W_q y] (W_q: D -> D/2, no bias; a: the kernel-1 depthwise conv's weights, one per
  channel), likewise k, v; then the usual split into heads and softmax(q k^T d^-0.5) v, proj. MLP:
  h1 = GELU(fc1 y) (D -> D), h = [h1, GELU(c2 * h1), GELU(c3 * h1)], fc2 (3D -> D).
"""
import math

import numpy as np
import torch
import torch.nn.functional as F

from tests.support.official_reference import block_reference, token_performer_reference, _d, _ln, _lin

DESIGNS = {  # design -> (official registry name, the arguments of its official factory)
    'resnext': ('t2t_vit_14_resnext', dict(embed_dim=384, depth=14, num_heads=32, mlp_ratio=3.)),
    'wide': ('t2t_vit_14_wide', dict(embed_dim=768, depth=4, num_heads=12, mlp_ratio=3.)),
    'se': ('t2t_vit_14_se', dict(embed_dim=384, depth=14, num_heads=6, mlp_ratio=3.)),
    'dense': ('t2t_vit_dense', dict(embed_dim=128, growth_rate=64, block_config=(3, 6, 6, 4), num_heads=8, mlp_ratio=2.)),
    'ghost': ('t2t_vit_16_ghost', dict(embed_dim=384, depth=16, num_heads=6, mlp_ratio=3.)),
}
COMMON = dict(img_size=224, in_chans=3, num_classes=1000, token_dim=64)


def _arch(design, arch):
    "The official factory's arguments with `arch` overriding them."
    out = dict(COMMON, **DESIGNS[design][1])
    out.update(arch)
    return out


# ---------------------------------------------------------------- layouts
def _token_performer_layout(prefix, dim, token_dim):
    m = int(token_dim * 0.5)
    return {prefix + 'w': (m, token_dim), prefix + 'kqv.weight': (3 * token_dim, dim), prefix + 'kqv.bias': (3 * token_dim,),
            prefix + 'proj.weight': (token_dim, token_dim), prefix + 'proj.bias': (token_dim,),
            prefix + 'norm1.weight': (dim,), prefix + 'norm1.bias': (dim,),
            prefix + 'norm2.weight': (token_dim,), prefix + 'norm2.bias': (token_dim,),
            prefix + 'mlp.0.weight': (token_dim, token_dim), prefix + 'mlp.0.bias': (token_dim,),
            prefix + 'mlp.2.weight': (token_dim, token_dim), prefix + 'mlp.2.bias': (token_dim,)}


def _norm(name, D): return {name + '.weight': (D,), name + '.bias': (D,)}


def _linear(name, fan_in, fan_out, bias=True):
    return {name + '.weight': (fan_out, fan_in), **({name + '.bias': (fan_out,)} if bias else {})}


def _block_layout(p, D, num_heads, mlp_ratio, design, growth_rate=None):
    "One backbone block under prefix p: the official Block of that design."
    H = int(D * mlp_ratio)
    out = _norm(p + 'norm1', D)
    if design == 'ghost':
        for n in 'qkv': out.update(_linear(p + f'attn.{n}', D, D // 2, bias=False))
        for n in 'qkv': out[p + f'attn.cheap_operation_{n}.weight'] = (D // 2, 1, 1)
    else:
        out.update(_linear(p + 'attn.qkv', D, 3 * D, bias=False))
    out.update(_linear(p + 'attn.proj', D, D))
    if design == 'se':
        out.update(_linear(p + 'attn.se_layer.fc.0', D, D // 16, bias=False))
        out.update(_linear(p + 'attn.se_layer.fc.2', D // 16, D, bias=False))
    out.update(_norm(p + 'norm2', D))
    out.update(_linear(p + 'mlp.fc1', D, D if design == 'ghost' else H))
    out.update(_linear(p + 'mlp.fc2', H, D))
    if design == 'ghost':
        for i in (2, 3): out[p + f'mlp.cheap_operation{i}.weight'] = (D, 1, 1)
    if design == 'dense': out.update(_linear(p + 'dense_linear', D, growth_rate))
    return out


def official_layout(design, **arch):
    "key -> shape of the official model of `design` (arguments of its factory overridden by `arch`), in the official order."
    a = _arch(design, arch)
    D, t = a['embed_dim'], a['token_dim']
    n = (a['img_size'] // 16) ** 2  # the official num_patches
    out = {'cls_token': (1, 1, D), 'pos_embed': (1, n + 1, D)}
    out.update(_token_performer_layout('tokens_to_token.attention1.', a['in_chans'] * 49, t))
    out.update(_token_performer_layout('tokens_to_token.attention2.', t * 9, t))
    out.update(_linear('tokens_to_token.project', t * 9, D))
    if design == 'dense':
        i, g, dim = 0, a['growth_rate'], D
        for s, blocks in enumerate(a['block_config']):
            for _ in range(blocks):
                out.update(_block_layout(f'blocks.{i}.', dim, a['num_heads'], a['mlp_ratio'], 'dense', g)); i += 1; dim += g
            if s < len(a['block_config']) - 1:
                out.update(_linear(f'blocks.{i}.linear', dim, dim // 2)); i += 1; dim //= 2
    else:
        dim = D
        for i in range(a['depth']): out.update(_block_layout(f'blocks.{i}.', D, a['num_heads'], a['mlp_ratio'], design))
    out.update(_norm('norm', dim))
    out.update(_linear('head', dim, a['num_classes']))
    return out


def sinusoid(n_position, d_hid):
    "The official 1-D sinusoid table (1, n, D), float32."
    pos, j = np.arange(n_position)[:, None], np.arange(d_hid)[None]
    angle = pos / np.power(10000, 2 * (j // 2) / d_hid)
    table = np.where(j % 2 == 0, np.sin(angle), np.cos(angle))
    return torch.tensor(table, dtype=torch.float32)[None]


def official_state_dict(design, seed=0, **arch):
    "A state_dict of the official model of `design` with random values that keep activations of order one."
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, shape in official_layout(design, **arch).items():
        r = torch.randn(shape, generator=g)
        if k == 'pos_embed': sd[k] = sinusoid(shape[1], shape[2])
        elif k.endswith('.w'):  # the Performer's fixed projection: orthogonal rows scaled by sqrt(m)
            q, _ = torch.linalg.qr(torch.randn(shape[1], shape[0], generator=g))
            sd[k] = q.T * math.sqrt(shape[0])
        elif 'norm' in k: sd[k] = (1. + 0.1 * r) if k.endswith('weight') else 0.1 * r
        elif 'cheap_operation' in k: sd[k] = 1. + 0.5 * r
        elif k.endswith('bias'): sd[k] = 0.05 * r
        elif k == 'cls_token': sd[k] = 0.5 * r
        else: sd[k] = r * shape[1] ** -0.5  # a weight: scaled by its fan-in
    return sd


# ---------------------------------------------------------------- the forward passes, float64
def _sub(sd, prefix): return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def _square(x):
    "Tokens (B, N, C) -> a square map (B, C, sqrt(N), sqrt(N)), as the official module reshapes them."
    B, N, C = x.shape
    s = int(np.sqrt(N))
    return x.transpose(1, 2).reshape(B, C, s, s)


def t2t_reference(images, sd):
    "The official Performer T2T module: unfold 7/4/2, attention1, reshape, unfold 3/2/1, attention2, reshape, unfold, project."
    x = F.unfold(images.double(), 7, stride=4, padding=2).transpose(1, 2)
    x = token_performer_reference(x, _sub(sd, 'tokens_to_token.attention1.'))
    x = F.unfold(_square(x), 3, stride=2, padding=1).transpose(1, 2)
    x = token_performer_reference(x, _sub(sd, 'tokens_to_token.attention2.'))
    x = F.unfold(_square(x), 3, stride=2, padding=1).transpose(1, 2)
    return _lin(x, _d(sd), 'tokens_to_token.project')


def _heads_attention(q, k, v, num_heads):
    "softmax(q k^T d^-0.5) v one head at a time on the heads' contiguous slices; (B, N, D) each -> (B, N, D)."
    d = q.shape[-1] // num_heads
    out = []
    for h in range(num_heads):
        s = slice(h * d, (h + 1) * d)
        out.append(torch.softmax(q[..., s] @ k[..., s].transpose(1, 2) * d ** -0.5, -1) @ v[..., s])
    return torch.cat(out, -1)


def se_block_reference(x, sd, num_heads):
    "The official T2T-ViT-SE block: the SE gate on the attention output after proj."
    sd, x = _d(sd), x.double()
    D = x.shape[-1]
    qkv = _lin(_ln(x, sd, 'norm1'), sd, 'attn.qkv')
    y = _lin(_heads_attention(qkv[..., :D], qkv[..., D:2 * D], qkv[..., 2 * D:], num_heads), sd, 'attn.proj')
    s = y.mean(1)                                                              # (B, D)
    gate = torch.sigmoid(torch.relu(s @ sd['attn.se_layer.fc.0.weight'].T) @ sd['attn.se_layer.fc.2.weight'].T)
    x = x + y * gate[:, None]
    return x + _lin(F.gelu(_lin(_ln(x, sd, 'norm2'), sd, 'mlp.fc1')), sd, 'mlp.fc2')


def ghost_block_reference(x, sd, num_heads):
    "The official T2T-ViT-Ghost block: half-computed, half-ghost q, k, v; a ghost MLP with two ghosts."
    sd, x = _d(sd), x.double()
    y = _ln(x, sd, 'norm1')
    qkv = []
    for n in 'qkv':
        p = y @ sd[f'attn.{n}.weight'].T                                      # (B, N, D/2)
        qkv.append(torch.cat([p, p * sd[f'attn.cheap_operation_{n}.weight'][:, 0, 0]], -1))
    x = x + _lin(_heads_attention(*qkv, num_heads), sd, 'attn.proj')
    h1 = F.gelu(_lin(_ln(x, sd, 'norm2'), sd, 'mlp.fc1'))
    h = torch.cat([h1] + [F.gelu(h1 * sd[f'mlp.cheap_operation{i}.weight'][:, 0, 0]) for i in (2, 3)], -1)
    return x + _lin(h, sd, 'mlp.fc2')


def official_logits(design, images, state_dict, **arch):
    "Eval-mode logits (B, num_classes) of the official model of `design` with `state_dict`, in float64."
    a = _arch(design, arch)
    sd = _d(state_dict)
    x = t2t_reference(images, state_dict)                                     # (B, N, D)
    x = torch.cat([sd['cls_token'].expand(x.shape[0], -1, -1), x], 1) + sd['pos_embed']
    i = 0
    while any(k.startswith(f'blocks.{i}.') for k in sd):
        p = _sub(state_dict, f'blocks.{i}.')
        if design == 'dense' and 'linear.weight' in p: x = F.gelu(_lin(x, _d(p), 'linear'))          # transition
        elif design == 'dense': x = torch.cat([x, _lin(block_reference(x, p, a['num_heads']), _d(p), 'dense_linear')], -1)
        elif design == 'se': x = se_block_reference(x, p, a['num_heads'])
        elif design == 'ghost': x = ghost_block_reference(x, p, a['num_heads'])
        else: x = block_reference(x, p, a['num_heads'])
        i += 1
    return _lin(_ln(x, sd, 'norm')[:, 0], sd, 'head')
