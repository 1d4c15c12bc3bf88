"""Ready for the first GPU run: the checks of issue 15 that run on a CPU (generators a sample load must not touch,
process-wide switches `train` must leave alone, DDP launches pinned to the CPU, T2T_REQUIRE_CUDA), and the NCCL test
for a GPU machine (marked `cuda`)."""
import json, os, subprocess, sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from support.warm import warm_run
from t2t_course.data import create_datasets, digits_folder
from t2t_course.train.distributed import SeededDataset
from t2t_course.data.pipelines import create_pipeline
from t2t_course.train.config import TrainConfig
from t2t_course.train import train

REPO = Path(__file__).resolve().parents[1]
TINY = dict(embed_dim=32, depth=1, num_heads=2, mlp_ratio=2., token_dim=16)


@pytest.mark.parametrize('pipeline', ['pil', 'draft', 'fast'])
def test_a_sample_load_never_reseeds_and_leaves_the_generator(pipeline, monkeypatch):
    "SeededDataset seeds only the CPU generator, inside fork_rng: no torch.manual_seed / cuda.manual_seed*, state restored."
    p = create_pipeline(pipeline, digits_folder(), 32, 'imagenet')  # the full recipe: every draw of a sample
    sds = SeededDataset(p.train, seed=3)
    calls = []
    for mod, name in [(torch, 'manual_seed'), (torch.random, 'manual_seed'), (torch.cuda, 'manual_seed'),
                      (torch.cuda, 'manual_seed_all'), (torch.cuda.random, 'manual_seed'), (torch.cuda.random, 'manual_seed_all')]:
        monkeypatch.setattr(mod, name, lambda *a, _n=f'{mod.__name__}.{name}', **k: calls.append(_n))
    torch.default_generator.manual_seed(123); torch.rand(7)
    before = torch.get_rng_state()
    a = sds[(2, 5)][0]
    assert torch.equal(torch.get_rng_state(), before) and calls == [], calls
    torch.rand(50)
    b = sds[(2, 5)][0]  # the same sample whatever was drawn before (fast: uint8 pixels and the erasing it drew)
    assert torch.equal(b, a) if torch.is_tensor(a) else (torch.equal(b[0], a[0]) and str(b[1]) == str(a[1]))


def test_train_leaves_cudnn_and_tf32_switches_as_they_were(tmp_path):
    "Process-wide switches are the command line's to set (`_gpu_switches`), not the library's."
    flags = lambda: (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                     torch.get_float32_matmul_precision())
    saved = flags()
    try:
        for values in [(True, True, False, 'medium'), (False, False, True, 'highest')]:
            torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = values[:3]
            torch.set_float32_matmul_precision(values[3])
            expected = flags()
            r = train(TrainConfig(epochs=1, img_size=16, model_kwargs=TINY, output=str(tmp_path / str(values[0])), progress=False))
            assert r.exit_code == 0 and flags() == expected, (flags(), expected)
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:3]
        torch.set_float32_matmul_precision(saved[3])


def test_every_cpu_ddp_launch_pins_the_cpu(monkeypatch, tmp_path):
    "The DDP runs of the tests and of chapter 18d's slow cell say device='cpu': on a GPU machine they must stay on gloo."
    sys.path.insert(0, str(REPO / 'tests'))
    from ddp_worker import config
    assert config(digits_folder(), '/tmp/unused', 4).device == 'cpu'
    cells = json.loads((REPO / 'nbs' / '18d_loop.ipynb').read_text())['cells']
    ddp = [''.join(c['source']) for c in cells if 'torch.distributed.run' in ''.join(c['source'])]
    assert ddp and all("device='cpu'" in src for src in ddp)
    import test_faults
    started = []
    class Popen:
        def __init__(self, cmd, **kw): started.append(cmd)
    monkeypatch.setattr(test_faults, 'WarmPopen', Popen)
    test_faults.two_processes('none', ['--epochs', '1'], tmp_path)  # the fault tests' launcher adds the device
    assert len(started) == 2 and all(c[c.index('--device') + 1] == 'cpu' for c in started), started


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks what a machine without CUDA does')
def test_require_cuda_turns_cuda_skips_into_failures():
    "T2T_REQUIRE_CUDA=1: a cuda test fails, naming the reason, instead of being skipped."
    test = 'tests/test_pipeline.py::test_gpu_pipeline_decodes_with_nvjpeg_and_falls_back'
    run = lambda env: warm_run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', test], cwd=REPO,
                               env=dict(os.environ, **env), capture_output=True, text=True, timeout=300)
    p = run({'T2T_REQUIRE_CUDA': '0'})
    assert p.returncode == 0 and '1 skipped' in p.stdout, p.stdout[-2000:]
    p = run({'T2T_REQUIRE_CUDA': '1'})
    assert p.returncode == 1 and 'T2T_REQUIRE_CUDA=1 but CUDA is not available' in p.stdout, p.stdout[-2000:]


@pytest.mark.cuda
def test_ddp_nccl_on_every_visible_gpu(tmp_path):
    "One process per visible GPU on NCCL: an all-reduce, a DDP step equal to the combined batch's, and (2+ GPUs) a train() run."
    sys.path.insert(0, str(REPO / 'tests'))
    from test_train import make_folder
    from nccl_worker import TINY as NTINY
    from t2t_course.models.t2t_vit import create_model
    from t2t_course.data import create_loss
    n = torch.cuda.device_count()
    folder = make_folder(tmp_path / 'data')
    p = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', str(n), '--master_port',
                        str(29600 + os.getpid() % 1000), 'tests/nccl_worker.py', str(folder), str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    got = torch.load(tmp_path / 'nccl.pt', weights_only=False)
    assert got['world'] == n
    torch.manual_seed(0)
    model = create_model('t2t_vit_7', num_classes=4, img_size=16, **NTINY)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2 * n, 3, 16, 16, generator=g), torch.randint(0, 4, (2 * n,), generator=g)
    create_loss(True, 0.1)(model(x), F.one_hot(y, 4).float()).backward()
    for name, prm in model.named_parameters(): torch.testing.assert_close(got['grads'][name], prm.grad, rtol=1e-4, atol=1e-5)


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


def _count_reads(monkeypatch):
    "Count the calls that copy a tensor's value to the host (each one a wait for the GPU there)."
    reads = []
    for name in ('item', 'tolist', '__bool__', '__float__', '__int__'):
        orig = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=orig, _n=name, **k: (reads.append(_n), _o(self, *a, **k))[1])
    return reads


def test_ema_update_reads_nothing_back(monkeypatch):
    "ModelEma keeps its update count on the host and its parameter lists cached: an update never waits for the device."
    from t2t_course.models.t2t_vit import create_model
    from t2t_course.train.optim import ModelEma
    model = create_model('t2t_vit_7', num_classes=3, img_size=32, **TINY)
    ema = ModelEma(model, 0.99)
    ema.update_parameters(model)
    pairs = ema._pairs
    reads = _count_reads(monkeypatch)
    for _ in range(3): ema.update_parameters(model)
    monkeypatch.undo()
    assert reads == [] and ema._pairs is pairs and ema.num_updates == 4 and isinstance(ema.num_updates, int)


def test_evaluate_reads_the_counts_once(monkeypatch):
    "evaluate sums loss, hits and the image count on the device and brings them to the host once, at the end."
    from t2t_course.data import Batch
    from t2t_course.train.evaluate import evaluate
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 7))
    loader = [Batch(torch.randn(5, 3, 2, 2), torch.randint(0, 7, (5,)), []) for _ in range(4)]
    reads = _count_reads(monkeypatch)
    m = evaluate(net, loader, torch.device('cpu'))
    monkeypatch.undo()
    assert reads == ['tolist'] and m['n'] == 20, reads
