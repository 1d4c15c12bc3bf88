"""Our models through timm: `import t2t_course.timm` registers every variant, and each one passes what timm's own
tests/test_models.py asks of its vision transformers (the "non-standard" family), one property per test over every
registered name: forward (with gradient checkpointing), backward, default_cfgs_non_std, forward_features
(features_only), forward_intermediates, forward_fx, backward_fx, forward_torchscript and forward_fx_torchscript. Plus what timm does not test: checkpointing gives
the same gradients, the layer-wise decay groups, weights from local files, names timm already has, and model folders
(`save_pretrained`'s and `t2t_convert`'s) read by timm's own loader, `timm.create_model('local-dir:FOLDER', pretrained=True)`.

Each variant keeps its widths, heads and block type but is shrunk to 3 blocks (the dense design to stages (2, 1)) and
built at 32 px, so the whole file runs in a minute or two on a CPU; every model runs at any size
(`fixed_input_size=False`), so the size changes nothing that is checked.
"""
import argparse, math, subprocess, sys, warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import t2t_course
from t2t_course.models.t2t_vit import get_variant
from tests.support.variant_sizes import few_blocks

try:  # timm is optional, and its internals move between releases: a timm without them skips this file, with the reason
    import timm
    from timm.models import FeatureInfo, get_notrace_functions, get_notrace_modules
    import timm.data, timm.optim
    import t2t_course.timm as t2t_timm
except ImportError as e:
    _v = getattr(sys.modules.get('timm'), '__version__', None)
    pytest.skip(f"timm{' ' + _v if _v else ''} cannot be used here: {type(e).__name__}: {e}", allow_module_level=True)

REF = Path(__file__).resolve().parents[2] / 'reference'
MODELS = t2t_course.list_models()


def _tiny(name):
    "Overrides that keep a variant's kind and widths and shrink it: 3 blocks (the dense design: stages (2, 1)), 32 px."
    return dict(img_size=32) | few_blocks(name, 3)


def _create(name, **kwargs):
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **(_tiny(name) | kwargs))


def _input_size(model, target=None):
    "timm's `_get_input_size`: the cfg's size, capped at `target` unless the model's input size is fixed."
    cfg = model.pretrained_cfg
    if cfg.get('fixed_input_size') or not target: return cfg['input_size']
    return tuple(min(x, target) for x in cfg['input_size'])


def _x(size, batch=1): return torch.randn(batch, *size, generator=torch.Generator().manual_seed(1))


def _fx_model(model, train=False):
    "The model traced by torchvision's FX feature extractor with timm's notrace lists, returning its last node."
    kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(), param_shapes_constant=True)
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=kwargs)
    return create_feature_extractor(model, train_return_nodes=[train_nodes[-1]], eval_return_nodes=[eval_nodes[-1]],
                                    tracer_kwargs=kwargs)


# ---------------------------------------------------------------- registration
def test_every_model_is_registered_with_its_cfg():
    assert [n for n in MODELS if timm.is_model(n)] == MODELS
    assert all(getattr(timm.models.model_entrypoint(n), 't2t_course', False) for n in MODELS)
    released = [n for n in MODELS if get_variant(n).file]
    assert [n for n in timm.list_models(pretrained=True) if n in MODELS] == released
    for n in MODELS:
        cfg, v = timm.get_pretrained_cfg(n), get_variant(n)
        assert (cfg.architecture, cfg.input_size, cfg.url, cfg.file) == (n, (3, v.img_size, v.img_size), v.url, v.file)
        assert (cfg.crop_pct, cfg.interpolation, cfg.fixed_input_size, cfg.classifier) == (0.9, 'bicubic', False, 'head')
        assert cfg.license == ('bsd-3-clause-clear' if v.file else 'apache-2.0') and cfg.first_conv


def test_import_t2t_course_does_not_import_timm_or_onnx():
    code = ("import sys, t2t_course; t2t_course.create_model('t2t_vit_7', img_size=32); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('timm', 'onnx', 'onnxruntime', 'onnxscript')))")
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == '[]'


def test_a_name_timm_already_has_is_left_alone():
    @timm.models.register_model
    def t2t_vit_clash_probe(pretrained=False, **kwargs): return nn.Identity()
    with pytest.warns(UserWarning, match="timm already has a model named 't2t_vit_clash_probe': left as it is"):
        assert t2t_timm.register_timm_models(['t2t_vit_clash_probe']) == []
    assert isinstance(timm.create_model('t2t_vit_clash_probe'), nn.Identity)
    assert t2t_timm.register_timm_models() == []  # ours are registered once


# ---------------------------------------------------------------- timm's tests/test_models.py, non-std family
@pytest.mark.parametrize('name', MODELS)
def test_model_forward(name):
    "timm's test_model_forward: a finite forward; gradient checkpointing on, the same output."
    model = _create(name).eval()
    x = _x(_input_size(model, target=384))
    out = model(x)
    assert out.shape[0] == 1 and not torch.isnan(out).any()
    model.set_grad_checkpointing()
    assert torch.allclose(out, model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('name', MODELS)
def test_model_backward(name):
    "timm's test_model_backward: num_classes=42, training mode, every parameter gets a gradient."
    model = _create(name, num_classes=42).train()
    num_params = sum(p.numel() for p in model.parameters())
    out = model(_x(_input_size(model, target=128), batch=2))
    out.mean().backward()
    assert all(p.grad is not None for p in model.parameters()), [n for n, p in model.named_parameters() if p.grad is None]
    assert sum(p.grad.numel() for p in model.parameters()) == num_params
    assert out.shape[-1] == 42 and not torch.isnan(out).any()


@pytest.mark.parametrize('name', MODELS)
def test_model_default_cfgs_non_std(name):
    "timm's test_model_default_cfgs_non_std: feature widths, features without a head, classifier and first_conv names."
    model = _create(name).eval()
    assert model.num_classes >= 0 and model.num_features > 0 and model.head_hidden_size > 0
    state_dict, cfg = model.state_dict(), model.default_cfg
    x = _x(_input_size(model))
    feats = model.forward_features(x)
    pre = model.forward_head(feats, pre_logits=True)
    assert feats.ndim == 3 and feats.shape[-1] == model.num_features
    assert pre.shape[1] == model.head_hidden_size
    model.reset_classifier(0)
    assert model.num_classes == 0
    out = model(x)
    assert out.shape[-1] == model.head_hidden_size and out.shape == pre.shape
    out = _create(name, num_classes=0).eval()(x)
    assert out.shape[-1] == model.num_features
    if cfg.get('num_classes'):
        for c in (cfg['classifier'],) if isinstance(cfg['classifier'], str) else cfg['classifier']:
            assert c + '.weight' in state_dict, f'{c} not in model params'
    first = cfg['first_conv']
    assert isinstance(first, (str, tuple, list))
    for fc in (first,) if isinstance(first, str) else first: assert fc + '.weight' in state_dict, f'{fc} not in model params'


@pytest.mark.parametrize('name', MODELS)
def test_model_forward_features(name):
    "timm's test_model_forward_features, through its getter: the block maps `feature_info` promises."
    model = timm.create_model(name, pretrained=False, features_only=True, **_tiny(name)).eval()
    channels, reduction = model.feature_info.channels(), model.feature_info.reduction()
    assert len(channels) >= 3
    size = _input_size(model, target=96)
    outputs = model(_x(size))
    assert len(outputs) == len(channels)
    for c, r, o in zip(channels, reduction, outputs):
        assert o.shape[1] == c and o.shape[0] == 1 and not torch.isnan(o).any()
        assert o.shape[2] <= math.ceil(size[1] / r) + 1 and o.shape[3] <= math.ceil(size[2] / r) + 1


@pytest.mark.parametrize('name', MODELS)
def test_model_forward_intermediates(name):
    "timm's test_model_forward_intermediates: maps as feature_info says; the final tokens are forward_features'."
    model = _create(name).eval()
    info = FeatureInfo(model.feature_info, len(model.feature_info))
    assert len(info.channels()) >= 3
    size = _input_size(model, target=96)
    x = _x(size)
    final, inter = model.forward_intermediates(x, output_fmt='NCHW')
    assert len(inter) == len(info.channels())
    for c, r, o in zip(info.channels(), info.reduction(), inter):
        assert o.shape[1] == c and o.shape[0] == 1 and not torch.isnan(o).any()
        assert o.shape[2] <= math.ceil(size[1] / r) + 1 and o.shape[3] <= math.ceil(size[2] / r) + 1
    assert torch.allclose(final, model.forward_features(x))
    model.set_grad_checkpointing()
    assert torch.allclose(final, model.forward_intermediates(x, output_fmt='NCHW')[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('name', MODELS)
def test_model_forward_fx(name):
    "timm's test_model_forward_fx: traced with timm's FX tracer, the graph computes exactly the model's output."
    model = _create(name).eval()
    x = _x(_input_size(model, target=128))
    with torch.inference_mode():
        out = model(x)
        fx_out = torch.cat(tuple(_fx_model(model)(x).values()))
    assert torch.all(fx_out == out) and not torch.isnan(out).any()


@pytest.mark.parametrize('name', MODELS)
def test_model_backward_fx(name):
    "timm's test_model_backward_fx: the traced model in training mode, every parameter gets a gradient."
    model = _create(name, num_classes=42).train()
    num_params = sum(p.numel() for p in model.parameters())
    fx = _fx_model(model, train=True)
    out = torch.cat(tuple(fx(_x(_input_size(model, target=128), batch=2)).values()))
    out.mean().backward()
    assert all(p.grad is not None for p in fx.parameters())
    assert sum(p.grad.numel() for p in fx.parameters()) == num_params
    assert out.shape[-1] == 42 and not torch.isnan(out).any()


@pytest.mark.parametrize('name', MODELS)
def test_model_forward_torchscript(name):
    "timm's test_model_forward_torchscript: the model built under set_scriptable(True) and compiled by TorchScript gives its output."
    with timm.set_scriptable(True): model = _create(name).eval()
    x = _x(_input_size(model, target=128))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', FutureWarning)  # torch 2.14 deprecates torch.jit.script
        scripted = torch.jit.script(model)
    with torch.no_grad():
        out, ref = scripted(x), model(x)
    assert out.shape[0] == 1 and not torch.isnan(out).any()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match='must be a 4-D batch'): scripted(x[0])  # the checks run in Python, named


@pytest.mark.parametrize('name', MODELS)
def test_model_forward_fx_torchscript(name):
    "timm's test_model_forward_fx_torchscript: the traced graph scripted by TorchScript runs, and gives the model's output."
    model = _create(name).eval()
    x = _x(_input_size(model, target=128), batch=2)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', FutureWarning)  # torch 2.14 deprecates torch.jit.script
        scripted = torch.jit.script(_fx_model(model))
    with torch.no_grad():
        out, ref = torch.cat(tuple(scripted(x).values())), model(x)
    assert out.shape == ref.shape and not torch.isnan(out).any()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match='must be a 4-D batch'): scripted(x[0])  # the checks run in Python, named


# ---------------------------------------------------------------- beyond timm's tests
@pytest.mark.parametrize('name', MODELS)
def test_grad_checkpointing_recomputes_and_gives_the_same_gradients(name):
    "With checkpointing each block runs again in the backward pass, and the gradients are the same."
    model, x = _create(name, num_classes=5).train(), _x((3, 32, 32), batch=2)
    calls = []
    for blk in model.blocks[:-1]: blk.register_forward_pre_hook(lambda m, i: calls.append(1))  # the last one runs forward_cls
    grads = []
    for enable in (False, True):
        model.set_grad_checkpointing(enable); model.zero_grad(); calls.clear()
        torch.manual_seed(0); model(x).logsumexp(-1).sum().backward()
        assert len(calls) == (len(model.blocks) - 1) * (1 + enable)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n in grads[0]: torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize('name', ['t2t_vit_7', 'vit_baseline', 't2t_vit_dense'])
def test_layer_decay_groups(name):
    "timm's layer-wise decay through group_matcher: the stem lowest, then each block (the norm with the last), the head at 1."
    model = _create(name)
    groups = timm.optim.param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.5)
    scale_of = {id(p): g['lr_scale'] for g in groups for p in g['params']}
    scale = {n: scale_of[id(p)] for n, p in model.named_parameters()}
    L = len(model.blocks)                                           # timm puts the final norm with the last block
    stem = [n for n in scale if n == 'cls_token' or n.startswith(model.stem_prefix + '.')]
    assert {scale[n] for n in stem} == {0.5 ** (L + 1)}
    for i in range(L): assert {s for n, s in scale.items() if n.startswith(f'blocks.{i}.')} == {0.5 ** (L - i)}
    assert scale['norm.weight'] == 0.5 and scale['head.weight'] == 1.0 and len(scale) == sum(1 for _ in model.parameters())


def test_pretrained_from_local_files(tmp_path, monkeypatch):
    "pretrained=True reads the release file (overlay file, cache_dir, weights_dir); never downloads; clear errors."
    g = torch.load(REF / 'golden' / 't2t_vit_7_224.pt')
    ck = {'args': argparse.Namespace(model='t2t_vit_7'), 'state_dict_ema': {f'module.{k}': v for k, v in g['state_dict'].items()}}
    release = t2t_timm.timm_cfg('t2t_vit_7')['file']
    torch.save(ck, tmp_path / 'mine.pth.tar'); torch.save(ck, tmp_path / release)
    monkeypatch.setenv('T2T_COURSE_WEIGHTS', str(tmp_path / 'empty'))
    for kwargs in (dict(pretrained_cfg_overlay=dict(file=str(tmp_path / 'mine.pth.tar'))), dict(cache_dir=tmp_path)):
        model = timm.create_model('t2t_vit_7', pretrained=True, **kwargs).eval()
        with torch.no_grad(): torch.testing.assert_close(model(g['input']), g['logits'], atol=1e-4, rtol=0)
    with pytest.warns(UserWarning, match="dropping the checkpoint's classifier head"):
        model = timm.create_model('t2t_vit_7', pretrained=True, cache_dir=tmp_path, num_classes=10)
    assert model.num_classes == 10 and model.pretrained_cfg['num_classes'] == 10
    monkeypatch.setenv('T2T_COURSE_WEIGHTS', str(tmp_path))
    assert timm.create_model('t2t_vit_7', pretrained=True).pretrained_cfg['file'] == release  # weights_dir()
    monkeypatch.setenv('T2T_COURSE_WEIGHTS', str(tmp_path / 'empty'))
    with pytest.raises(FileNotFoundError, match=r'no checkpoint for t2t_vit_7: looked for .* Download https://github\.com/yitu'):
        timm.create_model('t2t_vit_7', pretrained=True)
    with pytest.raises(ValueError, match='t2t_vit_dense has no released weights'): timm.create_model('t2t_vit_dense', pretrained=True)
    with pytest.raises(ValueError, match="no pretrained tag 'in21k'"): timm.create_model('t2t_vit_7.in21k')
    with pytest.raises(ValueError, match="pools with its cls token only, got global_pool='avg'"):
        timm.create_model('t2t_vit_7', global_pool='avg')
    (tmp_path / 'garbage.pth').write_bytes(b'not weights')
    with pytest.raises(t2t_course.models.t2t_vit.CheckpointError, match='garbage.pth: not a PyTorch checkpoint'):
        timm.create_model('t2t_vit_7', pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / 'garbage.pth')))


def test_timm_data_config_is_the_models():
    "timm's data pipeline reads our preprocessing: resize to size / 0.9, centre crop, bicubic, ImageNet mean and std."
    import timm.data
    cfg = timm.data.resolve_model_data_config(_create('t2t_vit_7', img_size=224))
    assert (cfg['input_size'], cfg['crop_pct'], cfg['interpolation'], cfg['crop_mode']) == ((3, 224, 224), 0.9, 'bicubic', 'center')
    assert cfg['mean'] == (0.485, 0.456, 0.406) and cfg['std'] == (0.229, 0.224, 0.225)


def test_pretrained_cfg_and_overlay_are_accepted():
    "timm's pretrained_cfg (a dict or a PretrainedCfg) replaces the fields it names; the overlay is applied last."
    m = timm.create_model('t2t_vit_7', pretrained_cfg=dict(crop_pct=0.875), **_tiny('t2t_vit_7'))
    assert m.pretrained_cfg['crop_pct'] == 0.875 and m.pretrained_cfg['input_size'] == (3, 32, 32)
    m = timm.create_model('t2t_vit_7', pretrained_cfg=timm.get_pretrained_cfg('t2t_vit_7'), pretrained_cfg_overlay=dict(crop_pct=1.0),
                          cache_dir='/nowhere', **_tiny('t2t_vit_7'))
    assert m.pretrained_cfg['crop_pct'] == 1.0 and m.pretrained_cfg['file'] == t2t_timm.timm_cfg('t2t_vit_7')['file']
    assert timm.data.resolve_model_data_config(m)['crop_pct'] == 1.0


# ---------------------------------------------------------------- model folders through timm's own loader ('local-dir:')
from t2t_course.models.t2t_vit import save_pretrained
from tests.support.commands import call
from tests.support.no_pickle import no_unpickling

LOCAL_DIR = pytest.mark.skipif(not hasattr(sys.modules.get('timm.models._hub'), 'load_model_config_from_path'),
                               reason=f"timm {timm.__version__} cannot read model folders ('local-dir:' needs timm 1.0.16)")
FOLDER_CASES = {  # what: (name, overrides, label names)
    'the family, Performer T2T layers': ('t2t_vit_7', {}, None),
    'the family, transformer T2T layers': ('t2t_vit_t_14', {}, None),
    'a design-space variant (SE)': ('t2t_vit_14_se', {}, None),
    'a design-space variant (dense)': ('t2t_vit_dense', {}, None),
    'a fine-tuned 10-class head with label names': ('t2t_vit_7', dict(num_classes=10), [f'digit {i}' for i in range(10)]),
}


@LOCAL_DIR
@pytest.mark.parametrize('what', list(FOLDER_CASES))
def test_timm_builds_our_model_from_a_model_folder(what, tmp_path):
    "save_pretrained's folder through `timm.create_model('local-dir:FOLDER', pretrained=True)`: our logits, our cfg, no pickle."
    name, kw, labels = FOLDER_CASES[what]
    torch.manual_seed(0)
    model = t2t_course.create_model(name, **(_tiny(name) | kw)).eval()
    folder = save_pretrained(model, tmp_path / 'm', label_names=labels)
    with no_unpickling(): via = timm.create_model(f'local-dir:{folder}', pretrained=True).eval()
    x = _x((3, 32, 32), batch=2)
    with torch.no_grad(): torch.testing.assert_close(via(x), model(x), atol=1e-6, rtol=0)
    cfg = via.pretrained_cfg
    assert (cfg['source'], cfg['file'], via.num_classes, cfg.get('label_names')) == ('local-dir', str(folder), model.num_classes, labels)
    assert timm.data.resolve_model_data_config(via)['input_size'] == (3, 32, 32)


@LOCAL_DIR
def test_timm_builds_the_converters_folder_from_an_official_file(tmp_path):
    "An official-format release (the golden T2T-ViT-7) through t2t_convert, then timm: the official logits, ImageNet's names."
    from t2t_course.deploy.convert import convert_main
    g = torch.load(REF / 'golden' / 't2t_vit_7_224.pt')
    official = tmp_path / '71.7_T2T_ViT_7.pth.tar'
    torch.save({'args': argparse.Namespace(model='t2t_vit_7'), 'state_dict_ema': {f'module.{k}': v for k, v in g['state_dict'].items()},
                'state_dict': {f'module.{k}': torch.zeros_like(v) for k, v in g['state_dict'].items()}}, official)
    code, out, err = call(convert_main, [str(official), str(tmp_path / 't2t_vit_7'), '--model', 't2t_vit_7'])
    assert code == 0 and err == '', err
    with no_unpickling(): via = timm.create_model(f"local-dir:{tmp_path / 't2t_vit_7'}", pretrained=True).eval()
    ours = t2t_course.create_model('t2t_vit_7', pretrained=official).eval()
    with torch.no_grad():
        torch.testing.assert_close(via(g['input']), ours(g['input']), atol=1e-6, rtol=0)
        torch.testing.assert_close(via(g['input']), g['logits'], atol=1e-4, rtol=0)
    assert via.pretrained_cfg['label_names'][:2] == ['tench', 'goldfish'] and via.pretrained_cfg['crop_pct'] == 0.9
