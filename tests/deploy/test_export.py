"""Export (chapter 24a, `t2t_course.deploy.export`): `torch.export` and ONNX with a dynamic batch, height and width,
checked against onnxruntime at three sizes (a non-square one among them) on small models of each kind of tokenizer;
a Performer whose normaliser underflows (its eps must survive the export); the preprocessing and class names in the
file's metadata."""
import json

import pytest
import torch

from t2t_course import create_model
from t2t_course.deploy import check_onnx, export_onnx, export_program
from tests.support.commands import REPO

TINY = dict(img_size=64, embed_dim=64, depth=2, num_heads=2, num_classes=10)
SIZES = [(64, 64), (96, 96), (80, 112)]  # the built size, a larger square, a non-square one
KINDS = ['t2t_vit_7', 't2t_vit_t_14', 'vit_baseline']  # Performer T2T layers, transformer T2T layers, a hard split


def _tiny(name):
    torch.manual_seed(0)
    return create_model(name, **TINY).eval()


@pytest.mark.parametrize('name', KINDS)
def test_export_program_any_batch_and_size(name):
    model = _tiny(name)
    ep = export_program(model)
    for batch in (1, 3):
        for h, w in SIZES:
            x = torch.randn(batch, 3, h, w)
            with torch.no_grad(): torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


@pytest.fixture(scope='module', params=KINDS)
def onnx_export(request, tmp_path_factory):
    pytest.importorskip('onnx'); pytest.importorskip('onnxruntime')
    model = _tiny(request.param)
    return model, export_onnx(model, tmp_path_factory.mktemp('onnx') / f'{request.param}.onnx')


def test_onnx_matches_onnxruntime_at_three_sizes(onnx_export):
    model, path = onnx_export
    for batch in (1, 3):
        diffs = check_onnx(path, model, sizes=SIZES, batch=batch, atol=1e-4)
        assert set(diffs) == set(SIZES) and max(diffs.values()) <= 1e-4, diffs


def test_onnx_graph_is_dynamic(onnx_export):
    import onnx
    _, path = onnx_export
    graph = onnx.load(str(path)).graph
    (inp,), (out,) = graph.input, graph.output
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert inp.name == 'image' and out.name == 'logits'
    assert isinstance(dims[0], str) and dims[1] == 3 and isinstance(dims[2], str) and isinstance(dims[3], str), dims


def test_check_onnx_reports_a_mismatch(onnx_export):
    model, path = onnx_export
    with torch.no_grad(): model.head.bias += 1e-2
    try:
        with pytest.raises(ValueError, match=r'differs from the model by more than 0.0001 at \{\(64, 64\)'):
            check_onnx(path, model, sizes=[(64, 64)])
    finally:
        with torch.no_grad(): model.head.bias -= 1e-2


def test_the_performers_epsilon_survives_the_export(tmp_path):
    """A Performer whose features underflow (its k and q scaled up: D, the normaliser, far below its eps of 1e-8) exports
    right: the exporter's default optimizer would drop `D + 1e-8` (onnxscript's `x + 0` rule matches within 1e-8) and
    the file would divide 0 by 0."""
    pytest.importorskip('onnx'); pytest.importorskip('onnxruntime')
    model = _tiny('t2t_vit_7')
    layer = model.tokens_to_token.attention2
    with torch.no_grad(): layer.kqv.weight[:2 * layer.emb] *= 6; layer.kqv.bias[:2 * layer.emb] *= 6
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad(): assert torch.isfinite(model(x)).all()
    diffs = check_onnx(export_onnx(model, tmp_path / 'underflow.onnx'), model, sizes=[(64, 64)])
    assert diffs[(64, 64)] < 1e-4, diffs


def test_the_onnx_file_carries_its_preprocessing_and_class_names(tmp_path):
    "`metadata_props`: the preprocessing of the model's default_cfg and the names, as JSON strings; entries already there kept."
    pytest.importorskip('onnx'); pytest.importorskip('onnxruntime')
    import onnx, onnxruntime as ort
    from t2t_course.deploy.export import read_onnx_metadata, write_onnx_metadata
    model = _tiny('t2t_vit_7')
    model.default_cfg.update(crop_pct=1.0, interpolation='bilinear')
    path = export_onnx(model, tmp_path / 'm.onnx', label_names=[f'c{i}' for i in range(10)])
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert json.loads(props['label_names']) == [f'c{i}' for i in range(10)] and json.loads(props['architecture']) == 't2t_vit_7'
    assert json.loads(props['preprocessing']) == dict(input_size=[3, 64, 64], resize=64, resize_mode='shorter side', crop=[64, 64],
                                                      crop_pct=1.0, crop_mode='center', interpolation='bilinear',
                                                      mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], color='RGB', scale='0-1')
    write_onnx_metadata(path, dict(owner='me'))
    session = ort.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    meta = read_onnx_metadata(session)
    assert meta == read_onnx_metadata(path) and meta['owner'] == 'me' and meta['num_classes'] == 10 and len(meta) == 5


def test_int8_file_keeps_the_trained_models_top1_on_the_digits(tmp_path):
    """`export_onnx(..., quantize='int8')` of the T2T-ViT-7 chapter 20's study trained on the digits (its committed
    checkpoint): only MatMul and Gemm replaced (the MatMuls of two activations stay float), the metadata kept, and on the
    1,440 validation digits the int8 file's top-1 within half a point of the fp32 model's, its predictions the same on
    at least 98% of them; the file's own report checked on the same digits agrees."""
    pytest.importorskip('onnx'); pytest.importorskip('onnxruntime')
    import onnxruntime as ort
    from t2t_course.data import create_datasets, data_root
    from t2t_course.deploy.export import read_onnx_metadata
    from t2t_course.study import read_results
    study = REPO / 'nbs' / 'study' / 'claims'
    row = next(r for r in read_results(study / 'results.csv') if r['model'] == 't2t_64' and r['seed'] == 0)
    model = create_model(row['variant'], pretrained=study / 'checkpoints' / 't2t_64_seed0.pth', num_classes=10,
                         img_size=row['img_size'], **json.loads(row['model_kwargs'])).eval()
    _, val = create_datasets(data_root(row['data']), row['img_size'], 'digits')
    x, y = (torch.cat(t) for t in zip(*torch.utils.data.DataLoader(val, batch_size=512)))
    path = export_onnx(model, tmp_path / 'digits.int8.onnx', quantize='int8', check_images=x)
    assert [p.name for p in tmp_path.iterdir()] == ['digits.int8.onnx']  # the fp32 file it started from is gone
    meta = read_onnx_metadata(path)
    q = meta['quantization']
    assert set(q['replaced']) == {'MatMul', 'Gemm'} and q['replaced']['Gemm'] == '1/1', q
    n, total = map(int, q['replaced']['MatMul'].split('/'))
    assert 0 < n < total, q  # the weights' MatMuls, not attention's products of two activations
    assert meta['architecture'] == 't2t_vit_7' and meta['preprocessing']['input_size'] == [3, 64, 64]
    got = ort.InferenceSession(str(path), providers=['CPUExecutionProvider']).run(None, {'image': x.numpy()})[0]
    with torch.no_grad(): ref = model(x).numpy()
    top1 = lambda lg: float((lg.argmax(1) == y.numpy()).mean())
    agree = float((got.argmax(1) == ref.argmax(1)).mean())
    assert len(y) == 1440 and abs(top1(got) - top1(ref)) <= 0.005 and agree >= 0.98, (top1(got), top1(ref), agree)
    assert q['checked_on'] == 1440 and abs(q['top1_agreement'] - agree) <= 0.005, q
    print(f"int8 top-1 {top1(got):.4f} against fp32 {top1(ref):.4f}; same class on {agree:.4f}; {q}")


def test_export_onnx_without_a_default_cfg(tmp_path):
    "A model with no `default_cfg` (a torchvision-style one) exports at the size given, with no preprocessing invented."
    pytest.importorskip('onnx'); pytest.importorskip('onnxruntime')
    from t2t_course.deploy.export import read_onnx_metadata
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(8, 4)).eval()
    path = export_onnx(model, tmp_path / 'plain.onnx', img_size=32)
    assert check_onnx(path, model, sizes=[(32, 32), (48, 40)])[(48, 40)] < 1e-5
    meta = read_onnx_metadata(path)
    assert meta['architecture'] == 'Sequential' and 'preprocessing' not in meta and meta['num_classes'] is None
    with pytest.raises(ValueError, match="None \\(fp32\\) or 'int8'"): export_onnx(model, tmp_path / 'x.onnx', quantize='fp16')
