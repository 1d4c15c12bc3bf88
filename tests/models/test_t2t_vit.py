"""The T2T-ViT family (chapter 08b, `t2t_course.models.t2t_vit`): the registry and its variants, official layouts,
golden logits, the timm-style contract (one property per test, over every registered model), an empty batch,
checkpoint conversion, bad input, MAC counts against the official ones, and model folders (`save_pretrained`,
`create_model(FOLDER)`, `pretrained=FOLDER` or a `.safetensors` file) for every design, read without unpickling. Elsewhere: the fast paths against the
readable paths (tests/test_core.py), the position table and the head (test_backbone.py), unreadable checkpoint files
(test_weights.py), timm's contract methods without timm (tests/deploy/test_contract.py).

Reference data (measured on the official code) is in reference/: official_state_dicts.json, official_macs.json
and golden/*.pt.
"""
import argparse, copy, dataclasses, json, subprocess, sys, warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import t2t_course
from t2t_course import create_model, list_models, T2TViT
from t2t_course.core import set_fast_paths
from t2t_course.models.backbone import count_macs, get_sinusoid_encoding
from t2t_course.models.t2t_vit import (VARIANTS, Variant, get_variant, register_model, register_variant, build_variant,
                               checkpoint_filter_fn, load_checkpoint, resize_pos_embed, weights_dir)

from tests.support.variant_sizes import few_blocks, first_of_each_design, shapes_only

REF = Path(__file__).resolve().parents[2] / 'reference'
OFFICIAL = json.loads((REF / 'official_state_dicts.json').read_text())
OFFICIAL_MACS = json.loads((REF / 'official_macs.json').read_text())
TINY = dict(img_size=64, embed_dim=64, depth=2, num_heads=2, mlp_ratio=2., num_classes=10)
MODELS = list_models()  # every registered model: a new variant is tested the moment it is registered
FIRST_OF_EACH_DESIGN = first_of_each_design(MODELS)  # a new design too, in the tests that run one variant per design


def official_name(name): return name.replace('_384', '@384')


_BUILT = {}  # (name, overrides) -> the model as built; emptied when the module's tests end (`_forget_built`)


def _small(name, **kwargs):
    """The registered model `name` built at 32 px with 42 classes, seeded: a fresh deep copy of one build per name and
    overrides (initialising the weights of a full-depth variant costs 2-4x what the contract tests then do with it)."""
    key = (name, tuple(sorted(kwargs.items())))
    if key not in _BUILT:
        torch.manual_seed(0)
        _BUILT[key] = create_model(name, **(dict(num_classes=42, img_size=32) | kwargs))
    return copy.deepcopy(_BUILT[key])


@pytest.fixture(scope='module', autouse=True)
def _forget_built():
    yield
    _BUILT.clear()


def _x(*size, batch=2): return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(1))


def test_import_is_light():
    "`import t2t_course` and building a model load neither pyplot nor the FLOP counter."
    code = ("import sys, t2t_course; t2t_course.create_model('t2t_vit_7'); "
            "print([m for m in sys.modules if m.startswith('matplotlib.pyplot') or m == 'torch.utils.flop_counter'])")
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == '[]'


def test_registry():
    assert list_models(pretrained=True) == ['t2t_vit_7', 't2t_vit_10', 't2t_vit_12', 't2t_vit_14', 't2t_vit_14_384',
                                            't2t_vit_19', 't2t_vit_24', 't2t_vit_t_14', 't2t_vit_t_19', 't2t_vit_t_24']
    assert list_models() == ['t2t_vit_7', 't2t_vit_10', 't2t_vit_12', 't2t_vit_14', 't2t_vit_14_384', 't2t_vit_14_hard_split',
                             't2t_vit_14_resnext', 't2t_vit_14_se', 't2t_vit_14_wide', 't2t_vit_16_ghost', 't2t_vit_19',
                             't2t_vit_24', 't2t_vit_dense', 't2t_vit_t_14', 't2t_vit_t_19', 't2t_vit_t_24',
                             'vit_baseline']  # with chapter 10's designs and the baselines
    assert list_models('*_t_*') == ['t2t_vit_t_14', 't2t_vit_t_19', 't2t_vit_t_24']
    assert list_models('resnet*') == []
    assert t2t_course.create_model is create_model and t2t_course.T2TViT is T2TViT
    with pytest.raises(ValueError, match=r"unknown model 't2t_vit_t14'; did you mean 't2t_vit_t_14'"):
        create_model('t2t_vit_t14')
    with pytest.raises(ValueError, match=rf"unknown model 'vgg16' \(list_models\(unlisted=True\) shows all {len(list_models(unlisted=True))}\)"):
        create_model('vgg16')


# ------------------------------------------------------------------ the variants
OFFICIAL_RECIPES = {  # the official README's training commands: deviations from the paper's common recipe
    't2t_vit_7': dict(lr=1e-3, weight_decay=0.03), 't2t_vit_10': dict(lr=1e-3, weight_decay=0.03),
    't2t_vit_12': dict(lr=1e-3, weight_decay=0.03), 't2t_vit_14': {}, 't2t_vit_14_384': {},
    't2t_vit_19': dict(weight_decay=0.065), 't2t_vit_24': dict(weight_decay=0.065), 't2t_vit_t_14': {},
    't2t_vit_t_19': dict(weight_decay=0.065), 't2t_vit_t_24': dict(weight_decay=0.065)}


def test_every_registered_model_is_a_variant():
    assert sorted(VARIANTS) == sorted(list_models(unlisted=True))
    assert all(get_variant(n).name == n for n in list_models())


def test_official_variants_recipes_sizes_and_releases():
    assert {n: dict(get_variant(n).recipe) for n in OFFICIAL_RECIPES} == OFFICIAL_RECIPES
    assert {n: get_variant(n).img_size for n in OFFICIAL_RECIPES} == {n: 384 if n.endswith('_384') else 224 for n in OFFICIAL_RECIPES}
    for n in OFFICIAL_RECIPES:
        v = get_variant(n)
        assert v.model_cls is T2TViT and v.file.startswith(f'{v.top1}_') and v.file.endswith('.pth.tar')
        assert v.url == 'https://github.com/yitu-opensource/T2T-ViT/releases/download/main/' + v.file


def test_get_variant_unknown_name():
    with pytest.raises(ValueError, match=r"unknown model 't2t_vit_t14'; did you mean 't2t_vit_t_14'"): get_variant('t2t_vit_t14')
    with pytest.raises(ValueError, match=rf"unknown model 'vgg16' \(list_models\(unlisted=True\) shows all {len(list_models(unlisted=True))}\)"): get_variant('vgg16')


def test_variant_is_read_only():
    v = get_variant('t2t_vit_7')
    with pytest.raises(dataclasses.FrozenInstanceError): v.img_size = 32
    with pytest.raises(TypeError, match='does not support item assignment'): v.recipe['lr'] = 1.
    with pytest.raises(TypeError, match='does not support item assignment'): v.arch['depth'] = 1
    with pytest.raises(ValueError, match="another variant is already registered as 't2t_vit_7'"):
        register_variant(Variant('t2t_vit_7', dict(v.arch, depth=8)))
    assert register_variant(Variant('t2t_vit_7', v.arch, file=v.file, top1=v.top1, recipe=v.recipe)) == v  # the same: fine


class HalfTokens(T2TViT):
    "A design variant built from the same pieces (for the test): the T2T module's tokens halved."
    def __init__(self, token_scale:float=1., **kwargs): super().__init__(**kwargs); self.token_scale = token_scale
    def embed_tokens(self, x): return self.token_scale * super().embed_tokens(x)


@pytest.fixture
def design_variant():
    "A variant of another class and without released weights, registered for one test and removed after it."
    arch = {k: v for k, v in TINY.items() if k != 'img_size'} | dict(tokens_type='transformer', token_scale=0.5)
    register_variant(Variant('t2t_vit_test_half', arch, img_size=64,
                             recipe=dict(lr=1e-4), model_cls=HalfTokens))
    def t2t_vit_test_half(pretrained=False, **kwargs): return build_variant('t2t_vit_test_half', pretrained, **kwargs)
    register_model(t2t_vit_test_half)
    yield 't2t_vit_test_half'
    from t2t_course.models import t2t_vit as models
    del models.VARIANTS['t2t_vit_test_half'], models._model_entrypoints['t2t_vit_test_half']


def test_a_variant_of_another_class(design_variant, tmp_path):
    model = create_model(design_variant).eval()
    assert type(model) is HalfTokens and model.token_scale == 0.5 and model.img_size == (64, 64)
    cfg = model.default_cfg
    assert (cfg['architecture'], cfg['file'], cfg['url'], cfg['top1'], cfg['input_size']) == (design_variant, None, None, None, (3, 64, 64))
    assert get_variant(design_variant).recipe['lr'] == 1e-4
    with pytest.raises(ValueError, match='t2t_vit_test_half has no released weights'): create_model(design_variant, pretrained=True)
    torch.save({'state_dict': model.state_dict()}, tmp_path / 'half.pth')
    loaded = create_model(design_variant, pretrained=tmp_path / 'half.pth').eval()
    with torch.no_grad(): torch.testing.assert_close(loaded(_x(64, 64)), model(_x(64, 64)))


def test_register_model_needs_a_variant():
    def t2t_vit_unknown(pretrained=False, **kwargs): return None
    with pytest.raises(ValueError, match=r"no Variant named 't2t_vit_unknown': register_variant\(Variant\('t2t_vit_unknown'"):
        register_model(t2t_vit_unknown)
    assert 't2t_vit_unknown' not in list_models()


# ------------------------------------------------------------------ the timm-style contract, one property per test
@pytest.mark.parametrize('name', MODELS)
def test_forward(name):
    "Training-mode forward at 32 px: (B, num_classes) logits, all finite."
    out = _small(name)(_x(32, 32))
    assert out.shape == (2, 42) and torch.isfinite(out).all()


@pytest.mark.parametrize('name', MODELS)
def test_backward(name):
    "Every trainable parameter receives a finite, non-zero gradient."
    model = _small(name)
    model(_x(32, 32)).logsumexp(-1).sum().backward()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    no_grad = [n for n, p in params if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not no_grad, f"no (finite) gradient for {no_grad}"
    zero = [n for n, p in params if p.grad.abs().sum() == 0]
    assert not zero, f"a zero gradient for {zero}"


@pytest.mark.parametrize('name', MODELS)
def test_forward_features_and_head(name):
    "forward_features gives the normed tokens, forward_head(pre_logits) their cls token, forward_head the logits."
    model, x = _small(name).eval(), _x(32, 32)
    with torch.no_grad():
        feats = model.forward_features(x)
        assert feats.shape == (2, 1 + 4, model.num_features)         # 32 px -> 2 x 2 tokens + cls
        pre = model.forward_head(feats, pre_logits=True)
        assert pre.shape == (2, model.num_features) and torch.equal(pre, feats[:, 0])
        torch.testing.assert_close(model.forward_head(feats), model(x))


@pytest.mark.parametrize('name', MODELS)
def test_reset_classifier(name):
    "get_classifier is the head; reset_classifier(0) removes it (forward returns features), reset_classifier(7) makes a new one."
    model, x = _small(name).eval(), _x(32, 32)
    assert model.get_classifier() is model.head and model.head.out_features == 42
    with torch.no_grad():
        pre = model.forward_head(model.forward_features(x), pre_logits=True)
        model.reset_classifier(0)
        assert isinstance(model.get_classifier(), nn.Identity) and model.num_classes == 0
        torch.testing.assert_close(model(x), pre)                     # features come out
        model.reset_classifier(7)
        assert model(x).shape == (2, 7) and model.default_cfg['num_classes'] == 7


@pytest.mark.parametrize('name', MODELS)
def test_no_weight_decay(name):
    model = _small(name)
    names = set(dict(model.named_parameters())) | set(dict(model.named_buffers()))
    assert {'cls_token'} <= model.no_weight_decay() <= names


@pytest.mark.parametrize('name', [n if n in FIRST_OF_EACH_DESIGN else pytest.param(n, marks=pytest.mark.slow) for n in MODELS])
def test_torch_compile_fullgraph(name):
    """Graph capture without a single break (eager backend: capture only), same output: built at 32 px, run at 48 x 40, so
    the position table comes from the graph. Two blocks of the variant (the dense design: stages (1, 1)): its blocks are
    one code object repeated, so two hold every path the capture can break on. One variant of each design (the same
    code at other sizes is the same graph: the others with --runslow); each variant at its own depth is
    `test_torch_compile_fullgraph_full_depth` (--runslow)."""
    torch._dynamo.reset()  # the variants share code objects: start each from a clean compile cache
    model, x = _small(name, **few_blocks(name)).eval(), _x(48, 40)
    compiled = torch.compile(model, backend='eager', fullgraph=True)
    with torch.no_grad(): torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.slow
@pytest.mark.parametrize('name', MODELS)
def test_torch_compile_fullgraph_full_depth(name):
    "The capture at the variant's own depth and built size (5-20 s each on a CPU, so --runslow)."
    torch._dynamo.reset()
    model, x = _small(name).eval(), _x(32, 32)
    compiled = torch.compile(model, backend='eager', fullgraph=True)
    with torch.no_grad(): torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize('depth', ['shallow', pytest.param('full', marks=pytest.mark.slow)])
@pytest.mark.parametrize('size', [(32, 48), (64, 40)])
@pytest.mark.parametrize('name', MODELS)
def test_any_input_size(name, size, depth):
    """Built at 32 px, run at a non-square size: finite logits, equal to a model built for that size (sinusoid regenerated).
    Two blocks of the variant (what the size changes is before and after the blocks); at its own depth with --runslow."""
    shallow = few_blocks(name) if depth == 'shallow' else {}
    small = _small(name, **shallow).eval()
    built = create_model(name, num_classes=42, img_size=size, **shallow).eval()
    built.load_state_dict(checkpoint_filter_fn(small.state_dict(), built), strict=True)
    x = _x(*size)
    with torch.no_grad(): out = small(x)
    assert out.shape == (2, 42) and torch.isfinite(out).all()
    with torch.no_grad(): torch.testing.assert_close(out, built(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('name', MODELS)
def test_default_cfg(name):
    "default_cfg reads the variant's fields: its size, release file and address, and follows img_size and num_classes."
    v = get_variant(name)
    cfg = shapes_only(name, img_size=32, num_classes=5).default_cfg
    assert cfg['architecture'] == name and cfg['classifier'] == 'head'
    assert cfg['crop_pct'] == 0.9 and cfg['interpolation'] == 'bicubic'
    assert cfg['mean'] == (0.485, 0.456, 0.406) and cfg['std'] == (0.229, 0.224, 0.225)
    assert cfg['input_size'] == (3, 32, 32) and cfg['num_classes'] == 5  # follow the overrides
    assert (cfg['file'], cfg['url'], cfg['top1']) == (v.file, v.url, v.top1)
    assert v.file is None or (cfg['file'].endswith('.pth.tar') and cfg['url'].endswith(cfg['file']))
    model = shapes_only(name, pretrained=False)
    assert model.default_cfg['input_size'] == (3, v.img_size, v.img_size) and model.img_size == (v.img_size, v.img_size)
    assert model.pretrained_cfg is model.default_cfg


@pytest.mark.parametrize('name', sorted(OFFICIAL))
def test_official_state_dict_layout(name):
    "Identical key set and shapes, total and trainable numel, for every official entry."
    ref = OFFICIAL[name]
    model = shapes_only(name.replace('@384', '_384'))
    sd = model.state_dict()
    assert {k: list(v.shape) for k, v in sd.items()} == ref['keys']
    assert sum(v.numel() for v in sd.values()) == ref['state_dict_numel']
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == ref['trainable_numel']
    frozen = {k for k in sd if k not in dict(model.named_parameters())}
    assert frozen == set(ref['frozen_keys'])


@pytest.mark.parametrize('fname, kwargs', [
    ('tiny_performer_64', dict(TINY, tokens_type='performer')),
    ('tiny_transformer_64', dict(TINY, tokens_type='transformer')),
    ('t2t_vit_7_224', None),
])
@pytest.mark.parametrize('fast', [True, False])
def test_golden_logits(fname, kwargs, fast):
    g = torch.load(REF / 'golden' / f'{fname}.pt')
    model = T2TViT(**kwargs) if kwargs else create_model('t2t_vit_7')
    model.load_state_dict(g['state_dict'], strict=True)
    set_fast_paths(model.eval(), fast)
    with torch.no_grad():
        tokens = model.tokens_to_token(g['input'])
        features = model.forward_head(model.forward_features(g['input']), pre_logits=True)
        logits = model(g['input'])
    torch.testing.assert_close(tokens, g['t2t_tokens'], atol=1e-4, rtol=0)
    torch.testing.assert_close(features, g['features'], atol=1e-4, rtol=0)
    torch.testing.assert_close(logits, g['logits'], atol=1e-4, rtol=0)


def test_torch_compile_inductor():
    """The default backend compiles and computes the same thing: T2T-ViT-7's T2T module, one block and the head (compiling is
    slow on CPU, and the blocks are one code object repeated; every variant at full depth: test_torch_compile_inductor_all)."""
    model = create_model('t2t_vit_7', img_size=32, num_classes=10, depth=1).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(): torch.testing.assert_close(torch.compile(model)(x), model(x), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize('name', MODELS)
def test_torch_compile_inductor_all(name):
    model = create_model(name, img_size=32, num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    torch._dynamo.reset()
    with torch.no_grad(): torch.testing.assert_close(torch.compile(model)(x), model(x), atol=1e-4, rtol=1e-4)


def test_bad_channels_and_small_images():
    model = create_model('t2t_vit_7', img_size=64).eval()
    with pytest.raises(ValueError, match='expected 3 input channels, got 4'): model(torch.randn(1, 4, 64, 64))
    with pytest.raises(ValueError, match=r'input must be a 4-D batch \(B, C, H, W\)'): model(torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match='kernel_size 7 is larger than the padded input 5'): model(torch.randn(1, 3, 1, 64))
    with pytest.raises(ValueError, match='tokens_type must be one of'): create_model('t2t_vit_7', tokens_type='conv')
    model = create_model('t2t_vit_7', in_chans=1, img_size=32).eval()  # other channel counts are an argument
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 1000)


EMPTY_KINDS = ['t2t_vit_7', 't2t_vit_t_14', 't2t_vit_14_wide', 't2t_vit_16_ghost', 't2t_vit_dense', 'vit_baseline',
               'resnet_baseline']


@pytest.mark.parametrize('fast', [True, False], ids=['fast', 'readable'])
@pytest.mark.parametrize('name', EMPTY_KINDS)
def test_models_accept_an_empty_batch(name, fast):
    "A batch of 0 images gives 0 rows of logits (the fast soft split used to fail reshaping 0 elements)."
    kw = {} if name == 'resnet_baseline' else dict(embed_dim=64, depth=2, num_heads=2)
    if name in ('t2t_vit_14_wide', 't2t_vit_16_ghost', 't2t_vit_dense'): kw = {}
    model = t2t_course.create_model(name, img_size=64, num_classes=10, **kw).eval()
    set_fast_paths(model, fast)
    with torch.no_grad(): out = model(torch.zeros(0, 3, 64, 64))
    assert out.shape == (0, 10)


@pytest.mark.parametrize('size', [(96, 96), (80, 112), (50, 70)])
def test_other_input_size_regenerates_the_sinusoid(size):
    "A model built at 64 px run at another size equals a model built for that size with the same weights."
    torch.manual_seed(0)
    small = T2TViT(**dict(TINY, tokens_type='performer')).eval()
    big = T2TViT(**dict(TINY, tokens_type='performer', img_size=size)).eval()
    big.load_state_dict(checkpoint_filter_fn(small.state_dict(), big), strict=True)
    torch.testing.assert_close(big.pos_embed, get_sinusoid_encoding(big.pos_embed.shape[1], 64))
    x = torch.randn(2, 3, *size)
    with torch.no_grad(): torch.testing.assert_close(small(x), big(x), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ checkpoints: the wrappings, pretrained, the head, other sizes
def _golden7():
    return torch.load(REF / 'golden' / 't2t_vit_7_224.pt')


@pytest.mark.parametrize('wrap', ['bare', 'state_dict', 'state_dict_ema', 'model', 'net', 'module', 'compiled'])
def test_checkpoint_wrappings(wrap, tmp_path):
    g = _golden7()
    sd = g['state_dict']
    junk = {k: torch.zeros_like(v) for k, v in sd.items()}
    ckpt = {'bare': sd, 'state_dict': {'state_dict': sd, 'epoch': 3},
            'state_dict_ema': {'state_dict': junk, 'state_dict_ema': sd, 'args': argparse.Namespace(lr=1e-3)},
            'model': {'model': sd, 'optimizer': {}}, 'net': {'net': sd},
            'module': {'state_dict': {'module.' + k: v for k, v in sd.items()}},
            'compiled': {'model': {'_orig_mod.module.' + k: v for k, v in sd.items()}}}[wrap]
    path = tmp_path / 'ckpt.pth.tar'
    torch.save(ckpt, path)
    model = load_checkpoint(create_model('t2t_vit_7'), path).eval()
    with torch.no_grad(): torch.testing.assert_close(model(g['input']), g['logits'], atol=1e-4, rtol=0)


def test_pretrained_true_and_missing_file(tmp_path, monkeypatch):
    g = _golden7()
    monkeypatch.setenv('T2T_COURSE_WEIGHTS', str(tmp_path))
    assert weights_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match=r'no checkpoint for t2t_vit_7 at .*71\.7_T2T_ViT_7\.pth\.tar\. Download https://github\.com/yitu-opensource/T2T-ViT/releases/download/main/71\.7_T2T_ViT_7\.pth\.tar'):
        create_model('t2t_vit_7', pretrained=True)
    torch.save({'state_dict_ema': g['state_dict']}, tmp_path / '71.7_T2T_ViT_7.pth.tar')
    model = create_model('t2t_vit_7', pretrained=True).eval()
    with torch.no_grad(): torch.testing.assert_close(model(g['input']), g['logits'], atol=1e-4, rtol=0)
    with pytest.raises(FileNotFoundError, match='no checkpoint for t2t_vit_7 at /nonexistent.pth'):
        create_model('t2t_vit_7', pretrained='/nonexistent.pth')


def test_transfer_drops_head_with_warning():
    g = _golden7()
    model = create_model('t2t_vit_7', num_classes=10)
    head = model.head.weight.detach().clone()
    with pytest.warns(UserWarning, match=r"dropping the checkpoint's classifier head \(1000 classes\): the model has 10 classes"):
        sd = checkpoint_filter_fn({'state_dict_ema': g['state_dict']}, model)
    assert not any(k.startswith('head.') for k in sd)
    missing = model.load_state_dict(sd, strict=False).missing_keys
    assert sorted(missing) == ['head.bias', 'head.weight']
    torch.testing.assert_close(model.head.weight, head)  # untouched
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model.forward_head(model.forward_features(g['input']), pre_logits=True), g['features'], atol=1e-4, rtol=0)
    features_only = create_model('t2t_vit_7', num_classes=0)
    with pytest.warns(UserWarning, match='the model has 0 classes and keeps its features'):
        features_only.load_state_dict(checkpoint_filter_fn(g['state_dict'], features_only), strict=True)


def test_other_resolution_and_learned_tables():
    g = _golden7()
    m224 = create_model('t2t_vit_7').eval()
    m224.load_state_dict(g['state_dict'])
    m384 = create_model('t2t_vit_7', img_size=384)
    m384.load_state_dict(checkpoint_filter_fn(g['state_dict'], m384), strict=True)
    torch.testing.assert_close(m384.pos_embed, get_sinusoid_encoding(577, 256))
    x = torch.randn(1, 3, 384, 384)
    with torch.no_grad(): torch.testing.assert_close(m384.eval()(x), m224(x), atol=1e-4, rtol=1e-4)
    # a learned (non-sinusoid) table is interpolated on its grid, the cls row kept
    sd = dict(g['state_dict'])
    sd['pos_embed'] = torch.randn(1, 197, 256)
    m288 = create_model('t2t_vit_7', img_size=(288, 224))  # non-square target grid: 18 x 14
    out = checkpoint_filter_fn(sd, m288)['pos_embed']
    assert out.shape == (1, 1 + 18 * 14, 256)
    torch.testing.assert_close(out[:, 0], sd['pos_embed'][:, 0])
    expected = torch.nn.functional.interpolate(sd['pos_embed'][:, 1:].reshape(1, 14, 14, 256).permute(0, 3, 1, 2),
                                               size=(18, 14), mode='bicubic', align_corners=False)
    torch.testing.assert_close(out[:, 1:], expected.permute(0, 2, 3, 1).reshape(1, -1, 256))
    const = torch.full((1, 1 + 49, 4), 0.5)
    torch.testing.assert_close(resize_pos_embed(const, (9, 9)), torch.full((1, 82, 4), 0.5))
    with pytest.raises(ValueError, match='not a square grid; pass old_grid'): resize_pos_embed(torch.zeros(1, 1 + 12, 4), (4, 4))
    torch.testing.assert_close(resize_pos_embed(const[:, :13], (6, 4), old_grid=(3, 4)), torch.full((1, 25, 4), 0.5))


def test_wrong_variant_is_named():
    g = _golden7()
    with pytest.raises(ValueError) as e: checkpoint_filter_fn(g['state_dict'], create_model('t2t_vit_14'))
    msg = str(e.value)
    assert 'does not fit this T2TViT (t2t_vit_14)' in msg
    assert 'shape mismatch blocks.0.attn.qkv.weight: checkpoint (768, 256) vs model (1152, 384)' in msg
    assert 'looks like t2t_vit_7' in msg
    with pytest.raises(ValueError) as e: checkpoint_filter_fn(g['state_dict'], create_model('t2t_vit_t_14'))
    assert 'not in the model: tokens_to_token.attention1.kqv.bias' in str(e.value)
    sd = dict(g['state_dict']); del sd['tokens_to_token.attention1.w']
    with pytest.raises(ValueError, match='missing from the checkpoint: tokens_to_token.attention1.w'):
        checkpoint_filter_fn(sd, create_model('t2t_vit_7'))
    with pytest.raises(TypeError, match='a checkpoint must be a dict'): checkpoint_filter_fn([1, 2], create_model('t2t_vit_7'))


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_sinusoid_checkpoint_is_rebuilt_not_resized(dtype):
    g = _golden7()
    sd = {k: v.to(dtype) for k, v in g['state_dict'].items()}  # a checkpoint saved in half precision
    m384 = create_model('t2t_vit_7', img_size=384)
    out = checkpoint_filter_fn(sd, m384)['pos_embed']
    torch.testing.assert_close(out.float(), get_sinusoid_encoding(577, 256), atol=4 * torch.finfo(dtype).eps, rtol=0)


def test_use_ema_and_reset_classifier_cfg(tmp_path):
    g = _golden7()
    junk = {k: torch.zeros_like(v) for k, v in g['state_dict'].items()}
    torch.save({'state_dict': junk, 'state_dict_ema': g['state_dict']}, tmp_path / 'ck.pth')
    ema = load_checkpoint(create_model('t2t_vit_7'), tmp_path / 'ck.pth').eval()
    raw = load_checkpoint(create_model('t2t_vit_7'), tmp_path / 'ck.pth', use_ema=False)
    with torch.no_grad(): torch.testing.assert_close(ema(g['input']), g['logits'], atol=1e-4, rtol=0)
    assert all((p == 0).all() for p in raw.parameters())
    model = create_model('t2t_vit_7', num_classes=10)
    model.reset_classifier(3)
    assert model.default_cfg['num_classes'] == 3 and model.num_classes == 3


# ------------------------------------------------------------------ MACs and tracing
@pytest.mark.parametrize('name, img_size', [(n, None) for n in MODELS if official_name(n) in OFFICIAL_MACS] + [('t2t_vit_t_14', 384)])
def test_macs_match_official(name, img_size):
    model = shapes_only(name, **({'img_size': img_size} if img_size else {}))
    key = official_name(name) if img_size is None else f'{name}@{img_size}'
    ref = OFFICIAL_MACS[key]
    macs = count_macs(model, model.img_size)
    assert abs(macs['total'] / ref['macs_total'] - 1) < 0.02, (macs, ref['macs_total'])
    by_op = ref['macs_by_op']
    assert abs(macs['linear'] / by_op['linear'] - 1) < 0.02
    assert abs(macs['layer_norm'] / by_op['layer_norm'] - 1) < 0.02
    assert abs(macs['attention'] - by_op.get('matmul', 0)) <= 0.02 * by_op.get('matmul', 0)
    assert abs(macs['performer'] - by_op.get('einsum', 0)) <= 0.02 * max(by_op.get('einsum', 0), 1)


@pytest.mark.parametrize('name', ['t2t_vit_7', 't2t_vit_t_14', 'vit_baseline', 't2t_vit_dense'])
def test_jit_trace(name):
    "torch.jit.trace records the model (sizes as traced values); the trace computes the model's output."
    model = _small(name, embed_dim=64, num_heads=2, **few_blocks(name)).eval()
    x = _x(32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # its deprecation notice, and the Performer's shape check
        traced = torch.jit.trace(model, x)
    with torch.no_grad(): torch.testing.assert_close(traced(x), model(x))


# ------------------------------------------------------------------ model folders: save_pretrained, create_model(FOLDER)
from t2t_course.models.t2t_vit import save_pretrained
from t2t_course.models.weights import save_safetensors
from tests.support.no_pickle import no_unpickling

FOLDER_MODELS = sorted(FIRST_OF_EACH_DESIGN | {'resnet_baseline', 'vit_baseline'})


@pytest.mark.parametrize('name', FOLDER_MODELS)
def test_a_model_folder_rebuilds_the_model(name, tmp_path):
    "Every design (shrunk to 2 blocks, 32 px, 42 classes) saved as a model folder comes back with the same weights and logits."
    model = _small(name, **few_blocks(name, 2)).eval()
    folder = save_pretrained(model, tmp_path / name)
    with no_unpickling(): again = create_model(folder).eval()
    assert type(again) is type(model) and again.default_cfg['architecture'] == name
    for k, v in model.state_dict().items(): assert torch.equal(again.state_dict()[k], v), k
    x = _x(32, 32)
    with torch.no_grad(): torch.testing.assert_close(again(x), model(x), atol=1e-6, rtol=0)


def test_the_config_json_has_timms_keys(tmp_path):
    "architecture, num_classes, num_features, label_names, model_args (no drop rates), pretrained_cfg (no provenance)."
    model = create_model('t2t_vit_7', img_size=48, embed_dim=64, depth=2, num_heads=2, num_classes=3, drop_path_rate=0.1)
    folder = save_pretrained(model, tmp_path / 'm', label_names=['cat', 'dog', 'owl'], data_config=dict(crop_pct=1.0))
    cfg = json.loads((folder / 'config.json').read_text())
    assert {k: cfg[k] for k in ('architecture', 'num_classes', 'num_features', 'label_names')} == \
        dict(architecture='t2t_vit_7', num_classes=3, num_features=64, label_names=['cat', 'dog', 'owl'])
    assert cfg['model_args'] == dict(embed_dim=64, depth=2, num_heads=2, num_classes=3, img_size=[48, 48])
    pc = cfg['pretrained_cfg']
    assert (pc['input_size'], pc['crop_pct'], pc['interpolation'], pc['num_classes'], pc['classifier']) == ([3, 48, 48], 1.0, 'bicubic', 3, 'head')
    assert not {'file', 'url', 'top1', 'architecture', 'pool_size'} & set(pc)
    m = create_model(folder)
    assert (m.default_cfg['label_names'], m.default_cfg['crop_pct'], m.default_cfg['file'], m.default_cfg['url']) == \
        (['cat', 'dog', 'owl'], 1.0, str(folder), None)
    assert save_pretrained(m, tmp_path / 'again') and json.loads((tmp_path / 'again' / 'config.json').read_text())['label_names'] == ['cat', 'dog', 'owl']


def test_create_model_with_a_folder_as_pretrained(tmp_path):
    "The folder's arguments are defaults (keywords win; a new head is dropped with a warning); another architecture is refused."
    model = create_model('t2t_vit_7', img_size=32, embed_dim=64, depth=2, num_heads=2, num_classes=10).eval()
    folder = save_pretrained(model, tmp_path / 'm')
    x = _x(32, 32)
    for again in (create_model('t2t_vit_7', pretrained=folder), create_model(f'local-dir:{folder}'), create_model(str(folder))):
        with torch.no_grad(): assert torch.equal(again.eval()(x), model(x))
    with pytest.warns(UserWarning, match=r"dropping the checkpoint's classifier head \(10 classes\)"):
        assert create_model(folder, num_classes=4, img_size=64).default_cfg['input_size'] == (3, 64, 64)
    with pytest.raises(ValueError, match=r"holds a t2t_vit_7, not a t2t_vit_14: create_model\("): create_model('t2t_vit_14', pretrained=folder)
    cfg = json.loads((folder / 'config.json').read_text())
    (folder / 'config.json').write_text(json.dumps(dict(cfg, architecture='t2t_vit_77')))
    with pytest.raises(ValueError, match=r"unknown model 't2t_vit_77'; did you mean"): create_model(folder)
    with pytest.raises(ValueError, match='has no config.json'): create_model(tmp_path)


def test_pretrained_safetensors_file(tmp_path):
    model = create_model('t2t_vit_7', img_size=32, embed_dim=64, depth=2, num_heads=2, num_classes=10).eval()
    path = save_safetensors({f'module.{k}': v for k, v in model.state_dict().items()}, tmp_path / 'w.safetensors')  # DDP prefixes
    with no_unpickling():
        again = create_model('t2t_vit_7', img_size=32, embed_dim=64, depth=2, num_heads=2, num_classes=10, pretrained=path).eval()
    with torch.no_grad(): assert torch.equal(again(_x(32, 32)), model(_x(32, 32)))


def test_save_pretrained_refuses_what_it_cannot_write(tmp_path):
    with pytest.raises(ValueError, match='built by create_model'): save_pretrained(nn.Linear(3, 4), tmp_path / 'a')
    m = create_model('t2t_vit_7', img_size=32, embed_dim=64, depth=2, num_heads=2, num_classes=3)
    with pytest.raises(ValueError, match='2 label names for a head of 3 classes'): save_pretrained(m, tmp_path / 'b', label_names=['a', 'b'])
    odd = create_model('t2t_vit_7', img_size=32, embed_dim=64, depth=2, num_heads=2, norm_layer=nn.LayerNorm)
    with pytest.raises(ValueError, match=r'config.json cannot hold config.model_args.norm_layer \(type\)'): save_pretrained(odd, tmp_path / 'c')
    assert not (tmp_path / 'b').exists() and not (tmp_path / 'c').exists()
