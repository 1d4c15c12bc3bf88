"""t2t_predict at scale: 1,000 photos through the command, against the model's batched forward passes alone.

    python benchmarks/predict.py                    # 1,000 JPEGs of 500 x 375, t2t_vit_7 at 224 px, batch 32 (about 2 minutes on 2 CPU cores)
    python benchmarks/predict.py --quick            # 64 images, one round: a smoke run of the script
    python benchmarks/predict.py --model t2t_vit_14 --images 500 --batch-size 16 --workers 1

What it compares, in one run, on the same machine load:
- the forward passes alone: the model (random weights: the time does not depend on them) in eval mode under
  `torch.no_grad`, on ready-made (B, 3, 224, 224) batches, as many images in batches of `--batch-size` as the command
  classifies, with torch's default thread count (what the command gets);
- the command as a user runs it: `python -m t2t_course.deploy FOLDER --checkpoint MODEL_FOLDER --csv out.csv
  --batch-size B` in a fresh process (its start, the imports, reading the model folder, listing the folder, reading,
  decoding and transforming every JPEG in its loader workers while the model runs, and writing the CSV), wall time.

The photos are generated ImageNet-like JPEGs (`t2t_course.data.synthetic.write_jpegs`: 500 x 375, quality 90), the
model is saved once as a model folder (`save_pretrained`). The two are timed in alternating rounds and each one's
estimate is its fastest round (on a shared machine the minimum is the estimate least disturbed by other processes).
Requirement (PASS/FAIL, exit status 0/1): the command's wall time at most 1.5x the forward passes alone.
"""
import argparse, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning: a spinning torch thread would take the core a loader worker needs
# (set before torch loads OpenMP; an explicit OMP_WAIT_POLICY in the environment wins). The command gets it too.
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

try: import t2t_course  # noqa: F401
except ImportError: sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from t2t_course import create_model
from t2t_course.data.synthetic import write_jpegs
from t2t_course.models.t2t_vit import save_pretrained

LIMIT = 1.5


def forward_alone(model, n:int, batch:int, size:int) -> float:
    "Seconds of `n` images' forward passes in batches of `batch` (the last one smaller), inputs made beforehand."
    xs = [torch.randn(min(batch, n - i), 3, size, size) for i in range(0, n, batch)]
    t = time.perf_counter()
    with torch.no_grad():
        for x in xs: model(x)
    return time.perf_counter() - t


def command(folder:Path, model_dir:Path, out:Path, batch:int, workers) -> float:
    "Wall seconds of `t2t_predict` on `folder`, as a fresh process; its failure stops the benchmark."
    argv = [sys.executable, '-m', 't2t_course.deploy', str(folder), '--checkpoint', str(model_dir), '--csv', str(out),
            '--batch-size', str(batch), '--device', 'cpu', '--no-progress'] + ([] if workers is None else ['--workers', str(workers)])
    t = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if res.returncode != 0: sys.exit(f"t2t_predict failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
    return dt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--model', default='t2t_vit_7', help="a registered model (default: t2t_vit_7)")
    p.add_argument('--images', type=int, default=1000, help="photos to classify (default: 1000)")
    p.add_argument('--batch-size', type=int, default=32, help="images per forward pass (default: 32, the command's)")
    p.add_argument('--workers', type=int, default=None, help="the command's loader workers (default: its own, one per 2 CPUs)")
    p.add_argument('--rounds', type=int, default=2, help="alternating rounds; each side's fastest counts (default: 2)")
    p.add_argument('--quick', action='store_true', help="64 images, one round: a smoke run")
    a = p.parse_args(argv)
    n, rounds = (64, 1) if a.quick else (a.images, a.rounds)
    tmp = Path(tempfile.mkdtemp(prefix='t2t_predict_bench_'))
    try:
        print(f"writing {n} JPEGs of 500 x 375 ...", flush=True)
        folder = write_jpegs(tmp / 'photos', n, size=(375, 500), classes=10)
        torch.manual_seed(0)
        model = create_model(a.model).eval()
        size = model.default_cfg['input_size'][-1]
        model_dir = save_pretrained(model, tmp / 'model')
        forward_alone(model, min(n, a.batch_size), a.batch_size, size)          # warm-up: kernels, thread pools
        fwd, cmd = float('inf'), float('inf')
        for r in range(rounds):
            fwd = min(fwd, forward_alone(model, n, a.batch_size, size))
            cmd = min(cmd, command(folder, model_dir, tmp / 'out.csv', a.batch_size, a.workers))
            print(f"round {r + 1}: forward passes {fwd:.2f} s, t2t_predict {cmd:.2f} s (fastest so far)", flush=True)
        rows = sum(1 for _ in open(tmp / 'out.csv')) - 1
        assert rows == n, f"the CSV has {rows} rows for {n} images"
        ratio = cmd / fwd
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
        print(f"\n{a.model} at {size} px, {n} JPEGs of 500 x 375, batch {a.batch_size}, {cpus} CPUs, torch {torch.get_num_threads()} threads, "
              f"loader workers {a.workers if a.workers is not None else 'default'}")
        print(f"{'forward passes alone':>24} {'t2t_predict (process)':>24} {'ratio':>8} {'limit':>6}")
        print(f"{fwd:>22.2f} s {cmd:>22.2f} s {ratio:>7.2f}x {LIMIT:>5.1f}x   {'PASS' if ratio <= LIMIT else 'FAIL'}")
        print(f"({n / fwd:.1f} img/s forward alone, {n / cmd:.1f} img/s through t2t_predict)")
        return 0 if ratio <= LIMIT else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == '__main__': sys.exit(main())
