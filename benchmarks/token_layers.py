"""Time and peak memory of the T2T token layers at the lengths of the first T2T layer.

    python benchmarks/token_layers.py                 # CPU, batch 2, inference (about a minute)
    python benchmarks/token_layers.py --train         # also a training step (forward + backward)
    python benchmarks/token_layers.py --threads 1     # one thread per worker (steadier on a busy machine)
    python benchmarks/token_layers.py --device cuda   # on a GPU

Configurations (input width 147, output width 64, as the first token layer of T2T-ViT), all built
with the same seed, so the two paths of one layer have the same weights:

- `transformer-sdpa`:         TokenTransformer, fused path (scaled_dot_product_attention, no N x N matrix);
- `transformer-materialized`: the same weights, readable path (builds the (B, 1, N, N) weights);
- `performer`:                TokenPerformer, fast path (matmuls, float32 feature map);
- `performer-naive`:          the same weights, the official einsum/repeat sequence.

How it measures. Every measurement runs in a fresh Python process of its own, so one configuration's
allocations cannot hide or inflate another's.
- Peak memory: after the layer and its input are built and a tiny warm-up call has loaded the
  kernels, the worker resets the kernel's peak-RSS counter (writes 5 to /proc/self/clear_refs) and
  records its current RSS; it runs one measured call and reports peak RSS (VmHWM; getrusage's
  ru_maxrss where /proc is missing) minus that baseline: the extra resident memory the call needed.
  On CUDA: torch.cuda.max_memory_allocated() minus the memory allocated before the call.
- Time: then, in the same process, the fastest of at least `--reps` calls and at least half a second
  of calls (the minimum is the estimate least disturbed by other processes on a shared machine).
  Ratio 2 takes the fastest of three processes per length, run alternately (2304, 9216, 2304,
  ...), so that both lengths see the same machine load.
- Worker environment (each variable only where you have not set it yourself):
  OMP_WAIT_POLICY=PASSIVE, because OpenMP threads that spin while waiting stalled calls of a few ms for
  200 ms on a busy 2-core machine; and glibc's malloc thresholds fixed where its dynamic rule ends up
  (MALLOC_MMAP_THRESHOLD_=32 MiB, no trimming): otherwise whether a call re-faults its 10-50 MB of
  temporaries depends on the order of frees and varied by 1.7x between identical processes. Blocks
  above 32 MiB (the materialized N x N matrices) are still fresh pages on every call, as in any run.

It prints a table and then the two required ratios with PASS/FAIL:
1. at 9216 tokens the SDPA TokenTransformer's peak memory is at most half the materialized path's;
2. the Performer's time grows at most 6x when N grows 4x (2304 -> 9216 tokens).
The exit status is 0 when both pass.
"""
import argparse, gc, json, os, subprocess, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helper beside this script
from _peak import peak_extra_mb  # noqa: E402

KINDS = ('transformer-sdpa', 'transformer-materialized', 'performer', 'performer-naive')
LENGTHS = (2304, 3136, 9216)
WORKER_ENV = {'OMP_WAIT_POLICY': 'PASSIVE',
              'MALLOC_MMAP_THRESHOLD_': str(32 * 2**20), 'MALLOC_TRIM_THRESHOLD_': str(2**30)}


# ---------------------------------------------------------------- inside a worker process
def _build(kind, dim, device):
    "The layer of `kind` (eval mode), first-layer widths: dim -> 64, seed 0."
    import torch
    try: import t2t_course  # noqa: F401
    except ImportError: sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from t2t_course.core import set_fast_paths
    from t2t_course.models.t2t_layer import TokenTransformer
    from t2t_course.models.performer import TokenPerformer
    torch.manual_seed(0)
    layer = TokenTransformer(dim, 64) if kind.startswith('transformer') else TokenPerformer(dim, 64)
    set_fast_paths(layer, kind in ('transformer-sdpa', 'performer'))  # SDPA (fused_attn) or batched_favor, or neither
    return layer.to(device).eval()


def _setup(kind, n, batch, device, dim, train):
    "Build the layer and its input and warm up; return `call()`, one measured step (synchronized on CUDA)."
    import torch
    layer = _build(kind, dim, device)
    x = torch.randn(batch, n, dim, device=device)

    def call():
        if train:
            layer.zero_grad(set_to_none=True)
            layer(x).square().mean().backward()
        else:
            with torch.no_grad(): layer(x)
        if device.startswith('cuda'): torch.cuda.synchronize()

    with torch.no_grad(): layer(x[:, :64])  # tiny warm-up: loads kernels and thread pools, allocates little
    if train: layer(x[:, :64]).sum().backward(); layer.zero_grad(set_to_none=True)
    return call


def _best(call, min_calls=2, min_s=0.1, max_calls=100):
    "Fastest wall time (s) of `call()` over at least `min_calls` calls and at least `min_s` seconds."
    times, start = [], time.perf_counter()
    while len(times) < min_calls or (time.perf_counter() - start < min_s and len(times) < max_calls):
        t0 = time.perf_counter(); call(); times.append(time.perf_counter() - t0)
    return min(times)


def worker(kind:str, n:int, batch:int=2, device:str='cpu', reps:int=5, dim:int=147, train:bool=False,
           threads:int=0) -> dict:
    "One configuration in this process: peak extra memory (MB) of one call, then its fastest time (ms)."
    import torch
    if threads: torch.set_num_threads(threads)
    call = _setup(kind, n, batch, device, dim, train)
    gc.collect()
    peak, method = peak_extra_mb(call, device)
    t = _best(call, min_calls=reps, min_s=0.5)
    return dict(kind=kind, n=n, batch=batch, device=device, dim=dim, train=train, threads=torch.get_num_threads(),
                time_ms=t * 1e3, peak_mb=peak, memory_method=method)


# ---------------------------------------------------------------- driver
def _spawn(fn_name, env=None, **kw):
    "Run the worker `fn_name(**kw)` in a fresh process of its own with extra environment `env`."
    env = {**os.environ, **{k: v for k, v in {**WORKER_ENV, **(env or {})}.items() if k not in os.environ}}
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), '--worker', json.dumps(dict(fn=fn_name, kw=kw))],
                 capture_output=True, text=True, check=False, env=env)
    if res.returncode != 0: raise RuntimeError(f"benchmark worker {fn_name}({kw}) failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def measure(kind:str, n:int, batch:int=2, device:str='cpu', reps:int=5, dim:int=147, train:bool=False,
            threads:int=0) -> dict:
    "Peak memory and fastest time of one configuration, in a process of its own (see the module docstring)."
    if kind not in KINDS: raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return _spawn('worker', kind=kind, n=n, batch=batch, device=device, reps=reps, dim=dim, train=train,
                  threads=threads)


def measure_scaling(kind:str='performer', n_small:int=2304, n_big:int=9216, repeats:int=3, **kw) -> dict:
    "Time ratio of `kind` between two lengths: fastest of `repeats` processes per length, run alternately."
    small, big = [], []
    for _ in range(repeats):
        small.append(measure(kind, n_small, **kw)['time_ms']); big.append(measure(kind, n_big, **kw)['time_ms'])
    return dict(kind=kind, n_small=n_small, n_big=n_big, time_small_ms=min(small), time_big_ms=min(big),
                ratio=min(big) / min(small))


def run(kinds=KINDS, lengths=LENGTHS, batch:int=2, device:str='cpu', reps:int=5, dim:int=147,
        train:bool=False, threads:int=0, verbose:bool=True) -> list:
    "Measure every (kind, length), each in a process of its own; return one result dict per configuration."
    rows = []
    for n in lengths:
        for kind in kinds:
            rows.append(measure(kind, n, batch, device, reps, dim, train, threads))
            if verbose: print(f"  measured {kind} at N={n}", file=sys.stderr, flush=True)
    return rows


def table(rows) -> str:
    "The results as a fixed-width text table."
    out = [f"{'layer':26s} {'N':>6s} {'time (ms)':>10s} {'peak extra memory (MB)':>23s}"]
    for r in rows: out.append(f"{r['kind']:26s} {r['n']:6d} {r['time_ms']:10.1f} {r['peak_mb']:23.1f}")
    return '\n'.join(out)


def find(rows, kind, n):
    "The row for `kind` at length `n`."
    return next(r for r in rows if r['kind'] == kind and r['n'] == n)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                epilog=__doc__.split('\n\n', 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--device', default='cpu', help="'cpu' (default) or 'cuda'")
    p.add_argument('--batch', type=int, default=2, help='batch size (default 2)')
    p.add_argument('--reps', type=int, default=5, help='at least this many timed calls per configuration (default 5)')
    p.add_argument('--threads', type=int, default=0, help='torch threads in each worker (default: PyTorch default)')
    p.add_argument('--train', action='store_true', help='also measure a training step (forward + backward)')
    p.add_argument('--worker', help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        job = json.loads(a.worker)
        print(json.dumps({'worker': worker}[job['fn']](**job['kw'])))
        return 0
    import torch
    if a.device.startswith('cuda') and not torch.cuda.is_available(): p.error('--device cuda but no CUDA GPU is visible')
    ok = True
    for train in ([False, True] if a.train else [False]):
        mode = 'training step (forward + backward)' if train else 'inference (forward, no grad)'
        rows = run(batch=a.batch, device=a.device, reps=a.reps, train=train, threads=a.threads)
        print(f"\n== T2T token layers, width 147 -> 64, batch {a.batch}, {mode}, device {a.device}, "
              f"torch {torch.__version__}, threads: {rows[0]['threads']}\n")
        print(table(rows) + f"\n(memory: {rows[0]['memory_method']}; time: fastest call; "
              f"each configuration in a fresh process)\n")
        for n in LENGTHS:
            s, m = find(rows, 'transformer-sdpa', n), find(rows, 'transformer-materialized', n)
            pf, pn = find(rows, 'performer', n), find(rows, 'performer-naive', n)
            print(f"N={n}: TokenTransformer SDPA vs materialized: {m['time_ms'] / s['time_ms']:.2f}x faster, "
                  f"{s['peak_mb'] / max(m['peak_mb'], 1e-9):.3f} of the memory; "
                  f"TokenPerformer fast vs naive: {pn['time_ms'] / pf['time_ms']:.2f}x faster")
        mem_ratio = find(rows, 'transformer-sdpa', 9216)['peak_mb'] / find(rows, 'transformer-materialized', 9216)['peak_mb']
        sc = measure_scaling('performer', 2304, 9216, batch=a.batch, device=a.device, reps=a.reps, train=train,
                             threads=a.threads)
        r1, r2 = mem_ratio <= 0.5, sc['ratio'] <= 6.
        print(f"\nRATIO 1 ({mode}): peak memory at 9216 tokens, SDPA / materialized TokenTransformer = "
              f"{mem_ratio:.3f} (required <= 0.5): {'PASS' if r1 else 'FAIL'}")
        print(f"RATIO 2 ({mode}): TokenPerformer time at 9216 / at 2304 tokens (N x4) = {sc['ratio']:.2f} "
              f"({sc['time_big_ms']:.1f} / {sc['time_small_ms']:.1f} ms, fastest of 3 processes each) "
              f"(required <= 6): {'PASS' if r2 else 'FAIL'}")
        ok = ok and r1 and r2
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
