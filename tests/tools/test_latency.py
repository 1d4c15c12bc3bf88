"""The latency benchmark, benchmarks/latency.py: its `--quick` run (one tiny T2T-ViT, eager and ONNX Runtime, each in
processes of its own) writes a CSV with every column and sane values; its ratios divide by the baseline on the same
path; the T2T-ViT stages it profiles compute the model."""
import importlib.util, time

import pytest

from tests.support.commands import REPO, run

pytest.importorskip('onnxruntime', reason='the ONNX Runtime paths need the export extra (onnx, onnxruntime)')
spec = importlib.util.spec_from_file_location('latency', REPO / 'benchmarks' / 'latency.py')
latency = importlib.util.module_from_spec(spec); spec.loader.exec_module(latency)


def test_quick_run_writes_the_csv(tmp_path):
    out = tmp_path / 'latency.csv'
    t0 = time.perf_counter()
    p = run(['benchmarks/latency.py', '--quick', '--csv', str(out)], timeout=120)
    took = time.perf_counter() - t0
    assert p.returncode == 0, p.stderr
    assert 'CPU: ' in p.stdout and 'threads' in p.stdout and 'native bf16: ' in p.stdout and f'wrote {out}' in p.stdout
    assert out.read_text().splitlines()[0].split(',') == latency.COLUMNS
    rows = latency.read_csv(out)
    assert [(r['model'], r['path'], r['status']) for r in rows] == [('t2t_tiny', 'eager', 'ok'), ('t2t_tiny', 'ort', 'ok')]
    for r in rows:
        assert r['img_size'] == 64 and r["params"] > 1e4 and r["macs"] > 1e6 and r['threads'] >= 1
        assert r['b1_runs'] >= 30 and r['b1_1t_runs'] >= 30
        for k in ('b1_median_ms', 'b1_1t_median_ms'): assert 0 < r[k] < 1000, (k, r[k])
        assert r['b1_p90_ms'] >= r['b1_median_ms'] and r['b1_1t_p90_ms'] >= r['b1_1t_median_ms']
        assert r['b32_img_s'] > 1
        assert 10 < r['runtime_rss_mb'] <= r['peak_rss_mb'] <= r['peak_rss_b32_mb'] < 8000
    eager, ort = rows
    assert ort['prepare_s'] > 0 and ort['onnxruntime'] and eager['prepare_s'] == ''
    assert ort['runtime_rss_mb'] < eager['runtime_rss_mb']  # the ONNX Runtime worker never imports torch
    print(f"--quick took {took:.1f} s")


def test_ratios_divide_by_the_baseline_on_the_same_path():
    row = lambda m, p, ms: dict(model=m, path=p, status='ok', b1_median_ms=ms)
    rows = [row('a', 'eager', 10.), row('base', 'eager', 5.), row('a', 'ort', 3.), row('base', 'ort', 6.), row('a', 'bf16', 1.)]
    got = {(m, p): rs for m, p, rs in latency.ratios(rows, ['base'])}
    assert got == {('a', 'eager'): {'base': 2.}, ('base', 'eager'): {'base': 1.}, ('a', 'ort'): {'base': .5},
                   ('base', 'ort'): {'base': 1.}}  # no baseline on bf16: no ratio
    assert latency.sibling('runs/latency.csv', 'accuracy').as_posix() == 'runs/latency_accuracy.csv'


def test_t2t_stages_compute_the_model():
    import torch
    from t2t_course import create_model
    m = create_model('t2t_vit_7', embed_dim=32, depth=2, num_heads=2, token_dim=16, img_size=64).eval()
    x = torch.randn(2, 3, 64, 64)
    stages = latency.t2t_stages(m)
    assert [s[1] for s in stages].count('T2T module') == 6 and stages[-2][0] == 'block 2 (cls token only)'
    h = x
    with torch.no_grad():
        for _, _, _, fn in stages: h = fn(h)
        torch.testing.assert_close(h, m(x), atol=1e-5, rtol=1e-5)


def test_the_int8_file_is_the_librarys(tmp_path):
    "The `ort_int8` path's file is `quantize_onnx`'s (MatMul and Gemm only) of the fp32 export, with its report in the metadata."
    from t2t_course.deploy.export import read_onnx_metadata
    prep = latency.prepare_worker('t2t_tiny', str(tmp_path), ['ort', 'ort_int8'])
    assert prep['quantized_ops'].startswith('Gemm 1/1; MatMul ') and 'Conv' not in prep['quantized_ops'], prep
    q = read_onnx_metadata(prep['onnx_int8'])['quantization']
    assert q['op_types'] == ['MatMul', 'Gemm'] and q['checked_on'] == 2 and 'preprocessing' in read_onnx_metadata(prep['onnx_int8'])
