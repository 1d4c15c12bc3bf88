"""The whole-model benchmark, benchmarks/models.py: the GEMM share it prints (a model's FLOP/s over a square matmul's,
in one run) and its profile by operator kind, on a small model at 64 px; every operator's kind."""
import importlib.util, re

import pytest

from tests.support.commands import REPO, run

spec = importlib.util.spec_from_file_location('models_benchmark', REPO / 'benchmarks' / 'models.py')
bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)


def test_operator_kinds():
    kinds = {op: bench.op_kind(f'aten::{op}') for op in ('addmm', 'mm', 'bmm', '_scaled_dot_product_flash_attention_for_cpu',
                                                         '_softmax', 'native_layer_norm', 'gelu', 'copy_', 'cat', 'add', 'view')}
    assert kinds == {'addmm': 'GEMM', 'mm': 'GEMM', 'bmm': 'GEMM', '_scaled_dot_product_flash_attention_for_cpu': 'attention',
                     '_softmax': 'attention', 'native_layer_norm': 'normalisation', 'gelu': 'activation',
                     'copy_': 'gather/copy', 'cat': 'gather/copy', 'add': 'other', 'view': 'other'}


def test_gemm_share_and_profile_of_a_small_model():
    r = bench.gemm_share('t2t_vit_7', batch=2, size=64, gemm_n=256, rounds=2)
    assert r['macs'] > 1e7 and r['model_s'] > 0 and r['gemm_flops'] > 1e8
    assert abs(r['share'] - r['model_flops'] / r['gemm_flops']) < 1e-9 and 0 < r['share'] < 5
    assert 0 < r['matmul_share'] <= r['share']  # the matmuls run are fewer FLOPs than every MAC counted
    assert set(r['run_flops']) == {'GEMM', 'attention'} and r['run_flops']['GEMM'] > r['run_flops']['attention'] > 0
    prof = bench.op_profile('t2t_vit_7', batch=2, size=64, calls=1)
    assert tuple(prof) == bench.KINDS and abs(sum(s for _, s, _ in prof.values()) - 1) < 1e-6
    assert prof['GEMM'][1] > 0.1 and prof['normalisation'][1] > 0 and prof['activation'][1] > 0, prof


def test_share_only_prints_the_share_and_the_profile():
    p = run(['benchmarks/models.py', '--share-only', '--model', 't2t_vit_7', '--img-size', '64', '--gemm-size', '256',
             '--batch-size', '2', '--rounds', '2'], timeout=300)
    assert p.returncode in (0, 1), p.stderr  # 1: the share is under its goal (a small model at 64 px is far from it)
    out = p.stdout
    assert re.search(r'square float32 matmul 256 x 256: +[\d.]+ GFLOP/s', out), out
    assert re.search(r'share \d\.\d\d \(required >= 0\.88\)  (PASS|FAIL)', out), out
    for kind in bench.KINDS: assert re.search(rf'\n +{re.escape(kind)} +[\d.]+%', out), (kind, out)
    assert re.search(r"as a share of the matmul's\): GEMM \d\.\d\d, attention \d\.\d\d", out), out
    assert re.search(r'the share would be \d\.\d\d', out), out


@pytest.mark.slow
def test_the_compiled_path_is_timed_beside_the_default_one():
    "--compile: the same model under torch.compile (freezing) in the same rounds, the same logits to float tolerance."
    r = bench.gemm_share('t2t_vit_7', batch=1, size=32, gemm_n=128, rounds=2, compiled=True)
    assert 'compile_error' not in r, r
    assert r['compiled_diff'] < 1e-4 and r['compiled_s'] > 0 and r['compile_s'] > 0
    assert abs(r['compiled_share'] / r['share'] - r['model_s'] / r['compiled_s']) < 1e-9
