"""The GPU benchmark, benchmarks/gpu_train.py, on the CPU: its smoke run prints images per second, MFU and the loader's
rate per worker, and stops with a clear message without CUDA; it tells an H200 NVL from an SXM one (peak TFLOPS) and
reports both batch sizes."""
import sys

import torch

from tests.support.commands import REPO, run
from tests.support.warm import warm_run


def test_gpu_benchmark_smoke_on_cpu():
    p = run(['benchmarks/gpu_train.py', '--device', 'cpu', '--smoke'], timeout=120)
    assert p.returncode == 0, p.stderr
    assert 'img/s' in p.stdout and 'MFU' in p.stdout and 'per worker' in p.stdout
    if not torch.cuda.is_available():
        p = run(['benchmarks/gpu_train.py'], timeout=60)
        assert p.returncode == 2 and 'needs a CUDA GPU' in p.stderr


def test_gpu_benchmark_tells_nvl_from_sxm_and_reports_both_batches():
    sys.path.insert(0, str(REPO / 'benchmarks'))
    from gpu_train import peak_tflops
    assert peak_tflops('NVIDIA H200') == ('H200', 989.4) and peak_tflops('NVIDIA H200 NVL') == ('H200 NVL', 835.0)
    assert peak_tflops('NVIDIA H100 NVL')[1] == 835.0 and peak_tflops('NVIDIA H100 PCIe')[1] == 756.0
    assert peak_tflops('NVIDIA L40S')[0] == 'L40S' and peak_tflops('Tesla T4') == (None, None)
    p = warm_run([sys.executable, 'benchmarks/gpu_train.py', '--device', 'cpu', '--smoke'], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert 'device: CPU' in p.stdout and 'train batch    2' in p.stdout and 'train batch    4' in p.stdout
    assert "'plain': batches on the host, not pinned" in p.stdout and 'pinned + copy' in p.stdout and 'plain:' in p.stdout
