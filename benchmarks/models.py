"""Whole-model speed and memory: the library's default path against the naive reference path, same weights.

    python benchmarks/models.py                  # CPU fp32, batch 8 at 224 px (1-3 minutes on 2 cores)
    python benchmarks/models.py --quick          # fewer repetitions, a smoke run of every measurement
    python benchmarks/models.py --device cuda    # on a GPU
    python benchmarks/models.py --share-only     # only the GEMM share and the operator profile (under a minute)
    python benchmarks/models.py --share-only --compile   # and the same model under torch.compile beside it

The two paths differ only in the model's fast-path switches (`t2t_course.core.set_fast_paths`), all on or all off:

- default: `scaled_dot_product_attention` in the backbone blocks and in the T2T transformer layers (`fused_attn`:
  the N x N matrix is never built), the Performer layers' batched-matmul path (`batched_favor`), one-copy soft
  splits that read the token maps in place, no re-structurization (`gather_splits`), and a last block that
  computes only the cls token in `forward` (`cls_only_last_block`);
- naive: the attention matrices materialized (`softmax(q k^T * scale) @ v`), the Performer's einsum/repeat
  sequence, unfold + transpose + re-structurize, every token through the last block: exactly as the official
  code computes them.

Measurements, each printed with the requirement it answers (PASS/FAIL):

1. inference time, batch 8 at 224 px, t2t_vit_14 (>= 1.15x faster) and t2t_vit_t_14 (>= 1.5x);
2. training step (forward, backward, AdamW step), batch 8 at 224 px, t2t_vit_14 (>= 1.10x) and t2t_vit_t_14 (>= 1.3x);
   the default path steps with AdamW's fused kernel (as `t2t_train` does), the naive path with PyTorch's default
   AdamW (as the official script does): the same update, and the table shows the model's and the optimizer's
   shares of the speed-up separately;
3. forward peak memory of t2t_vit_t_14 at 384 px, batch 8 (default at most half the naive path's);
4. throughput (img/s) of the default path for t2t_vit_7, t2t_vit_14 and t2t_vit_t_14, inference and training;
5. on CPU, the share of the machine's matrix-multiplication throughput that T2T-ViT-14's default inference path
   reaches (batch 8 at 224 px; >= 0.88): the model's achieved FLOP/s, 2 x its MACs per image (`count_macs`, counted as
   fvcore counts: every token through every block) x the batch over the time of a forward pass, divided by the FLOP/s
   of a square float32 matmul (2048 x 2048, 2 n^3 FLOPs) at the same thread count, in the same process, the two
   alternating round by round, each its fastest round (`--model`, `--img-size`, `--gemm-size` change them); and
   where the forward pass's time goes by operator kind (GEMM, attention, normalisation, activation, gather/copy,
   other), each operator's self time in `torch.profiler` over a few forward passes; with `--compile`, the same
   model under `torch.compile` with inductor's freezing, timed in the same rounds, its share and its largest
   difference from the eager logits beside the default path's.

How it measures. Times: both paths live in one process, on identical weights; their calls alternate in rounds so
that both see the same machine load, and each path's estimate is its fastest round (the minimum is the estimate
least disturbed by other processes). Memory: each path runs in a fresh subprocess; on CPU the kernel's peak-RSS
counter is reset after the model and the input are built and a small warm-up call has run (writing 5 to
/proc/self/clear_refs), and the peak (VmHWM) minus the resident size before the call is the extra memory the
forward pass needed; on CUDA, torch.cuda.max_memory_allocated() minus the memory allocated before the call.
"""
import argparse, copy, gc, json, os, subprocess, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helper beside this script
from _machine import cpu_line  # noqa: E402
from _peak import peak_extra_mb  # noqa: E402

# Idle OpenMP threads sleep instead of spinning: on a shared machine spinning threads stall each other's calls
# (set before torch loads OpenMP; an explicit OMP_WAIT_POLICY in the environment wins).
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

try: import t2t_course  # noqa: F401
except ImportError: sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from t2t_course import create_model
from t2t_course.core import set_fast_paths

REQUIRED = {('infer', 't2t_vit_14'): 1.15, ('infer', 't2t_vit_t_14'): 1.5,
            ('train', 't2t_vit_14'): 1.10, ('train', 't2t_vit_t_14'): 1.3}


def _sync(device):
    if device.startswith('cuda'): torch.cuda.synchronize()


def _paths(name, device, train):
    """The model twice, same weights: (default path, naive path), each with its optimizer when training.

    The optimizers: the default path uses AdamW's fused kernel where this torch has it (what `t2t_train` uses),
    the naive path PyTorch's default AdamW implementation (what the official training script gets). Same math;
    the table prints the model's share (forward + backward) and the optimizer's share of the step separately."""
    torch.manual_seed(0)
    fast = create_model(name).to(device)
    naive = set_fast_paths(copy.deepcopy(fast), False)
    models = [fast.train(train), naive.train(train)]
    opts = [None, None]
    if train:
        try: opts[0] = torch.optim.AdamW(fast.parameters(), lr=1e-5, fused=True); opts[0].step()
        except (RuntimeError, TypeError): opts[0] = torch.optim.AdamW(fast.parameters(), lr=1e-5)
        opts[1] = torch.optim.AdamW(naive.parameters(), lr=1e-5)
    return models, opts


def _step(model, opt, x, y, train, device='cpu'):
    "One inference call, or one training step; returns (model time, optimizer time) in seconds."
    t0 = time.perf_counter()
    if not train:
        with torch.no_grad(): model(x)
        _sync(device)
        return time.perf_counter() - t0, 0.
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    _sync(device); t1 = time.perf_counter()
    opt.step()
    _sync(device)
    return t1 - t0, time.perf_counter() - t1


def compare(name, device='cpu', batch=8, size=224, train=False, rounds=4):
    "Fastest time per call of the default and the naive path, alternating calls round by round."
    models, opts = _paths(name, device, train)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    for m, o in zip(models, opts): _step(m, o, x, y, train, device)  # warm-up
    best = [[float('inf')] * 3 for _ in range(2)]                  # per path: total, model, optimizer
    for _ in range(rounds):
        for i, (m, o) in enumerate(zip(models, opts)):
            tm, to = _step(m, o, x, y, train, device)
            best[i] = [min(best[i][0], tm + to), min(best[i][1], tm), min(best[i][2], to)]
    del models, opts; gc.collect()
    return dict(model=name, mode='train' if train else 'infer', batch=batch, size=size,
                default_s=best[0][0], naive_s=best[1][0], speedup=best[1][0] / best[0][0],
                model_speedup=best[1][1] / best[0][1], default_opt_s=best[0][2], naive_opt_s=best[1][2])


def throughput(name, device='cpu', batch=8, size=224, rounds=3):
    "Images per second of the default path, inference and training step."
    out = {}
    for train in (False, True):
        (model, _), (opt, _) = _paths(name, device, train)
        x = torch.randn(batch, 3, size, size, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        _step(model, opt, x, y, train, device)
        best = min(sum(_step(model, opt, x, y, train, device)) for _ in range(rounds))
        out['train' if train else 'infer'] = batch / best
        del model, opt; gc.collect()
    return out


def memory_worker(name, fast, device='cpu', batch=8, size=384):
    "Extra peak memory (MB) of one forward pass in this process (run me in a fresh subprocess)."
    torch.manual_seed(0)
    model = set_fast_paths(create_model(name, img_size=size).to(device).eval(), fast)
    x = torch.randn(batch, 3, size, size, device=device)
    with torch.no_grad(): model(x[:1, :, :64, :64])  # warm-up at a tiny size: kernels and thread pools, little memory
    gc.collect()
    def call():
        with torch.no_grad(): model(x)
    peak, method = peak_extra_mb(call, device)
    return dict(peak_mb=peak, method=method)


def memory(name, fast, **kw):
    "`memory_worker` in a fresh subprocess."
    args = json.dumps(dict(name=name, fast=fast, **kw))
    res = subprocess.run([sys.executable, __file__, '--memory-worker', args], capture_output=True, text=True)
    if res.returncode: raise RuntimeError(f"memory worker failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the GEMM share and the operator profile
def gemm_flops(n:int=2048, dtype=torch.float32) -> float:
    "FLOP/s of one square n x n matmul (2 n^3 FLOPs) at torch's current thread count: a call to time with `_best`."
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    return (lambda: torch.mm(a, b, out=out)), 2 * n ** 3


def _best(calls:list, rounds:int) -> list:
    "Fastest wall time (s) of each call, the calls alternating round by round (after one warm-up each)."
    for c in calls: c()
    best = [float('inf')] * len(calls)
    for _ in range(rounds):
        for i, c in enumerate(calls):
            t0 = time.perf_counter(); c(); best[i] = min(best[i], time.perf_counter() - t0)
    return best


def executed_flops(model, x) -> dict:
    "FLOPs of the matmuls and attention the forward pass really runs, by operator kind (torch's FlopCounterMode; the cls-only last block counted as run)."
    from torch.utils import flop_counter
    from t2t_course.models.backbone import _register_cpu_sdpa_flops
    _register_cpu_sdpa_flops()
    with torch.no_grad(), flop_counter.FlopCounterMode(display=False) as fc: model(x)
    by_kind = {}
    for op, n in fc.get_flop_counts()['Global'].items():  # op: an OpOverloadPacket, str 'aten.addmm'
        kind = op_kind('aten::' + str(op).split('.')[-1])
        by_kind[kind] = by_kind.get(kind, 0) + n
    return by_kind


def compile_frozen(model, x):
    "`torch.compile` with inductor's freezing (weights as constants, MKL-packed matmuls), compiled by one call on `x`: (compiled, seconds)."
    import torch._inductor.config as inductor_config
    with inductor_config.patch(freezing=True), torch.no_grad():
        compiled = torch.compile(model)
        t0 = time.perf_counter(); compiled(x)
    return compiled, time.perf_counter() - t0


def gemm_share(name='t2t_vit_14', batch=8, size=224, gemm_n=2048, rounds=5, compiled=False) -> dict:
    """The default path's inference FLOP/s (2 x `count_macs` x batch / time) over a square float32 matmul's, in one process;
    with `compiled`, also the same model under `torch.compile` (freezing), timed in the same rounds."""
    from t2t_course.models.backbone import count_macs
    torch.manual_seed(0)
    model = create_model(name, img_size=size).eval()
    macs = count_macs(model, size)['total']
    x = torch.randn(batch, 3, size, size)
    def forward(m=model):
        with torch.no_grad(): return m(x)
    mm, mm_flops = gemm_flops(gemm_n)
    calls, extra = [forward, mm], {}
    if compiled:
        try: cmodel, compile_s = compile_frozen(model, x)
        except Exception as e:  # no C++ compiler, an unsupported platform: said, and the eager figures stand
            extra['compile_error'] = f'{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ""}'
        else:
            calls.append(lambda: forward(cmodel))
            extra.update(compile_s=compile_s, compiled_diff=float((forward(cmodel) - forward()).abs().max()))
    times = _best(calls, rounds)
    (t_model, t_mm), peak = times[:2], mm_flops / times[1]
    model_flops = 2 * macs * batch / t_model
    if len(times) > 2: extra.update(compiled_s=times[2], compiled_share=2 * macs * batch / times[2] / peak)
    run_flops = {k: batch * n for k, n in executed_flops(model, x[:1]).items()}  # matmuls and attention only, as run
    return dict(model=name, batch=batch, size=size, threads=torch.get_num_threads(), macs=macs, model_s=t_model,
                model_flops=model_flops, gemm_n=gemm_n, gemm_flops=peak, share=model_flops / peak,
                matmul_share=sum(run_flops.values()) / t_model / peak, run_flops=run_flops, **extra)


# operator kind: aten names (without 'aten::'), matched exactly, else by the patterns in order
OP_KINDS = {
    'GEMM': ('addmm', 'mm', 'bmm', 'baddbmm', 'matmul', 'linear', 'einsum', 'mkldnn_linear', '_linear_pointwise'),
    'attention': ('scaled_dot_product_attention', '_scaled_dot_product_flash_attention_for_cpu',
                  '_scaled_dot_product_attention_math', 'softmax', '_softmax', 'exp', 'exp_'),
    'normalisation': ('layer_norm', 'native_layer_norm'),
    'activation': ('gelu', 'relu', 'relu_', 'silu', 'sigmoid', 'tanh'),
    'gather/copy': ('copy_', 'cat', 'clone', 'contiguous', 'im2col', 'col2im', 'unfold', 'index', 'index_select',
                    'gather', '_to_copy', 'to', 'constant_pad_nd', 'pad', 'fill_', 'zero_', 'zeros', 'empty',
                    'empty_strided', 'empty_like', 'reshape', 'flatten', 'repeat', 'stack'),
}
KINDS = (*OP_KINDS, 'other')


def op_kind(name:str) -> str:
    "The kind of a profiler event's operator (`aten::addmm` -> 'GEMM'); 'other' for the rest (views, add, mul, ...)."
    op = name.split('::')[-1]
    return next((k for k, ops in OP_KINDS.items() if op in ops), 'other')


def op_profile(name='t2t_vit_14', batch=8, size=224, calls=3) -> dict:
    "Self CPU time of each operator over `calls` forward passes of the default path (torch.profiler), summed by kind: {kind: (ms per call, share, top ops)}."
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    model = create_model(name, img_size=size).eval()
    x = torch.randn(batch, 3, size, size)
    with torch.no_grad():
        model(x)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(calls): model(x)
    per_op = {}
    for e in prof.key_averages():
        if e.key.startswith('aten::'): per_op[e.key[6:]] = per_op.get(e.key[6:], 0.) + e.self_cpu_time_total / 1e3 / calls
    total = sum(per_op.values())
    out = {}
    for kind in KINDS:
        ops = sorted(((ms, op) for op, ms in per_op.items() if op_kind(op) == kind), reverse=True)
        ms = sum(m for m, _ in ops)
        out[kind] = (ms, ms / total, [(op, m / total) for m, op in ops[:3] if m / total >= 0.005])
    return out


def print_share(name='t2t_vit_14', batch=8, size=224, gemm_n=2048, rounds=5, goal=0.88, compiled=False) -> bool:
    "Print the GEMM share (and the compiled path's, with `compiled`) and the operator profile; True if the default path's share meets `goal`."
    r = gemm_share(name, batch, size, gemm_n, rounds, compiled)
    ok = r['share'] >= goal
    print(f"\nGEMM share, {name} inference (default path, fp32, batch {batch} at {size} px, {r['threads']} threads):")
    print(f"  square float32 matmul {gemm_n} x {gemm_n}: {r['gemm_flops'] / 1e9:7.1f} GFLOP/s (best of {rounds} rounds)")
    print(f"  model: 2 x {r['macs'] / 1e9:.3f} GMACs x {batch} images in {r['model_s'] * 1e3:.1f} ms = "
          f"{r['model_flops'] / 1e9:7.1f} GFLOP/s")
    print(f"  share {r['share']:.2f} (required >= {goal:.2f})  {'PASS' if ok else 'FAIL'}   "
          f"(the matmuls and attention the pass really runs, FlopCounterMode: {r['matmul_share']:.2f})")
    if 'compile_error' in r: print(f"  torch.compile (inductor, freezing): not measured: {r['compile_error']}")
    elif compiled:
        print(f"  torch.compile (inductor, freezing; compiled in {r['compile_s']:.0f} s, max |logits - eager| "
              f"{r['compiled_diff']:.1e}): {r['compiled_s'] * 1e3:.1f} ms, share {r['compiled_share']:.2f}, "
              f"{r['model_s'] / r['compiled_s']:.2f}x the default path")
    prof = op_profile(name, batch, size)
    total = sum(ms for ms, _, _ in prof.values())
    print(f"  where the time goes (torch.profiler, self time by operator kind, {total:.0f} ms per call with the profiler on):")
    for kind, (ms, share, top) in prof.items():
        print(f"    {kind:<14} {100 * share:5.1f}%  {ms:7.1f} ms   " + ', '.join(f"{op} {100 * s:.1f}%" for op, s in top))
    rates = {k: r['run_flops'][k] / (prof[k][0] / 1e3) / r['gemm_flops'] for k in ('GEMM', 'attention') if r['run_flops'].get(k) and prof[k][0]}
    print("  their rates (FLOPs run over the profiled time, as a share of the matmul's): "
          + ', '.join(f"{k} {v:.2f}" for k, v in rates.items()))
    bound = 2 * r['macs'] * batch / ((prof['GEMM'][0] + prof['attention'][0]) / 1e3) / r['gemm_flops']
    print(f"  were everything but GEMM and attention free, at these rates the share would be {bound:.2f}")
    return ok


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--device', default='cpu', help='cpu or cuda (default: cpu)')
    p.add_argument('--batch-size', type=int, default=8, help='images per call (default: 8)')
    p.add_argument('--rounds', type=int, default=4, help='alternating rounds per comparison (default: 4)')
    p.add_argument('--quick', action='store_true', help='one round each and a 2-image memory check: a smoke run')
    p.add_argument('--share-only', action='store_true', help='only the GEMM share and the operator profile (CPU)')
    p.add_argument('--model', default='t2t_vit_14', help='the model of the GEMM share (default: t2t_vit_14)')
    p.add_argument('--img-size', type=int, default=224, help='image size of the GEMM share (default: 224)')
    p.add_argument('--gemm-size', type=int, default=2048, help='side of the square matmul it divides by (default: 2048)')
    p.add_argument('--compile', action='store_true',
                   help="also time the share's model under torch.compile with inductor's freezing (compiling takes a minute or so)")
    p.add_argument('--memory-worker', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_worker:
        print(json.dumps(memory_worker(**json.loads(args.memory_worker)))); return
    if args.device.startswith('cuda') and not torch.cuda.is_available(): p.error('--device cuda: no CUDA GPU is available')
    rounds, mem_batch = (1, 2) if args.quick else (args.rounds, args.batch_size)
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads, fp32, batch {args.batch_size}")
    if args.device == 'cpu': print(cpu_line(torch.get_num_threads()))
    if args.share_only:
        if args.device != 'cpu': p.error('--share-only measures the CPU')
        return 0 if print_share(args.model, args.batch_size, args.img_size, args.gemm_size, max(rounds, 2), compiled=args.compile) else 1
    results, ok = [], True
    print(f"\n{'model':<14} {'mode':<6} {'default (s)':>11} {'naive (s)':>10} {'speed-up':>9} {'required':>9}"
          f"        {'model alone':>11} {'optimizer step (s)':>19}")
    for mode in ('infer', 'train'):
        for name in ('t2t_vit_14', 't2t_vit_t_14'):
            r = compare(name, args.device, args.batch_size, 224, mode == 'train', rounds)
            need = REQUIRED[(mode, name)]
            verdict = 'PASS' if r['speedup'] >= need else 'FAIL'
            ok &= verdict == 'PASS'
            extra = (f"{r['model_speedup']:>10.2f}x {r['default_opt_s']:>8.3f} vs {r['naive_opt_s']:.3f}" if mode == 'train'
                     else f"{r['model_speedup']:>10.2f}x")
            print(f"{name:<14} {mode:<6} {r['default_s']:>11.3f} {r['naive_s']:>10.3f} {r['speedup']:>8.2f}x {need:>8.2f}x  {verdict}  {extra}")
            results.append(r)
    mf, mn = memory('t2t_vit_t_14', True, device=args.device, batch=mem_batch), memory('t2t_vit_t_14', False, device=args.device, batch=mem_batch)
    ratio = mf['peak_mb'] / mn['peak_mb']
    verdict = 'PASS' if ratio <= 0.5 else 'FAIL'
    ok &= verdict == 'PASS'
    print(f"\nforward peak memory, t2t_vit_t_14 at 384 px, batch {mem_batch} ({mf['method']}): default {mf['peak_mb']:.0f} MB, "
          f"naive {mn['peak_mb']:.0f} MB, ratio {ratio:.2f} (required <= 0.50)  {verdict}")
    print(f"\nthroughput of the default path (img/s, batch {args.batch_size}, 224 px):")
    for name in ('t2t_vit_7', 't2t_vit_14', 't2t_vit_t_14'):
        t = throughput(name, args.device, args.batch_size, 224, max(rounds - 1, 1))
        print(f"  {name:<14} inference {t['infer']:>7.1f}   training step {t['train']:>7.1f}")
    if args.device == 'cpu': ok &= print_share(args.model, args.batch_size, args.img_size, args.gemm_size, max(rounds, 2), compiled=args.compile)
    print(f"\n{'all requirements met' if ok else 'SOME REQUIREMENTS FAILED'}")
    return 0 if ok else 1


if __name__ == '__main__': sys.exit(main())
