"""Training speed on one GPU: synthetic-data training throughput (img/s) and model FLOP utilisation (MFU) of T2T-ViT-14 at
224 px in bf16, eager and torch.compile'd, with the training loop's own step (mixing, label smoothing, fused AdamW, EMA);
at batch 64 per GPU (the recipe's) and 256; then data-loader throughput (img/s, and per worker) of the recipe's training
transform on a folder of generated JPEGs, plain and with pinned memory and the copy to the GPU. The PIL pipeline only:
benchmarks/data_pipeline.py compares the pipelines. Finishes within about 6 minutes on one H200-class GPU (compilation
is most of it).

    python benchmarks/gpu_train.py                      # the full benchmark; needs a CUDA GPU
    python benchmarks/gpu_train.py --batch-size 128 --workers 1 8 16 --peak-tflops 835
    python benchmarks/gpu_train.py --device cpu --smoke # a tiny version of every measurement, to test this script

MFU = img/s x 6 x MACs / peak, where MACs is the forward pass per image counted as fvcore does (`count_macs`), a
training step is taken as 3 forward passes, and 2 FLOPs make a MAC; the peak is the GPU's dense bf16 tensor-core rate
(a table for common GPUs matched against torch's device name, which tells an H200 NVL, 835, from an H200 SXM, 989;
or --peak-tflops). As usual for MFU the count is the model's, every token through every
block; the library's fast path computes only the cls token in the last block (about 5% of T2T-ViT-14's MACs), so the
GPU does slightly less arithmetic than the count credits it with.
"""
import argparse, math, os, shutil, sys, tempfile, time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from t2t_course.models.t2t_vit import create_model
from t2t_course.models.backbone import count_macs
from t2t_course.data import (ImageFolderDataset, MixupCutmix, create_loader, create_loss, create_train_transform,
                             DATA_PRESETS)
from t2t_course.train.optim import ModelEma, WarmupCosineSchedule, amp_dtype, create_grad_scaler, create_optimizer
from t2t_course.train import TrainState, train_step

# dense bf16 tensor-core peaks in TFLOPS (vendor data sheets, without sparsity), matched against torch's device name,
# longer names first: the NVL (PCIe, 600 W class) parts are slower than the SXM ones, and torch's name says "NVL" for them
# ("NVIDIA H200 NVL", "NVIDIA H100 NVL"), while the SXM parts are plain "NVIDIA H200" / "NVIDIA H100 80GB HBM3".
PEAK_BF16_TFLOPS = {'H200 NVL': 835.0, 'H100 NVL': 835.0, 'H100 PCIe': 756.0, 'H200': 989.4, 'H100': 989.4, 'GH200': 989.4,
                    'A100': 312.0, 'L40S': 362.1, 'A10G': 70.0, 'L4': 121.0}


def peak_tflops(name:str):
    "(table key, dense bf16 TFLOPS) of the first entry whose key is in `name`, longest keys first; (None, None) if none."
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key in name: return key, PEAK_BF16_TFLOPS[key]
    return None, None


def sync(device):
    if device.type == 'cuda': torch.cuda.synchronize(device)


def train_throughput(model_name, img_size, batch, steps, warmup, device, dtype, compile, model_kwargs):
    "img/s of the training step on a fixed synthetic batch, and the seconds the first (warm-up) steps took."
    torch.manual_seed(0)
    raw = create_model(model_name, num_classes=1000, img_size=img_size, drop_path_rate=0.1, **model_kwargs).to(device)
    # compiled: a fresh compile per measurement, for this batch size alone (static shapes), not a recompile against the
    # guards of the last one, which would make the batch dimension dynamic
    if compile: torch._dynamo.reset()
    model = torch.compile(raw, dynamic=False) if compile else raw
    optimizer = create_optimizer(raw, 1e-3, 0.05)
    state = TrainState(raw, optimizer, WarmupCosineSchedule(optimizer, 1e-3, 10, 10_000), create_grad_scaler(dtype, device),
                       ModelEma(raw, 0.99996))
    mixer, loss_fn = MixupCutmix(1000, **DATA_PRESETS['imagenet']['mix']), create_loss(True, 0.1)
    images = torch.randn(batch, 3, img_size, img_size, device=device)
    targets = torch.randint(0, 1000, (batch,), device=device)

    def step():  # the training loop's own step (t2t_course.train.train_step), on a batch already on the device
        train_step(state, model, images, targets, loss_fn, mixer, dtype)

    t = time.perf_counter()
    for _ in range(warmup): step()
    sync(device); t_warm = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(steps): step()
    sync(device); dt = time.perf_counter() - t
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == 'cuda' else float('nan')
    state = model = raw = optimizer = None  # free the GPU memory before the next mode
    if device.type == 'cuda': torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats(device)
    return batch * steps / dt, t_warm, mem


def make_jpegs(root:Path, n:int, size=(375, 500)):
    "`n` JPEGs of ImageNet's typical size (smooth colour fields plus noise, so they compress like photos) in 2 classes."
    rng = np.random.default_rng(0)
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    for i in range(n):
        d = root / f'n{i % 2:02d}'
        d.mkdir(parents=True, exist_ok=True)
        c = rng.random((3, 3))
        img = np.stack([c[k, 0] + c[k, 1] * np.sin(6 * xx + k) + c[k, 2] * np.cos(5 * yy) for k in range(3)], -1)
        img = np.clip(img * 90 + 60 + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(d / f'{i:05d}.JPEG', quality=90)


def loader_throughput(root:Path, img_size:int, workers:int, n_images:int, batch:int, device=None):
    "img/s of the recipe's training transform through `create_loader` with `workers` processes (start-up excluded); with a CUDA `device`, pinned batches copied to it (synchronised)."
    ds = ImageFolderDataset(root, create_train_transform(img_size))
    sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=n_images + batch * max(workers, 1) * 2,
                                             generator=torch.Generator().manual_seed(0))
    pin = device is not None and device.type == 'cuda'
    dl = create_loader(ds, batch, sampler=sampler, num_workers=workers, drop_last=True, pin_memory=pin)
    it = iter(dl)
    for _ in range(max(workers, 1) * 2): next(it)  # let every worker start and fill its prefetch queue once
    t, n = time.perf_counter(), 0
    while n < n_images:
        images, _, _ = next(it)
        if pin: images = images.to(device, non_blocking=True)
        n += len(images)
    if pin: torch.cuda.synchronize(device)
    dt = time.perf_counter() - t
    del it
    return n / dt


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--model', default='t2t_vit_14', help='model to train (default: t2t_vit_14)')
    p.add_argument('--img-size', type=int, default=224, help='image size (default: 224)')
    p.add_argument('--batch-size', type=int, nargs='+', default=[64, 256],
                   help="images per training step and GPU, each measured (default: 64, the recipe's per GPU, and 256)")
    p.add_argument('--steps', type=int, default=30, help='timed training steps per mode (default: 30)')
    p.add_argument('--warmup', type=int, default=5, help='untimed steps first, compilation included (default: 5)')
    p.add_argument('--amp', default='bf16', choices=['bf16', 'fp16', 'off'], help='autocast dtype (default: bf16)')
    p.add_argument('--workers', type=int, nargs='+', default=None,
                   help='data-loader worker counts to measure (default: 1, 4, 8 and the number of CPUs)')
    p.add_argument('--loader-images', type=int, default=400, help='images decoded per worker and measurement (default: 400)')
    p.add_argument('--loader-files', type=int, default=1000, help='generated JPEGs the loader draws from (default: 1000)')
    p.add_argument('--no-compile', dest='compile', action='store_false', help='skip the compiled mode (default: measure it)')
    p.add_argument('--peak-tflops', type=float, default=None,
                   help="dense bf16 peak of the GPU for MFU (default: from a table of common GPUs matched against torch's device "
                        "name, which tells H200/H100 NVL from SXM; pass it for any other part)")
    p.add_argument('--device', default='cuda', help='cuda or cuda:N; cpu only with --smoke (default: cuda)')
    p.add_argument('--smoke', action='store_true', help='tiny sizes, to check that the script runs (default: off)')
    a = p.parse_args(argv)
    device = torch.device(a.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        print("gpu_train.py: error: this benchmark needs a CUDA GPU (torch.cuda.is_available() is False); "
              "run it on a GPU machine, or check the script with --device cpu --smoke", file=sys.stderr)
        return 2
    if device.type == 'cpu' and not a.smoke:
        print("gpu_train.py: error: on the CPU only --smoke runs (the full benchmark needs a CUDA GPU)", file=sys.stderr)
        return 2
    model_kwargs = {}
    if a.smoke:
        a.model, a.img_size, a.batch_size, a.steps, a.warmup, a.loader_images = 't2t_vit_7', 32, [2, 4], 2, 1, 16
        model_kwargs = dict(embed_dim=32, depth=1, num_heads=2, mlp_ratio=2., token_dim=16)
        a.workers, a.compile = a.workers or [1], a.compile and device.type == 'cuda'
        torch.set_num_threads(1)
    workers = a.workers or sorted({1, 4, 8, os.cpu_count() or 1})
    dtype = amp_dtype(a.amp, device) if a.amp != 'off' else None
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'
    key, table_peak = peak_tflops(name) if device.type == 'cuda' else (None, None)
    peak = a.peak_tflops or table_peak
    if a.peak_tflops: peak_src = f'{peak:g} TFLOPS dense bf16, from --peak-tflops'
    elif peak: peak_src = (f"{peak:g} TFLOPS dense bf16, the table's '{key}' entry (matched in the device name; an NVL part "
                           f"reports 'NVL' in its name and gets the NVL peak, else pass --peak-tflops)")
    else: peak_src = 'unknown: pass --peak-tflops for MFU'
    if device.type == 'cuda':
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    t0 = time.perf_counter()
    probe = create_model(a.model, num_classes=1000, img_size=a.img_size, **model_kwargs)
    macs = count_macs(probe, a.img_size)['total']
    del probe
    print(f"{a.model} at {a.img_size} px: {macs / 1e9:.3f} GMACs per image forward (fvcore convention); training step "
          f"= 6 x MACs = {6 * macs / 1e9:.2f} GFLOPs per image")
    print(f"device: {name}; torch {torch.__version__}, amp {a.amp}, {a.steps} timed steps after {a.warmup}")
    print(f"peak: {peak_src}")
    rows = []
    for batch in a.batch_size:
        for compile in ([False, True] if a.compile else [False]):
            ips, t_warm, mem = train_throughput(a.model, a.img_size, batch, a.steps, a.warmup, device, dtype, compile, model_kwargs)
            mfu = ips * 6 * macs / (peak * 1e12) if peak else None
            mode = 'compiled' if compile else 'eager'
            rows.append((batch, mode, ips, mfu))
            print(f"train batch {batch:>4} {mode:>8}: {ips:9.1f} img/s   MFU {f'{100 * mfu:5.1f}%' if mfu is not None else 'n/a'}   "
                  f"(first {a.warmup} steps {t_warm:.1f}s, peak memory {mem:.1f} GiB)", flush=True)
    for batch in a.batch_size:
        r = {m: ips for b, m, ips, _ in rows if b == batch}
        if len(r) == 2: print(f"batch {batch}: compiled / eager {r['compiled'] / r['eager']:.2f}x")
    tmp = Path(tempfile.mkdtemp(prefix='t2t_bench_jpegs_'))
    try:
        n_files, lb = 64 if a.smoke else a.loader_files, min(64, max(a.batch_size))
        t = time.perf_counter()
        make_jpegs(tmp, n_files, (48, 64) if a.smoke else (375, 500))
        print(f"data loader: {n_files} generated JPEGs ({'48 x 64' if a.smoke else '375 x 500'}, written in "
              f"{time.perf_counter() - t:.1f}s), the 'imagenet' training transform (RandomResizedCrop {a.img_size}, flip, "
              f"RandAugment, erasing), batch {lb}; 'plain': batches on the host, not pinned; 'pinned + copy': pin_memory and "
              f"the host-to-device copy of every batch included (synchronised; on a GPU only)")
        per_worker = None
        for w in workers:
            for dev in ([None, device] if device.type == 'cuda' else [None]):
                ips = loader_throughput(tmp, a.img_size, w, a.loader_images * max(w, 1), lb, dev)
                how = 'pinned + copy' if dev is not None else 'plain'
                print(f"loader {w:>3} worker(s), {how:>13}: {ips:9.1f} img/s   {ips / max(w, 1):7.1f} img/s per worker", flush=True)
                per_worker = ips / max(w, 1) if per_worker is None else per_worker  # the plain 1-worker rate, if measured first
        top = max(r[2] for r in rows)
        print(f"to feed {top:.0f} img/s the GPU needs about {math.ceil(top / per_worker)} loader workers at "
              f"{per_worker:.0f} img/s per worker")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"total {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == '__main__':
    sys.exit(main())
