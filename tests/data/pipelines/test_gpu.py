"""The gpu pipeline (chapter 12c, `t2t_course.data.pipelines.gpu`), on CPU tensors: the JPEG frame header read without
PIL, decoding with its fallbacks and bad files, the DeviceLoader (skips and repeats; its background thread: order, the
workers' draws, resume, stopping), the batched augmentation's distribution, and the evaluation transform against
chapter 11's; on a GPU (marked `cuda`), nvJPEG."""
import gc, shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from t2t_course.data import BadImageError, ImageFolderDataset, create_eval_transform, create_loader, load_rgb
from t2t_course.data.pipelines import (DeviceEvalTransform, DeviceLoader, DeviceTrainAugment, collate_encoded,
                                 create_pipeline, decode_images, jpeg_header, read_encoded)
from t2t_course.data.synthetic import make_photo, write_jpegs
from t2t_course.train.distributed import EpochSampler, SeededDataset
from t2t_course.train.evaluate import close_loader


def test_jpeg_header_reads_the_frame_header(files, tmp_path):
    "Size and components from SOF0/SOF2 without PIL; None for what PIL must judge (not a JPEG, no frame header)."
    Image.fromarray(make_photo(120, 90, seed=4)).save(tmp_path / 'prog.jpg', progressive=True)
    Image.fromarray(make_photo(50, 70, seed=5)[..., 0]).save(tmp_path / 'gray.jpg')
    expect = {'photo.JPEG': (375, 500, 3), 'big.JPEG': (1200, 1600, 3), 'cmyk.jpg': (260, 300, 4), 'photo.png': None,
              'png_named.JPEG': None, 'text.jpg': None, 'truncated.jpg': (375, 500, 3)}
    for name, want in expect.items():
        assert jpeg_header((files / name).read_bytes()) == want, name
    assert jpeg_header((tmp_path / 'prog.jpg').read_bytes()) == (120, 90, 3)
    assert jpeg_header((tmp_path / 'gray.jpg').read_bytes()) == (50, 70, 1)
    data = (files / 'photo.JPEG').read_bytes()
    assert jpeg_header(data[:20]) is None and jpeg_header(b'\xff\xd8\xff') is None   # cut off inside the header


# ------------------------------------------------------------------ the gpu pipeline, on CPU tensors
def test_decode_images_falls_back_and_reports(files):
    names = ['photo.JPEG', 'cmyk.jpg', 'gray16.png', 'palette.png', 'png_named.JPEG', 'truncated.jpg', 'text.jpg']
    images, keep, skipped, fallbacks = decode_images([read_encoded(files / n) for n in names], 'cpu', skip_bad_images=True)
    assert [names[i] for i in keep] == names[:5] and fallbacks == 3  # the three PNGs
    assert sorted(Path(p).name for p, _ in skipped) == ['text.jpg', 'truncated.jpg']
    assert all(img.dtype == torch.uint8 and img.shape[0] == 3 for img in images)
    assert torch.equal(images[2], torch.from_numpy(np.array(load_rgb(files / 'gray16.png'))).permute(2, 0, 1))  # the robust path
    with pytest.raises(ValueError, match='text.jpg'): decode_images([read_encoded(files / 'text.jpg')], 'cpu')


def test_device_loader_batches_skip_and_repeat(files, tmp_path):
    root = write_jpegs(tmp_path / 'train', 10, (90, 120))
    for n in ('cmyk.jpg', 'png_named.JPEG', 'text.jpg', 'truncated.jpg'): shutil.copy(files / n, root / 'n01' / n)
    ds = ImageFolderDataset(root, loader=read_encoded, skip_bad_images=True)
    dl = DeviceLoader(create_loader(ds, 4, num_workers=1, collate_fn=collate_encoded), DeviceTrainAugment(32), 'cpu', True)
    def epoch():
        torch.manual_seed(0); return list(dl)
    a, b = epoch(), epoch()
    assert all(torch.equal(x.images, y.images) for x, y in zip(a, b) if x.images is not None)
    assert sum(len(x.images) for x in a if x.images is not None) == len(ds) - 2
    assert sorted(Path(p).name for x in a for p, _ in x.skipped) == ['text.jpg', 'truncated.jpg']
    assert dl.fallbacks == 2 and 'by PIL on the CPU' in dl.report()  # the PNG in disguise, once per epoch (the cut-off file is bad)


def _gpu_pipeline_folder(root, files):
    write_jpegs(root / 'train', 12, (90, 120)); write_jpegs(root / 'val', 4, (90, 120), seed=9)
    for n in ('png_named.JPEG', 'text.jpg', 'truncated.jpg'): shutil.copy(files / n, root / 'train' / 'n01' / n)
    return create_pipeline('gpu', root, 32, skip_bad_images=True)


def _gpu_epoch(p, prefetch=2, workers=1, start=0, epoch=1):
    "One epoch of the gpu pipeline's training split as `train` builds it: seeded samples, the epoch sampler, a DeviceLoader."
    ds = SeededDataset(p.train, seed=5)
    sampler = EpochSampler(ds, seed=5); sampler.set_epoch(epoch, start)
    dl = DeviceLoader(create_loader(ds, 4, sampler=sampler, num_workers=workers, collate_fn=p.collate_fn), p.train_transform,
                      'cpu', True, prefetch=prefetch)
    return list(dl), dl


def test_gpu_pipeline_thread_keeps_order_draws_and_resume(files, tmp_path):
    "Batches made ahead in the background thread equal those made on demand, with 1 or 2 workers; a resumed epoch repeats the rest."
    p = _gpu_pipeline_folder(tmp_path, files)
    threaded, dl = _gpu_epoch(p)
    assert dl._live is not None and len(threaded) == 4
    for other in (_gpu_epoch(p, prefetch=0)[0], _gpu_epoch(p, workers=2)[0], _gpu_epoch(p, workers=0)[0]):
        assert len(other) == len(threaded)
        for a, b in zip(threaded, other):
            assert (a.images is None) == (b.images is None) and [s for s, _ in a.skipped] == [s for s, _ in b.skipped]
            if a.images is not None: assert torch.equal(a.images, b.images) and torch.equal(a.targets, b.targets)
    resumed, _ = _gpu_epoch(p, start=8)  # after two batches of 4
    for a, b in zip(threaded[2:], resumed):
        if a.images is not None: assert torch.equal(a.images, b.images) and torch.equal(a.targets, b.targets)
    other_epoch, _ = _gpu_epoch(p, epoch=2)
    assert not torch.equal(threaded[0].images, other_epoch[0].images)  # each epoch its own draws
    assert sorted(Path(s).name for b in threaded for s, _ in b.skipped) == ['text.jpg', 'truncated.jpg']


def test_gpu_pipeline_batch_is_one_buffer_with_the_workers_draws(files, tmp_path):
    "collate_encoded ships a batch's files as one uint8 buffer with offsets, and the draws each worker made from the header's size."
    p = _gpu_pipeline_folder(tmp_path, files)
    samples = [p.train[i] for i in range(3)]
    enc, targets, skipped = collate_encoded(samples)
    assert enc.data.dim() == 1 and enc.offsets.tolist()[-1] == len(enc.data) and skipped == []
    for (e, d), view in zip([s[0] for s in samples], enc.images()):
        assert torch.equal(view.data, e.data) and view.path == e.path and d.size == (90, 120)
    assert [type(d).__name__ for d in enc.draws] == ['SampleDraws'] * 3 and targets.tolist() == [s[1] for s in samples]


def test_gpu_pipeline_thread_stops_when_dropped_closed_or_failed(files, tmp_path):
    "A dropped iterator's thread ends; close_loader ends the thread and the workers; a bad file raises in the loop's thread, naming it."
    p = _gpu_pipeline_folder(tmp_path, files)
    dl = DeviceLoader(create_loader(p.train, 4, num_workers=1, collate_fn=p.collate_fn), p.train_transform, 'cpu', True)
    it = iter(dl); next(it); thread = it.thread
    del it; gc.collect(); thread.join(10)
    assert not thread.is_alive()
    it = iter(dl); next(it)
    close_loader(dl)
    assert not it.thread.is_alive() and it.done
    strict = create_pipeline('gpu', tmp_path, 32)  # bad files raise
    it = iter(DeviceLoader(create_loader(strict.train, 32, num_workers=1, collate_fn=strict.collate_fn), strict.train_transform, 'cpu'))
    with pytest.raises(BadImageError, match='text.jpg'): next(it)
    with pytest.raises(StopIteration): next(it)


def test_device_augment_distribution():
    "Flip rate, erasing rate and shapes of the batched augmentation over many samples."
    torch.manual_seed(0)
    imgs = [torch.arange(40 * 60, dtype=torch.float32).view(1, 40, 60).expand(3, 40, 60).to(torch.uint8) for _ in range(400)]
    aug = DeviceTrainAugment(16, rand_augment=False, re_prob=0., mean=(0, 0, 0), std=(1, 1, 1), scale=(1., 1.), ratio=(1.5, 1.5))
    x = aug(imgs)  # the whole image each time: flipped ones have their ramp reversed
    flipped = (x[:, 0, 0, 0] > x[:, 0, 0, -1]).float().mean().item()
    assert abs(flipped - 0.5) < 0.08
    er = DeviceTrainAugment(16, rand_augment=False, hflip=0., mean=(0, 0, 0), std=(1, 1, 1)).erase(torch.zeros(4000, 3, 16, 16))
    assert abs((er != 0).flatten(1).any(1).float().mean().item() - 0.25) < 0.03


def test_device_eval_is_close_to_chapter_10s(files):
    for name in ('photo.JPEG', 'png_named.JPEG'):
        a = create_eval_transform(64)(load_rgb(files / name))
        b = DeviceEvalTransform(64)(decode_images([read_encoded(files / name)], 'cpu')[0])[0]
        assert ((a - b).abs() * 0.229 * 255).max() < 6


# ------------------------------------------------------------------ GPU
@pytest.mark.cuda
def test_gpu_pipeline_decodes_with_nvjpeg_and_falls_back(files):
    names = ['photo.JPEG', 'big.JPEG', 'cmyk.jpg', 'png_named.JPEG']
    images, keep, skipped, fallbacks = decode_images([read_encoded(files / n) for n in names], 'cuda')
    assert len(images) == 4 and all(i.device.type == 'cuda' for i in images) and fallbacks >= 1  # the PNG at least
    cpu, _, _, _ = decode_images([read_encoded(files / 'photo.JPEG')], 'cpu')
    assert (images[0].cpu().float() - cpu[0].float()).abs().mean() < 2  # nvJPEG and libjpeg-turbo round differently
    torch.manual_seed(0)
    x = DeviceTrainAugment(224)(images)
    assert x.shape == (4, 3, 224, 224) and x.device.type == 'cuda' and torch.isfinite(x).all()
