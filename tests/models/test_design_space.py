"""The paper's five CNN-inspired designs (chapter 10, `t2t_course.models.design_space`).

- the official layouts (keys, shapes, total and trainable counts) against reference/official_design_space.json,
  and the MACs against the official (fvcore) counts in reference/official_macs.json;
- exactness: an independent reference of the official semantics (tests/support/official_design_reference.py) makes a
  state_dict in the official layout, saved as the official training script saves it; ours loads it through
  `create_model(..., pretrained=path)` and reproduces the reference's logits, on the fast and readable paths;
- shrunk instances, and the behaviours where we fix the official code (dense drop path and head, ghost MLP ratios).

The model contract (forward, backward, API, any size, compile, fast paths) runs on these models in
tests/models/test_t2t_vit.py and tests/test_core.py, which parametrize over `list_models()`.
"""
import argparse, json
from pathlib import Path

import pytest
import torch

import t2t_course
from t2t_course import create_model, list_models
from t2t_course.core import set_fast_paths
from t2t_course.models.backbone import count_macs, drop_path_rates
from t2t_course.models.t2t_vit import get_variant, checkpoint_filter_fn
from t2t_course.models.design_space import DenseBlock, GhostMlp, PAPER_TABLE6
from tests.support.official_design_reference import DESIGNS, official_layout, official_state_dict, official_logits
from tests.support.variant_sizes import shapes_only

REF = Path(__file__).resolve().parents[2] / 'reference'
DESIGN_SPACE = json.loads((REF / 'official_design_space.json').read_text())
OFFICIAL_MACS = json.loads((REF / 'official_macs.json').read_text())
NAMES = {d: name for d, (name, _) in DESIGNS.items()}
SMALL = {  # 64 px, each keeping what makes its design; token_dim 32 shrinks the T2T module too
    'resnext': dict(embed_dim=96, depth=2, num_heads=8),                       # heads of width 12
    'wide': dict(embed_dim=128, depth=1, num_heads=2),
    'se': dict(embed_dim=64, depth=2, num_heads=2),                            # SE bottleneck 64 / 16 = 4
    'dense': dict(embed_dim=32, growth_rate=16, block_config=(2, 2), num_heads=2),
    'ghost': dict(embed_dim=64, depth=2, num_heads=2),
}
SMALL_COMMON = dict(img_size=64, num_classes=10, token_dim=32)


def test_registered_by_import_without_weights():
    assert set(NAMES.values()) <= set(list_models())
    assert not set(NAMES.values()) & set(list_models(pretrained=True))
    assert list_models(pretrained=True) == ['t2t_vit_7', 't2t_vit_10', 't2t_vit_12', 't2t_vit_14', 't2t_vit_14_384',
                                            't2t_vit_19', 't2t_vit_24', 't2t_vit_t_14', 't2t_vit_t_19', 't2t_vit_t_24']
    assert t2t_course.models.design_space.t2t_vit_dense is not None
    for name in NAMES.values():
        v = get_variant(name)
        assert (v.file, v.url, v.top1, dict(v.recipe), v.img_size) == (None, None, None, {}, 224)
        with pytest.raises(ValueError, match=f'{name} has no released weights'): create_model(name, pretrained=True)
    assert set(PAPER_TABLE6) == set(NAMES.values()) | {'t2t_vit_14'}


@pytest.mark.parametrize('design', NAMES)
def test_official_layout(design):
    "Identical keys and shapes, total and trainable numel, frozen tensors, at the official size."
    ref = DESIGN_SPACE[NAMES[design]]
    model = create_model(NAMES[design])
    sd = model.state_dict()
    assert {k: list(v.shape) for k, v in sd.items()} == ref['keys']
    assert sum(v.numel() for v in sd.values()) == ref['state_dict_numel']
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == ref['trainable_numel']
    frozen = {k for k in sd if k not in dict(model.named_parameters())}
    assert frozen == {'pos_embed', 'tokens_to_token.attention1.w', 'tokens_to_token.attention2.w'}


@pytest.mark.parametrize('design', NAMES)
def test_reference_has_the_official_layout(design):
    "The reference's layout is the measured official one, key for key and in the official order (it checks the reference)."
    ref = DESIGN_SPACE[NAMES[design]]
    layout = official_layout(design)
    assert list(layout) == list(ref['keys']) and all(list(layout[k]) == s for k, s in ref['keys'].items())


@pytest.mark.parametrize('design', NAMES)
def test_macs_match_official(design):
    "count_macs at 224 px within 0.5% of the official count, in total and for each kind of operation (shapes only)."
    model = shapes_only(NAMES[design])
    macs, ref = count_macs(model, 224), OFFICIAL_MACS[NAMES[design]]
    assert abs(macs['total'] / ref['macs_total'] - 1) < 0.005, (macs, ref)
    by_op = ref['macs_by_op']
    for ours, theirs in (('linear', 'linear'), ('attention', 'matmul'), ('performer', 'einsum'), ('layer_norm', 'layer_norm'),
                         ('conv', 'conv')):
        assert abs(macs[ours] - by_op.get(theirs, 0)) <= 0.005 * by_op.get(theirs, 0), (ours, macs[ours], by_op.get(theirs))


@pytest.mark.parametrize('fast', [True, False])
@pytest.mark.parametrize('design', NAMES)
def test_official_checkpoint_reproduces_the_reference(design, fast, tmp_path):
    "An official-format checkpoint (EMA and raw weights, `module.` prefixes, pickled args) loads; logits equal the reference's."
    arch = dict(SMALL_COMMON, **SMALL[design])
    sd = official_state_dict(design, seed=1, **arch)
    ckpt = {'epoch': 309, 'args': argparse.Namespace(model=NAMES[design]),
            'state_dict_ema': {f'module.{k}': v for k, v in sd.items()},
            'state_dict': {f'module.{k}': torch.zeros_like(v) for k, v in sd.items()}}
    torch.save(ckpt, tmp_path / 'official.pth.tar')
    model = create_model(NAMES[design], pretrained=tmp_path / 'official.pth.tar', **arch).eval()
    set_fast_paths(model, fast)
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(): logits = model(images)
    expected = official_logits(design, images, sd, **arch)
    assert expected.abs().max() > 0.1  # not a trivial output
    torch.testing.assert_close(logits.double(), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize('design', NAMES)
def test_shrunk_instance(design):
    "A laptop-sized instance: the overrides reach every layer, and its layout is the official one at that size."
    arch = dict(SMALL_COMMON, **SMALL[design])
    model = create_model(NAMES[design], **arch)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == official_layout(design, **arch)
    assert sum(p.numel() for p in model.parameters()) < 300_000
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 10)
    if design == 'resnext': assert model.blocks[0].attn.scale == 12 ** -0.5


def test_dense_fixes():
    "Drop-path rates linear over the 19 dense blocks (the official code: one rate per stage); a head of num_features."
    model = create_model('t2t_vit_dense', img_size=32, drop_path_rate=0.1)
    dense = [b for b in model.blocks if isinstance(b, DenseBlock)]
    rates = [getattr(b.drop_path, 'drop_prob', 0.) for b in dense]
    assert len(dense) == 19 and rates == pytest.approx(drop_path_rates(0.1, 19))
    assert (model.embed_dim, model.num_features, model.head.in_features) == (128, 584, 584)
    model.reset_classifier(7)
    assert model.head.in_features == 584 and model.eval()(torch.randn(1, 3, 32, 32)).shape == (1, 7)
    with pytest.raises(ValueError, match='block_config needs stages of >= 1 block'): create_model('t2t_vit_dense', block_config=(2, 0))


def test_ghost_mlp_ratios():
    "The official ghost MLP always makes two ghosts (it fails unless mlp_ratio is 3); ours makes ratio - 1."
    assert [k for k in GhostMlp(32, 64).state_dict() if 'cheap' in k] == ['cheap_operation2.weight']
    assert [k for k in GhostMlp(32, 128).state_dict() if 'cheap' in k] == [f'cheap_operation{i}.weight' for i in (2, 3, 4)]
    for ratio in (2., 4.):
        model = create_model('t2t_vit_16_ghost', img_size=32, embed_dim=64, depth=1, num_heads=2, mlp_ratio=ratio).eval()
        assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)
    with pytest.raises(ValueError, match='a whole mlp_ratio'): create_model('t2t_vit_16_ghost', mlp_ratio=2.5)


def test_a_design_checkpoint_in_the_wrong_model_is_named():
    "An SE checkpoint in T2T-ViT-14 is refused, naming the SE keys and the design it belongs to."
    sd = create_model('t2t_vit_14_se').state_dict()
    with pytest.raises(ValueError) as e: checkpoint_filter_fn(sd, create_model('t2t_vit_14'))
    assert 'not in the model: blocks.0.attn.se_layer.fc.0.weight' in str(e.value)
    assert 'looks like t2t_vit_14_se' in str(e.value)


@pytest.mark.parametrize('design', NAMES)
def test_fast_path_switches_are_declared(design):
    "Each design's switches are declared in `fast_paths` (so set_fast_paths reaches them): the four of T2T-ViT, no more."
    model = create_model(NAMES[design], **dict(SMALL_COMMON, **SMALL[design]))
    switches = {(type(m).__name__, s) for m in model.modules() for s in getattr(m, 'fast_paths', ())}
    attn = {'se': 'SEAttention', 'ghost': 'GhostAttention'}.get(design, 'Attention')
    assert switches == {(attn, 'fused_attn'), ('TokenPerformer', 'batched_favor'), ('T2TModule', 'gather_splits'),
                        ('T2TViTDense' if design == 'dense' else 'T2TViT', 'cls_only_last_block')}
    for m in model.modules():
        assert {s for s in ('fused_attn', 'batched_favor', 'gather_splits', 'cls_only_last_block') if hasattr(m, s)} \
            == set(getattr(m, 'fast_paths', ())), type(m).__name__
