"""Data-pipeline throughput: images/s per loader worker of the recipe's training transform, today's `pil` pipeline
against the CPU pipelines of chapter 12, `draft` (crop first, DCT-scaled decode) and `fast` (draft's draws, torch
decode and uint8 resize, RandAugment's PIL-exact numpy ops, uint8 out of the worker), side by side in one run, on generated ImageNet-like
JPEGs (500 x 375, `make_photo`: gradients, shapes, texture), and on large photos (1600 x 1200) where the draft decode
can reduce; on a CUDA GPU also `fast` with its batch step on the GPU and the `gpu` pipeline (workers read bytes;
nvJPEG decode and augmentation on the GPU), with 1, 4 and 8 workers.

    python benchmarks/data_pipeline.py --quick     # about a minute on a CPU
    python benchmarks/data_pipeline.py             # longer rounds; on a GPU machine also the gpu pipeline

Each measurement goes through `create_loader` with one worker process (the 'per worker' figure), the rounds of the
pipelines rotate their order, and the best round of each counts (a shared machine is noisy: the minimum time is the
cleanest, and more, shorter rounds catch more of its quiet moments). `fast` leaves the float conversion, the
normalisation and writing the erasing it drew to the process the
batch lands in (`BatchPostCrop`: on the GPU when training on one); its "charged" figure adds that step's CPU time per
image to the worker's, as if one core did both. The goal is `fast` >= 2x `pil` per worker on the ImageNet-like
files, with the same augmentation (the same draws; kernels within a stated tolerance: tests/data/pipelines/); the
line says PASS or FAIL.
"""
import argparse, os, shutil, sys, tempfile, time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helper beside this script
from _machine import cpu_line  # noqa: E402
from t2t_course.data import create_loader
from t2t_course.data.pipelines import create_pipeline
from t2t_course.data.synthetic import write_jpegs

GOAL = 2.0


def loader_rate(pipe, split_ds, n_images:int, batch:int, device='cpu', workers:int=1) -> float:
    "img/s through `create_loader` with `workers` processes, after every worker has delivered a batch."
    sampler = torch.utils.data.RandomSampler(split_ds, replacement=True, num_samples=n_images + batch * (workers + 1),
                                             generator=torch.Generator().manual_seed(0))
    dl = pipe.wrap(create_loader(split_ds, batch, sampler=sampler, num_workers=workers, drop_last=True, collate_fn=pipe.collate_fn),
                   'train', device)
    it = iter(dl)
    for _ in range(workers): next(it)
    if device != 'cpu': torch.cuda.synchronize()
    t, n = time.perf_counter(), 0
    while n < n_images:
        images, _, _ = next(it)
        n += len(images)
    if device != 'cpu': torch.cuda.synchronize()
    dt = time.perf_counter() - t
    getattr(getattr(dl, '_iterator', None) or it, '_shutdown_workers', lambda: None)()
    return n / dt


CPU_PIPES = ('pil', 'draft', 'fast')


def batch_step_ms(pipe, batch:int) -> float:
    "ms per image of `fast`'s batch step (`BatchPostCrop`) in this process, best of 5, on a batch of its worker's samples."
    torch.manual_seed(0)
    u8 = pipe.collate_fn([pipe.train[i % len(pipe.train)] for i in range(batch)]).images
    best = float('inf')
    for _ in range(5):
        t = time.perf_counter(); pipe.train_transform(u8); best = min(best, time.perf_counter() - t)
    return best / batch * 1e3


def compare(root:Path, img_size:int, n_images:int, rounds:int, batch:int) -> dict:
    "Best img/s of each CPU pipeline over rounds whose order rotates, one worker each."
    pipes = {name: create_pipeline(name, root, img_size) for name in CPU_PIPES}
    best, names = dict.fromkeys(pipes, 0.), list(pipes)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotate the order: drift hits all
            best[name] = max(best[name], loader_rate(pipes[name], pipes[name].train, n_images, batch))
    best['fast charged'] = 1e3 / (1e3 / best['fast'] + batch_step_ms(pipes['fast'], batch))
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--quick', action='store_true', help='small rounds, about a minute on a CPU (default: off)')
    p.add_argument('--img-size', type=int, default=224, help='training size (default: 224)')
    p.add_argument('--files', type=int, default=None, help='generated files per set (default: 48, or 32 with --quick)')
    p.add_argument('--rounds', type=int, default=None, help='rounds per pipeline (default: 7, or 5 with --quick)')
    p.add_argument('--images', type=int, default=None, help='images per round (default: 320, or 128 with --quick)')
    p.add_argument('--gpu-batch', type=int, default=256, help='batch of the gpu pipeline (default: 256)')
    a = p.parse_args(argv)
    files, rounds, n = a.files or (32 if a.quick else 48), a.rounds or (5 if a.quick else 7), a.images or (128 if a.quick else 320)
    torch.set_num_threads(1)  # the main process only collects batches; one thread leaves the worker its core
    tmp = Path(tempfile.mkdtemp(prefix='t2t_bench_pipe_'))
    t0 = time.perf_counter()
    try:
        sets = {'ImageNet-like 500 x 375': (375, 500), 'large 1600 x 1200': (1200, 1600)}
        for k, size in sets.items():
            write_jpegs(tmp / k.split()[0] / 'train', files, size); write_jpegs(tmp / k.split()[0] / 'val', 2, size)
        print(cpu_line(1) + ' in each loader worker')
        print(f"{files} generated JPEGs per set (quality 90), the 'imagenet' recipe at {a.img_size} px, batch 32, one loader "
              f"worker per pipeline, best of {rounds} alternating rounds of {n} images")
        ratios = {}
        for k in sets:
            best = compare(tmp / k.split()[0], a.img_size, n, rounds, 32)
            ratios[k] = {name: best[name] / best['pil'] for name in best}
            print(f"{k:24s}: " + ', '.join(f"{name} {best[name]:6.1f}" for name in best) + " img/s per worker", flush=True)
            print(f"{'':24s}  " + ', '.join(f"{name}/pil {ratios[k][name]:.2f}x" for name in best if name != 'pil'), flush=True)
        k = next(iter(sets))
        r = ratios[k]['fast']
        print(f"goal: fast >= {GOAL:g}x pil per worker on the {k} files: {r:.2f}x  {'PASS' if r >= GOAL else 'FAIL'}  "
              f"(charged with its batch step: {ratios[k]['fast charged']:.2f}x; draft: {ratios[k]['draft']:.2f}x)")
        if torch.cuda.is_available():
            name = torch.cuda.get_device_name()
            for kind in ('fast', 'gpu'):  # fast: CPU workers, its batch step on the GPU; gpu: workers read bytes only
                pipe = create_pipeline(kind, tmp / 'ImageNet-like', a.img_size)
                for w in sorted({1, 4, min(8, os.cpu_count() or 1)}):
                    rate = loader_rate(pipe, pipe.train, max(n, 4 * a.gpu_batch), a.gpu_batch, 'cuda', w)
                    what = ('decode and augmentation in the workers, the batch step on the GPU' if kind == 'fast' else
                            'nvJPEG decode and augmentation on the GPU')
                    print(f"{kind} pipeline on {name}, {w} worker(s), batch {a.gpu_batch}: {rate:8.1f} img/s ({what}, "
                          f"synchronised)", flush=True)
        else:
            print("gpu pipeline: not measured (no CUDA GPU here)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"total {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == '__main__':
    sys.exit(main())
