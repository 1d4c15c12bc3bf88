"""CPU latency of T2T-ViT where it is deployed: ten models at 224 px on five inference paths, beside MobileNetV2, ResNets and DeiT.

    python benchmarks/latency.py                       # 10 models x 5 paths (tens of minutes; see the guide)
    python benchmarks/latency.py --quick               # one tiny T2T-ViT, eager and ONNX Runtime: a smoke run (~15 s)
    python benchmarks/latency.py --models t2t_vit_7,mobilenet_v2 --paths eager,ort
    python benchmarks/latency.py --accuracy --profile  # also: top-1 after int8 and bf16, and T2T-ViT-14's stages

Models (random weights; latency does not depend on their values), at 224 px, 1000 classes:
- T2T-ViT-7, 10, 12, 14 and T2T-ViT_t-14 (`t2t_course.create_model`);
- the course's ViT baseline (`create_model('vit_baseline', ...)`, a `t2t_course.models.backbone.ViT`: patch 16, MLP
  ratio 4, qkv_bias=True as DeiT) at DeiT-Tiny's shape (D 192, 12 blocks, 3 heads) and DeiT-Small's (D 384, 12
  blocks, 6 heads);
- torchvision's mobilenet_v2, resnet18 and resnet50 (`weights=None`: nothing is downloaded).

Paths:
- `eager`:    PyTorch eager, fp32, the library's default fast paths (SDPA, the one-copy soft split, cls-only last block);
- `compile`:  `torch.compile(model, dynamic=False)` of the same model (one static graph per batch size);
- `ort`:      ONNX Runtime fp32 on an ONNX file from `t2t_course.deploy.export_onnx` (dynamic batch, height, width;
              torchvision's models through the same `torch.onnx.export` call);
- `ort_int8`: that file quantized by `t2t_course.deploy.quantize_onnx` (what `export_onnx(..., quantize='int8')` does:
              onnxruntime's `quantize_dynamic` on MatMul and Gemm, int8 weights, activations quantized on the fly;
              convolutions stay float, as ONNX Runtime's ConvInteger is slower than its float Conv on a CPU); the CSV's
              `quantized_ops` says which operators it replaced (e.g. `Gemm 1/1; MatMul 68/104`);
- `bf16`:     PyTorch eager with the model and input in bfloat16 (`.to(torch.bfloat16)`), measured only where the CPU
              has native bf16 matrix units (avx512_bf16 or amx_bf16 in /proc/cpuinfo; `--force-bf16` measures anyway).

How it measures. Every (model, path) runs in a fresh Python process of its own (a torch process, or for the ONNX
Runtime paths a process that imports only onnxruntime and NumPy, as a deployed server would), after a preparing
process has counted the model's parameters and MACs (`count_macs`) and written its ONNX files. In that process:
1. build or load the model, then one call: `startup_s` (for `compile`, the compilation; inductor's cache is a fresh
   folder, so it is a cold compile);
2. batch 1 on all the cores this process may use (`os.sched_getaffinity`): `--warmup` calls, then at least `--runs`
   timed calls and at least `--min-time` seconds of them; the median and the 90th percentile (ms);
3. peak memory: the process's resident-set high-water mark (VmHWM) after those batch-1 calls, interpreter and
   runtime included (`peak_rss_mb`), and `runtime_rss_mb`, the resident size once the runtime was imported, before
   the model was built, so that `peak_rss_mb - runtime_rss_mb` is what the model and its calls added;
4. throughput at batch 32 on all cores: one warm-up call and `--tp-runs` timed calls, images per second from their
   median, and the high-water mark after them (`peak_rss_b32_mb`);
5. batch 1 on one thread, timed as in 2 (`torch.set_num_threads(1)`, or a one-thread ONNX Runtime session). For
   `compile` this is a separate process, compiled at one thread, because inductor's kernels keep the thread count
   they were compiled with.
The workers inherit your environment (OMP_*, MALLOC_*, ...), so what you set for a deployment applies. Run it on a
quiet machine: other work on the same cores shows up in every number.

Output: the CPU's name and thread count, a table, each model's batch-1 time as a ratio to the baselines' on the same
path in the same run (`--baselines`, default MobileNetV2 and DeiT-Small), and a CSV (`--csv`). `--accuracy` adds the
top-1 of three trained models of chapter 20's study (fp32 against ONNX int8 and bf16) on their validation digits
(`<csv>_accuracy.csv`), `--profile` T2T-ViT-14's batch-1 time stage by stage (`<csv>_profile.csv`).
"""
import argparse, csv, importlib.util, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec('t2t_course') is None: sys.path.insert(0, str(ROOT))  # run from a checkout, not installed
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helper beside this script
from _machine import cpu_flags, cpu_name  # noqa: E402
PATHS = ('eager', 'compile', 'ort', 'ort_int8', 'bf16')
ORT_PATHS = ('ort', 'ort_int8')
BF16_FLAGS = ('avx512_bf16', 'amx_bf16')

# ---------------------------------------------------------------- the models
# name: (label, family, how to build it). T2T-ViT's ImageNet top-1 is its registry's (the T2T-ViT paper's figures),
# torchvision's comes from its weights metadata, DeiT's from the DeiT paper.
MODELS = {
    't2t_vit_7':    ('T2T-ViT-7', 'T2T-ViT', dict(t2t='t2t_vit_7')),
    't2t_vit_10':   ('T2T-ViT-10', 'T2T-ViT', dict(t2t='t2t_vit_10')),
    't2t_vit_12':   ('T2T-ViT-12', 'T2T-ViT', dict(t2t='t2t_vit_12')),
    't2t_vit_14':   ('T2T-ViT-14', 'T2T-ViT', dict(t2t='t2t_vit_14')),
    't2t_vit_t_14': ('T2T-ViT_t-14', 'T2T-ViT', dict(t2t='t2t_vit_t_14')),
    'deit_tiny':    ('DeiT-Ti', 'ViT/DeiT', dict(t2t='vit_baseline', kwargs=dict(embed_dim=192, depth=12, num_heads=3))),
    'deit_small':   ('DeiT-S', 'ViT/DeiT', dict(t2t='vit_baseline', kwargs=dict(embed_dim=384, depth=12, num_heads=6))),
    'mobilenet_v2': ('MobileNetV2', 'CNN', dict(torchvision='mobilenet_v2')),
    'resnet18':     ('ResNet-18', 'CNN', dict(torchvision='resnet18')),
    'resnet50':     ('ResNet-50', 'CNN', dict(torchvision='resnet50')),
}
DEFAULT_MODELS = tuple(MODELS)
# --quick's model: a T2T-ViT-7 cut to one block of width 32 at 64 px (the whole pipeline in seconds)
MODELS['t2t_tiny'] = ('T2T-ViT tiny (test)', 'T2T-ViT', dict(t2t='t2t_vit_7', img_size=64,
                      kwargs=dict(embed_dim=32, depth=1, num_heads=2, token_dim=16)))
DEIT_TOP1 = {'deit_tiny': 72.2, 'deit_small': 79.8}  # DeiT paper (Touvron et al. 2021, arXiv:2012.12877), without distillation
TORCHVISION_WEIGHTS = 'IMAGENET1K_V1'                  # the original recipe's weights (the papers' ResNets and MobileNetV2)

# timm's published CPU batch-1 times (ms): i7-12700H, PyTorch 2.4, torch.compile, fp32, NCHW, batch 1, 224 px.
# huggingface/pytorch-image-models, results/benchmark-infer-fp32-nchw-pt240-cpu-i7_12700h-dynamo.csv, infer_step_time.
TIMM_CPU_MS = {'mobilenet_v2': ('mobilenetv2_100', 6.591), 'resnet18': ('resnet18', 16.046),
               'resnet50': ('resnet50', 32.78), 'deit_tiny': ('deit_tiny_patch16_224', 12.931),
               'deit_small': ('deit_small_patch16_224', 34.032)}
TIMM_CPU_SOURCE = 'timm results/benchmark-infer-fp32-nchw-pt240-cpu-i7_12700h-dynamo.csv (i7-12700H, torch.compile, fp32, batch 1)'

COLUMNS = ['model', 'label', 'family', 'path', 'status', 'img_size', 'params', 'macs', 'paper_top1', 'top1_source',
           'threads', 'b1_median_ms', 'b1_p90_ms', 'b1_runs', 'b1_1t_median_ms', 'b1_1t_p90_ms', 'b1_1t_runs',
           'b32_img_s', 'runtime_rss_mb', 'peak_rss_mb', 'peak_rss_b32_mb', 'startup_s', 'prepare_s',
           'quantized_ops', 'cpu', 'torch', 'onnxruntime']
ACCURACY_COLUMNS = ['model', 'variant', 'path', 'top1', 'delta_top1', 'agree_fp32', 'n_images', 'max_logit_diff',
                    'quantized_ops']
PROFILE_COLUMNS = ['model', 'threads', 'stage', 'part', 'tokens', 'macs', 'median_ms', 'runs']


def build(name:str):
    "The model `name` of MODELS, in eval mode with random weights (seed 0), and its input size."
    import torch
    torch.manual_seed(0)
    spec = MODELS[name][2]
    size = spec.get('img_size', 224)
    if 't2t' in spec:  # a T2T-ViT, or the ViT baseline (`models.backbone.ViT`: patch 16, MLP ratio 4, qkv_bias as DeiT)
        from t2t_course import create_model
        return create_model(spec['t2t'], img_size=size, **spec.get('kwargs', {})).eval(), size
    import torchvision
    return getattr(torchvision.models, spec['torchvision'])(weights=None).eval(), size


def paper_top1(name:str) -> tuple:
    "(ImageNet top-1 %, where it comes from) of a model of MODELS, or (None, '') where there is none."
    spec = MODELS[name][2]
    if name in DEIT_TOP1: return DEIT_TOP1[name], 'DeiT paper (arXiv:2012.12877), no distillation'
    if 'torchvision' in spec:
        from torchvision.models import get_model_weights
        w = get_model_weights(spec['torchvision'])[TORCHVISION_WEIGHTS]
        return round(w.meta['_metrics']['ImageNet-1K']['acc@1'], 2), f'torchvision {w}'
    if 't2t' in spec and not spec.get('kwargs'):  # a registered T2T-ViT as released
        from t2t_course.models.t2t_vit import get_variant
        return get_variant(spec['t2t']).top1, 'T2T-ViT paper (arXiv:2101.11986), the registry\'s top1'
    return None, ''


# ---------------------------------------------------------------- the machine
def native_bf16() -> list:
    "The native bf16 matrix features this CPU has (avx512_bf16, amx_bf16); empty: none."
    return [f for f in BF16_FLAGS if f in cpu_flags()]


def all_threads() -> int:
    "The cores this process may run on."
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()


def _status_mb(field:str):
    "VmRSS or VmHWM of this process in MB (None where /proc is missing)."
    try:
        for line in open('/proc/self/status'):
            if line.startswith(field + ':'): return int(line.split()[1]) / 1024
    except OSError: return None


# ---------------------------------------------------------------- timing
def time_calls(call, runs:int=30, warmup:int=5, min_time:float=1.0) -> list:
    "Wall times (s) of `call()` after `warmup` untimed calls: at least `runs` calls and at least `min_time` seconds."
    for _ in range(warmup): call()
    times, start = [], time.perf_counter()
    while len(times) < runs or (time.perf_counter() - start < min_time and len(times) < 20 * runs):
        t0 = time.perf_counter(); call(); times.append(time.perf_counter() - t0)
    return times


def summary_ms(times:list) -> tuple:
    "(median, 90th percentile) in ms."
    ms = sorted(t * 1e3 for t in times)
    return statistics.median(ms), statistics.quantiles(ms, n=10, method='inclusive')[8]


# ---------------------------------------------------------------- inside a worker process
def _torch_runner(name:str, path:str, threads:int):
    "For a torch path: `make(batch)` -> a no-argument call running one batch."
    import torch
    torch.set_num_threads(threads)
    model, size = build(name)
    dtype = torch.float32
    if path == 'bf16': model, dtype = model.to(torch.bfloat16), torch.bfloat16
    fn = torch.compile(model, dynamic=False) if path == 'compile' else model
    def make(batch):
        x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0)).to(dtype)
        def call():
            with torch.inference_mode(): fn(x)
        return call
    def set_threads(n): torch.set_num_threads(n)
    return make, set_threads


def _ort_runner(name:str, onnx_path:str, threads:int, size:int):
    "For an ONNX Runtime path: `make(batch)` -> a call, and `set_threads(n)`: a new session with n threads."
    import numpy as np, onnxruntime as ort
    state = {}
    def session(n):
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = n, 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        state.pop('s', None)  # the old session goes first: one session's memory at a time
        state['s'] = ort.InferenceSession(onnx_path, so, providers=['CPUExecutionProvider'])
    session(threads)
    def make(batch):
        x = np.random.default_rng(0).standard_normal((batch, 3, size, size), dtype=np.float32)
        return lambda: state['s'].run(None, {'image': x})
    return make, session


def measure_worker(model:str, path:str, threads:int, all_cores:bool=True, one_thread:bool=True, batch:int=32, runs:int=30,
                   warmup:int=5, min_time:float=1.0, tp_runs:int=3, onnx_path:str=None, size:int=224) -> dict:
    "One (model, path) in this process: startup, then on `threads` batch-1 times, peak memory and throughput; then one thread."
    out = dict(threads=threads)
    for module in (['onnxruntime'] if path in ORT_PATHS else ['torch', 't2t_course']):  # no torch in an ONNX Runtime worker
        importlib.import_module(module)
    out['runtime_rss_mb'] = _status_mb('VmRSS')
    t0 = time.perf_counter()
    make, set_threads = (_ort_runner(model, onnx_path, threads, size) if path in ORT_PATHS
                         else _torch_runner(model, path, threads))
    call = make(1); call()
    out['startup_s'] = time.perf_counter() - t0
    if all_cores:
        ts = time_calls(call, runs, warmup, min_time)
        out['b1_median_ms'], out['b1_p90_ms'] = summary_ms(ts); out['b1_runs'] = len(ts)
        out['peak_rss_mb'] = _status_mb('VmHWM')
        if batch:
            big = make(batch)
            tb = time_calls(big, tp_runs, 1, 0.)
            out['b32_img_s'] = batch / statistics.median(tb)
            out['peak_rss_b32_mb'] = _status_mb('VmHWM')
            del big
    if one_thread:
        if threads != 1: set_threads(1); call = make(1)
        ts = time_calls(call, runs, warmup, min_time)
        out['b1_1t_median_ms'], out['b1_1t_p90_ms'] = summary_ms(ts); out['b1_1t_runs'] = len(ts)
    return out


def export(model, path, size:int) -> Path:
    "The library's `export_onnx`, for the course's models and torchvision's alike (these have no `default_cfg`)."
    from t2t_course.deploy import export_onnx
    return export_onnx(model, path, img_size=size)


def quantize(fp32_path, int8_path, images=None) -> dict:
    "The library's int8 file (`quantize_onnx`: MatMul and Gemm) of an fp32 one; its report, with `ops` as 'Gemm 1/1; MatMul 68/104'."
    from t2t_course.deploy import quantize_onnx
    report = quantize_onnx(fp32_path, int8_path, images=images)
    return report | dict(ops='; '.join(f'{op} {n}' for op, n in report['replaced'].items()) or 'none')


def prepare_worker(model:str, workdir:str, paths:list) -> dict:
    "Parameters, MACs and paper top-1 of `model`; its ONNX files (fp32, int8) in `workdir` when `paths` need them."
    import torch
    from t2t_course.models.backbone import count_macs
    m, size = build(model)
    top1, source = paper_top1(model)
    out = dict(img_size=size, params=sum(p.numel() for p in m.parameters()), macs=count_macs(m, size)['total'],
               paper_top1=top1, top1_source=source, torch=torch.__version__.split('+')[0])
    if set(paths) & set(ORT_PATHS):
        import onnxruntime
        t0 = time.perf_counter()
        fp32 = export(m, Path(workdir) / f'{model}.onnx', size)
        out['onnx'], out['export_s'], out['onnxruntime'] = str(fp32), time.perf_counter() - t0, onnxruntime.__version__
        if 'ort_int8' in paths:
            t0 = time.perf_counter()
            out['onnx_int8'] = str(Path(workdir) / f'{model}.int8.onnx')
            out['quantized_ops'] = quantize(fp32, out['onnx_int8'], images=torch.randn(2, 3, size, size))['ops']
            out['quantize_s'] = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------- where T2T-ViT's time goes
def t2t_stages(model) -> list:
    "T2T-ViT's forward as named stages [(stage, part, module, fn)]: chained, `fn`s compute `model(x)` on the fast path."
    import torch
    import torch.nn as nn
    from t2t_course.core import image_size
    from t2t_course.models.soft_split import soft_split_fast
    t2t, grid = model.tokens_to_token, {}
    s0, s1, s2 = t2t.soft_split0, t2t.soft_split1, t2t.soft_split2
    def split0(x):                                                         # (B, 3, H, W) -> (B, H0*W0, 3*7*7)
        grid['g0'] = s0.output_size(image_size(x)); grid['g1'] = s1.output_size(grid['g0'])
        return soft_split_fast(x, s0.kernel_size, s0.stride, s0.padding)
    def split(s, g):                                                       # (B, h*w, c) -> (B, h'*w', c*3*3)
        return lambda x: soft_split_fast(x.reshape(x.shape[0], *grid[g], x.shape[-1]), s.kernel_size, s.stride, s.padding, True)
    def cls_pos(x):                                                        # (B, N, D) -> (B, N+1, D)
        x = torch.cat((model.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        return x + model.position_table(x.shape[1])
    last = len(model.blocks) - 1
    stages = [('soft split 0 (7x7, stride 4)', 'T2T module', nn.Identity(), split0),
              ('T2T layer 1', 'T2T module', t2t.attention1, t2t.attention1),
              ('soft split 1 (3x3, stride 2)', 'T2T module', nn.Identity(), split(s1, 'g0')),
              ('T2T layer 2', 'T2T module', t2t.attention2, t2t.attention2),
              ('soft split 2 (3x3, stride 2)', 'T2T module', nn.Identity(), split(s2, 'g1')),
              ('projection to D', 'T2T module', t2t.project, t2t.project),
              ('cls token + positions', 'backbone', nn.Identity(), cls_pos)]
    for i, blk in enumerate(model.blocks):
        cls_only = i == last and model.cls_only_last_block
        stages.append((f'block {i + 1}' + (' (cls token only)' if cls_only else ''), 'backbone', blk,
                       blk.forward_cls if cls_only else blk))
    stages.append(('norm + head', 'head', nn.ModuleList([model.norm, model.head]), lambda x: model.forward_head(model.norm(x))))
    return stages


class _Stage:
    "A stage as a module for `count_macs` (its module's LayerNorms are counted)."
    def __new__(cls, module, fn):
        import torch.nn as nn
        class Stage(nn.Module):
            def __init__(self): super().__init__(); self.inner = module
            def forward(self, x): return fn(x)
        return Stage()


def profile_worker(model:str='t2t_vit_14', threads:int=0, runs:int=30, warmup:int=5) -> list:
    "Batch-1 time of each stage of `model` (eager, fp32), the median of `runs` forwards, on `threads` and on one thread."
    import torch
    from t2t_course.models.backbone import count_macs
    m, size = build(model)
    stages = t2t_stages(m)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    inputs, outputs, h = [], [], x
    with torch.inference_mode():
        for _, _, _, fn in stages: inputs.append(h); h = fn(h); outputs.append(h)
        if not torch.allclose(h, m(x), atol=1e-4): raise RuntimeError('the stages do not compute the model')
    macs = [count_macs(_Stage(mod, fn), inputs=i, fake=False)['total'] for (_, _, mod, fn), i in zip(stages, inputs)]
    rows = []
    for n in [threads or all_threads(), 1]:
        torch.set_num_threads(n)
        times = [[] for _ in stages]
        with torch.inference_mode():
            for r in range(warmup + runs):
                h = x
                for k, (_, _, _, fn) in enumerate(stages):
                    t0 = time.perf_counter(); h = fn(h); dt = time.perf_counter() - t0
                    if r >= warmup: times[k].append(dt)
        for (stage, part, _, _), o, mc, ts in zip(stages, outputs, macs, times):
            rows.append(dict(model=model, threads=n, stage=stage, part=part, tokens=o.shape[1],  # the tokens it outputs
                             macs=mc, median_ms=statistics.median(ts) * 1e3, runs=len(ts)))
        if n == 1: break
    return rows


# ---------------------------------------------------------------- accuracy after int8 and bf16
ACCURACY_MODELS = ('t2t_64', 'vit_64', 'resnet_16')   # the three models chapter 21 draws, seed 0 of chapter 20's grid
STUDY = ROOT / 'nbs' / 'study' / 'claims'


def trained_model(label:str, seed:int=0, study=STUDY):
    "A model of chapter 20's claims grid with its committed weights, built from its results row; and the row."
    from t2t_course import create_model
    from t2t_course.study import read_results
    row = next(r for r in read_results(Path(study) / 'results.csv') if r['model'] == label and r['seed'] == seed)
    m = create_model(row['variant'], pretrained=Path(study) / 'checkpoints' / f'{label}_seed{seed}.pth', num_classes=10,
                     img_size=row['img_size'], **json.loads(row['model_kwargs']))
    return m.eval(), row


def accuracy_worker(labels=ACCURACY_MODELS, workdir:str=None, batch:int=256) -> list:
    "Top-1 of each trained model on the validation digits: fp32 eager, bf16 eager, ONNX Runtime fp32 and int8."
    import logging
    import numpy as np, torch
    import onnxruntime as ort
    from t2t_course.data import create_datasets, data_root
    workdir = Path(workdir or tempfile.mkdtemp(prefix='t2t_latency_acc_'))
    logging.getLogger().setLevel(logging.ERROR)
    rows = []
    for label in labels:
        model, row = trained_model(label)
        size = row['img_size']
        _, val = create_datasets(data_root(row['data']), size, 'digits')
        loader = torch.utils.data.DataLoader(val, batch_size=batch, shuffle=False)
        xs, ys = zip(*loader)
        y = torch.cat(ys)
        fp32 = export(model, workdir / f'{label}.onnx', size)
        int8 = workdir / f'{label}.int8.onnx'
        ops = quantize(fp32, int8, images=xs[0][:8])['ops']
        def ort_logits(p):
            s = ort.InferenceSession(str(p), providers=['CPUExecutionProvider'])
            return torch.from_numpy(np.concatenate([s.run(None, {'image': x.numpy()})[0] for x in xs]))
        with torch.inference_mode():
            ref = torch.cat([model(x) for x in xs])
            bf = model.to(torch.bfloat16)
            logits = {'fp32': ref, 'bf16': torch.cat([bf(x.bfloat16()).float() for x in xs]),
                      'ort': ort_logits(fp32), 'ort_int8': ort_logits(int8)}
        top_ref = (ref.argmax(1) == y).float().mean().item() * 100
        for path, lg in logits.items():
            top1 = (lg.argmax(1) == y).float().mean().item() * 100
            rows.append(dict(model=label, variant=row['variant'], path=path, top1=top1, delta_top1=top1 - top_ref,
                             agree_fp32=(lg.argmax(1) == ref.argmax(1)).float().mean().item() * 100, n_images=len(y),
                             max_logit_diff=(lg - ref).abs().max().item(), quantized_ops=ops if path == 'ort_int8' else ''))
    return rows


# ---------------------------------------------------------------- driver
def _spawn(fn:str, env:dict=None, **kw):
    "Run the worker `fn(**kw)` in a fresh Python process; its JSON result."
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), '--worker', json.dumps(dict(fn=fn, kw=kw))],
                         capture_output=True, text=True, env={**os.environ, **(env or {})})
    if res.returncode: raise RuntimeError(f"latency worker {fn}({kw}) failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def measure(model:str, path:str, prep:dict, workdir:Path, threads:int, **kw) -> dict:
    "One (model, path): its worker process (two for `compile`: all cores, then compiled again at one thread)."
    onnx = {'ort': prep.get('onnx'), 'ort_int8': prep.get('onnx_int8')}.get(path)
    if path != 'compile': return _spawn('measure_worker', model=model, path=path, threads=threads, onnx_path=onnx,
                                        size=prep['img_size'], **kw)
    cache = lambda t: {'TORCHINDUCTOR_CACHE_DIR': str(workdir / f'inductor_{model}_{t}')}  # a cold compile each time
    out = _spawn('measure_worker', env=cache(threads), model=model, path=path, threads=threads, one_thread=False, **kw)
    one = _spawn('measure_worker', env=cache(1), model=model, path=path, threads=1, all_cores=False, **kw)
    return out | {k: v for k, v in one.items() if k.startswith('b1_1t')}


def run(models=DEFAULT_MODELS, paths=PATHS, threads:int=0, workdir=None, force_bf16:bool=False, verbose:bool=True,
        **kw) -> list:
    "Measure every (model, path), each in processes of its own; one CSV row (a dict of COLUMNS) each."
    threads = threads or all_threads()
    bf16 = native_bf16()
    workdir = Path(workdir or tempfile.mkdtemp(prefix='t2t_latency_'))
    rows, cpu = [], cpu_name()
    for model in models:
        t0 = time.perf_counter()
        prep = _spawn('prepare_worker', model=model, workdir=str(workdir), paths=list(paths))
        label, family, _ = MODELS[model]
        for path in paths:
            row = dict(model=model, label=label, family=family, path=path, status='ok', cpu=cpu,
                       **{k: prep.get(k) for k in ('img_size', 'params', 'macs', 'paper_top1', 'top1_source', 'torch')})
            if path in ORT_PATHS:
                row.update(onnxruntime=prep['onnxruntime'],
                           prepare_s=prep['export_s'] + (prep['quantize_s'] if path == 'ort_int8' else 0))
                if path == 'ort_int8': row['quantized_ops'] = prep['quantized_ops']
            if path == 'bf16' and not bf16 and not force_bf16:
                row['status'] = f"skipped: this CPU has no native bf16 ({' / '.join(BF16_FLAGS)} absent)"
            else:
                row.update(measure(model, path, prep, workdir, threads, **kw))
            rows.append({c: row.get(c, '') for c in COLUMNS})
        if verbose: print(f"  measured {model} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return rows


def _f(v, fmt):
    return format(v, fmt) if isinstance(v, (int, float)) and v != '' else '-'


def table(rows) -> str:
    "The measurements as a text table: one line per (model, path)."
    out = [f"{'model':<14} {'path':<9} {'MACs':>6} {'b1 ms (p90)':>14} {'1 thread ms (p90)':>18} {'b32 img/s':>10} "
           f"{'peak MB':>8} {'b32 MB':>7} {'start s':>8}"]
    for r in rows:
        if r['status'] != 'ok':
            out.append(f"{r['model']:<14} {r['path']:<9} {r['status']}"); continue
        out.append(f"{r['model']:<14} {r['path']:<9} {r['macs'] / 1e9:>5.2f}G "
                   f"{_f(r['b1_median_ms'], '.1f'):>6} ({_f(r['b1_p90_ms'], '.1f'):>5})"
                   f" {_f(r['b1_1t_median_ms'], '.1f'):>9} ({_f(r['b1_1t_p90_ms'], '.1f'):>6})"
                   f" {_f(r['b32_img_s'], '.1f'):>10} {_f(r['peak_rss_mb'], '.0f'):>8} {_f(r['peak_rss_b32_mb'], '.0f'):>7}"
                   f" {_f(r['startup_s'], '.1f'):>8}")
    return '\n'.join(out)


def ratios(rows, baselines=('mobilenet_v2', 'deit_small'), column='b1_median_ms') -> list:
    "Each model's `column` divided by each baseline's on the same path: [(model, path, {baseline: ratio})]."
    by = {(r['model'], r['path']): r for r in rows if r['status'] == 'ok' and r[column] != ''}
    out = []
    for (model, path), r in by.items():
        rs = {b: r[column] / by[b, path][column] for b in baselines if (b, path) in by}
        if rs: out.append((model, path, rs))
    return out


def ratio_table(rows, baselines=('mobilenet_v2', 'deit_small')) -> str:
    "Batch-1 time against each baseline on the same path, on all cores and on one thread."
    all_c, one = ({(m, p): rs for m, p, rs in ratios(rows, baselines, c)} for c in ('b1_median_ms', 'b1_1t_median_ms'))
    head = ' '.join(f"{'/ ' + b + ' (1 thread)':>30}" for b in baselines)
    out = [f"{'model':<14} {'path':<9} {head}"]
    for (m, p), rs in all_c.items():
        out.append(f"{m:<14} {p:<9} " + ' '.join(
            f"{rs[b]:>17.2f}x ({one.get((m, p), {}).get(b, float('nan')):>5.2f}x)   " for b in baselines if b in rs))
    return '\n'.join(out)


def write_csv(rows, path, columns) -> Path:
    "Rows (dicts) to a CSV file with these columns, its folder made."
    path = Path(path); path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction='ignore'); w.writeheader(); w.writerows(rows)
    return path


def read_csv(path) -> list:
    "A CSV this script wrote, numbers as numbers (empty cells stay '')."
    def num(v):
        try: return int(v)
        except ValueError:
            try: return float(v)
            except ValueError: return v
    with open(path, newline='') as f: return [{k: num(v) for k, v in r.items()} for r in csv.DictReader(f)]


def sibling(csv_path, suffix:str) -> Path:
    "`runs/latency.csv` -> `runs/latency_<suffix>.csv`: where the accuracy and profile rows go."
    p = Path(csv_path)
    return p.with_name(f'{p.stem}_{suffix}{p.suffix}')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], epilog=__doc__.split('\n\n', 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--models', default=','.join(DEFAULT_MODELS), help=f"comma-separated, from: {', '.join(MODELS)} (default: the first 10)")
    p.add_argument('--paths', default=','.join(PATHS), help=f"comma-separated, from: {', '.join(PATHS)} (default: all)")
    p.add_argument('--baselines', default='mobilenet_v2,deit_small', help='models the ratios divide by (default: mobilenet_v2,deit_small)')
    p.add_argument('--threads', type=int, default=0, help='threads of the "all cores" measurements (default: every core this process may use)')
    p.add_argument('--runs', type=int, default=30, help='timed batch-1 calls, at least (default 30)')
    p.add_argument('--min-time', type=float, default=1.0, help='seconds of timed batch-1 calls, at least (default 1.0)')
    p.add_argument('--warmup', type=int, default=5, help='untimed calls before timing (default 5)')
    p.add_argument('--batch', type=int, default=32, help='batch of the throughput measurement; 0 skips it (default 32)')
    p.add_argument('--tp-runs', type=int, default=3, help='timed calls at that batch (default 3)')
    p.add_argument('--csv', default='runs/latency.csv', help='where to write the rows (default runs/latency.csv)')
    p.add_argument('--force-bf16', action='store_true', help='measure bf16 even where the CPU has no native bf16 units')
    p.add_argument('--accuracy', action='store_true', help='also: top-1 of three trained models, fp32 vs ONNX int8 and bf16 (<csv>_accuracy.csv)')
    p.add_argument('--profile', action='store_true', help="also: T2T-ViT-14's batch-1 time stage by stage (<csv>_profile.csv)")
    p.add_argument('--quick', action='store_true', help='one tiny T2T-ViT at 64 px, eager and ort: a smoke run of every measurement (~15 s)')
    p.add_argument('--worker', help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        job = json.loads(a.worker)
        fns = dict(measure_worker=measure_worker, prepare_worker=prepare_worker, profile_worker=profile_worker,
                   accuracy_worker=accuracy_worker)
        print(json.dumps(fns[job['fn']](**job['kw']))); return 0
    models, paths = a.models.split(','), a.paths.split(',')
    kw = dict(runs=a.runs, warmup=a.warmup, min_time=a.min_time, batch=a.batch, tp_runs=a.tp_runs)
    if a.quick:
        models, paths = ['t2t_tiny'], ['eager', 'ort']
        kw = dict(runs=30, warmup=3, min_time=0., batch=min(a.batch, 8), tp_runs=1)  # the smoke run's throughput at batch 8
    for m in models:
        if m not in MODELS: p.error(f"unknown model {m!r}: choose from {', '.join(MODELS)}")
    for q in paths:
        if q not in PATHS: p.error(f"unknown path {q!r}: choose from {', '.join(PATHS)}")
    baselines = [b for b in a.baselines.split(',') if b]
    threads, bf16 = a.threads or all_threads(), native_bf16()
    print(f"CPU: {cpu_name()}, {threads} threads (of {os.cpu_count()} logical CPUs); native bf16: "
          f"{', '.join(bf16) if bf16 else 'no (' + ' / '.join(BF16_FLAGS) + ' absent: the bf16 path is skipped)'}")
    print(f"{len(models)} models x {len(paths)} paths; batch 1: median and 90th percentile of at least {kw['runs']} "
          f"calls; throughput at batch {a.batch}; each (model, path) in a fresh process\n", flush=True)
    with tempfile.TemporaryDirectory(prefix='t2t_latency_') as work:
        rows = run(models, paths, threads, work, a.force_bf16, **kw)
        print(table(rows))
        if any(b in models for b in baselines):
            print("\nbatch-1 time against the baselines on the same path, all cores (one thread):")
            print(ratio_table(rows, [b for b in baselines if b in models]))
        int8 = {r['model']: r['quantized_ops'] for r in rows if r['path'] == 'ort_int8'}
        if int8:
            print('\nort_int8: operators quantize_dynamic replaced (replaced/in the fp32 graph):')
            for m, ops in int8.items(): print(f"  {m:<14} {ops}")
        out = write_csv(rows, a.csv, COLUMNS)
        print(f"\nwrote {out} ({len(rows)} rows)")
        if a.profile:
            prof = _spawn('profile_worker', model='t2t_vit_14', threads=threads, runs=a.runs, warmup=a.warmup)
            for n in sorted({r['threads'] for r in prof}, reverse=True):
                rs = [r for r in prof if r['threads'] == n]
                total = sum(r['median_ms'] for r in rs)
                parts = {}
                for r in rs: parts[r['part']] = parts.get(r['part'], 0) + r['median_ms']
                print(f"T2T-ViT-14 batch 1, {n} thread(s): {total:.1f} ms = " +
                      ', '.join(f"{k} {v:.1f} ms ({100 * v / total:.0f}%)" for k, v in parts.items()))
            print(f"wrote {write_csv(prof, sibling(a.csv, 'profile'), PROFILE_COLUMNS)}")
        if a.accuracy:
            acc = _spawn('accuracy_worker', workdir=work)
            for r in acc:
                print(f"  {r['model']:<10} {r['path']:<9} top-1 {r['top1']:6.2f}%  ({r['delta_top1']:+.2f}; "
                      f"{r['agree_fp32']:.2f}% of predictions as fp32)")
            print(f"wrote {write_csv(acc, sibling(a.csv, 'accuracy'), ACCURACY_COLUMNS)}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
