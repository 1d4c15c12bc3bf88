"""The data pipelines of chapter 12: the crop drawn first (torchvision's draws, and its distribution by KS tests), the
draft decode (scales, pil's images where the scale is 1, close ones where it is coarser), the lean RandAugment, the
fast pipeline (exact shears, torch's resize within 2 levels of PIL's, pil's draws, its batch step), the robust path
for odd files, the gpu pipeline run on CPU tensors (fallbacks, bad files, reproducibility), and
`t2t_train --pipeline` for every CPU-capable choice. GPU-only checks are marked `cuda`."""
import gc, io, math, shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import stats
from torchvision.transforms import RandomResizedCrop as RRC_v1, v2

from t2t_course.data import BadImageError, ImageFolderDataset, create_eval_transform, create_loader, create_train_transform, load_rgb, mean_fill
from t2t_course.data.pipelines import (PIPELINES, BatchPostCrop, DeviceEvalTransform, DeviceLoader, DeviceTrainAugment, DraftCrop,
                                 DraftResize, DraftPostCrop, FastCrop, PILRandAugment, FastPostCrop, KernelRandAugment, Normalize,
                                 BatchTransformLoader, collate_encoded, collate_uint8, create_pipeline, dct_scale,
                                 decode_images, erase_params, jpeg_header, open_drafted, pil_vertical_first,
                                 resize_uint8, rrc_box, read_encoded, sharpness_rgb, shear_bicubic)
from t2t_course.data.synthetic import make_photo, write_jpegs
from t2t_course.train.cli import build_parser, main
from t2t_course.train.distributed import EpochSampler, SeededDataset
from t2t_course.train.evaluate import close_loader

TINY_ARGS = ['--model', 't2t_vit_7', '--model-kwargs', 'embed_dim=32', 'depth=1', 'num_heads=2', 'mlp_ratio=2.0',
             'token_dim=16', '--img-size', '32', '--threads', '1', '--no-progress', '-b', '4', '--epochs', '1']


def call(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try: code = main(argv)
        except SystemExit as e: code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    "A typical photo (500 x 375 JPEG), a big one (1600 x 1200 JPEG), a PNG, and the odd files of chapter 11's zoo."
    d = tmp_path_factory.mktemp('files')
    Image.fromarray(make_photo()).save(d / 'photo.JPEG', quality=90)
    Image.fromarray(make_photo(1200, 1600, seed=1)).save(d / 'big.JPEG', quality=90)
    Image.fromarray(make_photo(200, 260, seed=2)).save(d / 'photo.png')
    Image.new('CMYK', (300, 260), (0, 255, 255, 0)).save(d / 'cmyk.jpg')
    Image.fromarray((np.arange(300 * 260).reshape(260, 300) % 65536).astype(np.uint16)).save(d / 'gray16.png')
    pal = Image.fromarray((np.arange(300 * 260).reshape(260, 300) % 2).astype(np.uint8), 'P')
    pal.putpalette([0, 128, 0, 255, 0, 0] + [0] * 762); pal.save(d / 'palette.png', transparency=1)
    Image.fromarray(make_photo(260, 300, seed=3)).save(d / 'png_named.JPEG', format='PNG')
    (d / 'truncated.jpg').write_bytes((d / 'photo.JPEG').read_bytes()[:3000])
    (d / 'text.jpg').write_text('not an image')
    return d


# ------------------------------------------------------------------ the crop box: torchvision's, draw for draw and in distribution
@pytest.mark.parametrize('size', [(375, 500), (1, 300), (40, 2000), (3, 3)])
def test_rrc_box_draws_like_torchvision(size):
    H, W = size
    for seed in range(100):
        torch.manual_seed(seed); p = v2.RandomResizedCrop(8).make_params([torch.empty(3, H, W)]); sa = torch.get_rng_state()
        torch.manual_seed(seed); b = rrc_box(H, W); sb = torch.get_rng_state()
        assert b == (p['top'], p['left'], p['height'], p['width']) and torch.equal(sa, sb)


def _stats(boxes, H, W):
    t, l, h, w = np.asarray(boxes, float).T
    return {'area': h * w / (H * W), 'log ratio': np.log(w / h), 'centre x': (l + w / 2) / W, 'centre y': (t + h / 2) / H}


def _ks(sampler, H=375, W=500, n=5000, seed=1):
    "KS p-values of `sampler`'s boxes against torchvision's get_params (independent streams)."
    torch.manual_seed(seed); a = _stats([sampler(H, W) for _ in range(n)], H, W)
    torch.manual_seed(seed + 100); b = _stats([RRC_v1.get_params(torch.empty(3, H, W), (0.08, 1.), (3 / 4, 4 / 3)) for _ in range(n)], H, W)
    return {k: stats.ks_2samp(a[k], b[k]).pvalue for k in a}


def test_crop_distribution_matches_torchvision():
    "KS tests of area, log ratio and centre position at fixed seeds: no difference (Bonferroni over the four)."
    for H, W in [(375, 500), (500, 375)]:
        p = _ks(rrc_box, H, W)
        print(H, W, {k: round(v, 3) for k, v in p.items()})
        assert min(p.values()) > 0.01 / 4, p


@pytest.mark.parametrize('wrong', ['side uniform', 'ratio uniform', 'centre biased'])
def test_crop_distribution_test_catches_a_different_sampler(wrong):
    "The same test fails for samplers that differ visibly: the side (not the area) uniform, a uniform (not log-uniform) ratio, boxes pushed to the centre."
    def side_uniform(H, W):
        s = torch.empty(1).uniform_(math.sqrt(0.08), 1.).item()
        return rrc_box(H, W, (s * s, s * s))
    def ratio_uniform(H, W):
        r = torch.empty(1).uniform_(0.5, 2.).item()  # a wider, linear range
        return rrc_box(H, W, ratio=(r, r))
    def centre_biased(H, W):
        t, l, h, w = rrc_box(H, W)
        return (t + (H - h) // 2) // 2, (l + (W - w) // 2) // 2, h, w
    p = _ks({'side uniform': side_uniform, 'ratio uniform': ratio_uniform, 'centre biased': centre_biased}[wrong])
    assert min(p.values()) < 1e-6, p


# ------------------------------------------------------------------ the draft decode
def test_dct_scale_is_the_coarsest_that_keeps_the_target():
    assert [dct_scale(h, w, 224, 224) for h, w in [(375, 500), (447, 900), (448, 448), (900, 1200), (1792, 1792)]] == [1, 1, 2, 4, 8]
    for h in range(224, 3000, 37):
        s = dct_scale(h, h, 224, 224)
        assert h / s >= 224 and (s == 8 or h / (2 * s) < 224)


def test_open_drafted_sizes_and_formats(files):
    for s in (1, 2, 4, 8):
        img, got, size = open_drafted(files / 'big.JPEG', lambda H, W: s)
        assert (got, img.size, size) == (s, (math.ceil(1600 / s), math.ceil(1200 / s)), (1200, 1600))
    assert open_drafted(files / 'png_named.JPEG', lambda H, W: 4)[1] == 1   # a PNG in disguise: decoded whole
    for bad in ('truncated.jpg', 'text.jpg', 'missing.jpg'):
        with pytest.raises(ValueError, match=bad): open_drafted(files / bad, lambda H, W: 1)


@pytest.mark.parametrize('name', ['photo.JPEG', 'photo.png', 'cmyk.jpg', 'gray16.png', 'palette.png', 'png_named.JPEG'])
def test_draft_is_pil_where_the_scale_is_1(files, name):
    "Train and eval samples equal chapter 11's bit for bit: the full recipe at 20 seeds (odd files through load_rgb's robust path)."
    whole, tail, crop = create_train_transform(224), DraftPostCrop(), DraftCrop(224)
    for seed in range(20):
        torch.manual_seed(seed); a = whole(load_rgb(files / name))
        torch.manual_seed(seed); b = tail(crop(files / name))
        assert crop.last_scale == 1 and torch.equal(a, b)
    assert torch.equal(create_eval_transform(224)(load_rgb(files / name)), Normalize()(DraftResize(224)(files / name)))


def test_draft_at_a_coarser_scale_is_close_to_the_full_decode(files):
    "Same box, decoded at 1/2 or 1/4: PSNR > 30 dB against the full decode (RandAugment and erasing off)."
    full_crop = v2.RandomResizedCrop(224, interpolation=v2.InterpolationMode.BICUBIC, antialias=True)
    crop, snrs = DraftCrop(224), []
    for seed in range(60):
        torch.manual_seed(seed); a = np.asarray(full_crop(load_rgb(files / 'big.JPEG')), float)
        torch.manual_seed(seed); b = np.asarray(crop(files / 'big.JPEG'), float)
        if crop.last_scale > 1: snrs.append(10 * math.log10(255 ** 2 / ((a - b) ** 2).mean()))
    assert len(snrs) > 20 and min(snrs) > 30, snrs
    ev = np.asarray(v2.Compose(create_eval_transform(224).transforms[:2])(load_rgb(files / 'big.JPEG')), float)
    assert 10 * math.log10(255 ** 2 / ((ev - np.asarray(DraftResize(224)(files / 'big.JPEG'), float)) ** 2).mean()) > 30


def test_fast_randaugment_is_torchvisions():
    img = Image.fromarray(make_photo(224, 224))
    ours, theirs = PILRandAugment(2, 9, 11, fill=mean_fill()), v2.RandAugment(2, 9, 11, v2.InterpolationMode.BICUBIC, list(mean_fill()))
    for seed in range(150):
        torch.manual_seed(seed); a = theirs(img)
        torch.manual_seed(seed); b = ours(img)
        assert np.array_equal(np.asarray(a), np.asarray(b)), seed


def test_draft_train_samples_are_reproducible_per_seed(files):
    crop, tail = DraftCrop(64, interpolation='random'), DraftPostCrop(interpolation='random')
    torch.manual_seed(3); a = tail(crop(files / 'big.JPEG'))
    torch.manual_seed(3); b = tail(crop(files / 'big.JPEG'))
    assert torch.equal(a, b) and a.shape == (3, 64, 64)


# ------------------------------------------------------------------ the fast pipeline
STD255 = torch.tensor((0.229, 0.224, 0.225)).view(3, 1, 1) * 255  # normalised units -> levels


def test_lean_randaugment_is_torchvisions_bit_for_bit():
    "Whole RandAugment ops at 300 seeds, on a photo and on noise (where rounding slips would show): the shears included."
    fill = list(mean_fill())
    theirs, ours = v2.RandAugment(2, 9, 11, v2.InterpolationMode.BICUBIC, fill), KernelRandAugment(2, 9, 11, fill=mean_fill())
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (37, 100, 3), dtype=np.uint8))
    for img in (Image.fromarray(make_photo(224, 224)), noise):
        for seed in range(150):
            torch.manual_seed(seed); a = theirs(img)
            torch.manual_seed(seed); b = ours(img)
            assert np.array_equal(np.asarray(a), np.asarray(b)), seed


@pytest.mark.parametrize('m', [0.27, -0.27, 0.05, -0.3])
def test_shear_bicubic_is_pils(m):
    "Against PIL's own affine (as torchvision calls it): the same bytes, either axis, odd sizes; non-RGB falls back to PIL."
    from t2t_course.data.pipelines import pil_shear
    rng = np.random.default_rng(1)
    for H, W in [(224, 224), (37, 100), (5, 3)]:
        img = Image.fromarray(rng.integers(0, 256, (H, W, 3), dtype=np.uint8))
        for x in (True, False):
            ref = pil_shear(img, m, x, v2.InterpolationMode.BICUBIC, [124, 116, 104])
            assert np.array_equal(np.asarray(shear_bicubic(img, m, x, (124, 116, 104))), np.asarray(ref)), (H, W, x)
    gray = Image.fromarray(rng.integers(0, 256, (30, 40), dtype=np.uint8))
    assert np.array_equal(np.asarray(shear_bicubic(gray, m, True, (7,))), np.asarray(pil_shear(gray, m, True, v2.InterpolationMode.BICUBIC, [7])))


def test_sharpness_rgb_is_pils():
    "Against TF.adjust_sharpness (PIL's ImageEnhance): the same bytes, factors either side of 1, odd and tiny sizes, noise."
    from torchvision.transforms.v2 import functional as TF
    rng = np.random.default_rng(2)
    for H, W in [(224, 224), (37, 100), (3, 3), (2, 9)]:
        for img in (Image.fromarray(rng.integers(0, 256, (H, W, 3), dtype=np.uint8)), Image.fromarray(make_photo(H, W, seed=H))):
            for f in (1.81, 0.19, 1.0, 2.5, 0.0):
                assert np.array_equal(np.asarray(sharpness_rgb(img, f)), np.asarray(TF.adjust_sharpness(img, f))), (H, W, f)


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


@pytest.mark.parametrize('mode', ['bicubic', 'bilinear'])
def test_resize_uint8_is_pils_within_2_levels(mode):
    "Crops of a photo resized to 224 and to 64 x 96, both pass orders (pil_vertical_first): max 2 levels, rarely 1."
    photo = make_photo()
    interp = v2.InterpolationMode(mode)
    orders, diffs = set(), []
    for top, left, h, w in [(0, 0, 375, 500), (10, 40, 300, 200), (50, 20, 120, 460), (3, 7, 240, 250), (100, 100, 60, 80)]:
        for size in [(224, 224), (64, 96)]:
            orders.add(pil_vertical_first(h, w, *size))
            ref = np.asarray(TF_resized_crop(Image.fromarray(photo), top, left, h, w, size, interp), int)
            x = torch.from_numpy(photo[top:top + h, left:left + w].copy())[None].permute(0, 3, 1, 2)
            got = resize_uint8(x, size, mode)[0].permute(1, 2, 0).numpy().astype(int)
            diffs.append(np.abs(got - ref))
    d = np.concatenate([x.ravel() for x in diffs])
    assert orders == {True, False} and d.max() <= 2 and (d > 0).mean() < 0.02, (d.max(), (d > 0).mean())


def TF_resized_crop(img, top, left, h, w, size, interp):
    from torchvision.transforms.v2 import functional as TF
    return TF.resized_crop(img, top, left, h, w, list(size), interp, antialias=True)


@pytest.mark.parametrize('name', ['photo.JPEG', 'big.JPEG', 'photo.png', 'cmyk.jpg', 'gray16.png', 'palette.png', 'png_named.JPEG'])
def test_fast_crop_draws_what_draft_draws(files, name):
    "The same interpolation, box and scale as DraftCrop, the generator left in the same state, the pixels within the resize's rounding."
    fc, dc = FastCrop(96, interpolation='random'), DraftCrop(96, interpolation='random')
    for seed in range(8):
        torch.manual_seed(seed); a = np.asarray(dc(files / name), int); sa = torch.get_rng_state()
        torch.manual_seed(seed); b = np.asarray(fc(files / name), int); sb = torch.get_rng_state()
        assert torch.equal(sa, sb) and fc.last_scale == dc.last_scale and a.shape == b.shape == (96, 96, 3)
        assert np.abs(a - b).max() <= 2, (seed, np.abs(a - b).max())


def test_fast_crop_names_bad_files(files):
    for bad in ('truncated.jpg', 'text.jpg', 'missing.jpg'):
        with pytest.raises(ValueError, match=bad): FastCrop(64)(files / bad)


def test_fast_sample_is_pils_at_the_same_seed(files):
    "The whole training sample through FastCrop, FastPostCrop and BatchPostCrop against chapter 11's transform: pil's draws (erasing included), pil's pixels within the resize's rounding."
    pil_tf, fc, ft, bt = create_train_transform(224), FastCrop(224), FastPostCrop(), BatchPostCrop()
    diffs, erased = [], 0
    for seed in range(40):
        f = files / ('photo.JPEG' if seed % 2 else 'photo.png')  # the scale is 1: pil's decode
        torch.manual_seed(seed); a = pil_tf(load_rgb(f)); sa = torch.get_rng_state()
        torch.manual_seed(seed); x, e = ft(fc(f)); sb = torch.get_rng_state()
        assert torch.equal(sa, sb), seed  # every draw made, in pil's order
        b = bt(collate_uint8([((x, e), 0)]).images)[0]
        if e is not None:  # the erased box holds the same Gaussian noise, bit for bit
            erased += 1; top, left, h, w, _ = e
            assert torch.equal(a[:, top:top + h, left:left + w], b[:, top:top + h, left:left + w])
        diffs.append(((a - b).abs() * STD255).flatten())
    d = torch.cat(diffs)
    assert erased > 0 and d.mean() < 0.2, (erased, d.mean())


def test_erase_params_draws_what_random_erasing_draws():
    x = torch.zeros(3, 224, 224)
    for seed in range(200):
        torch.manual_seed(seed); p = v2.RandomErasing(p=0.25, value='random')
        q = p.make_params([x]) if torch.rand(1) < 0.25 else None; sa = torch.get_rng_state()
        torch.manual_seed(seed); e = erase_params(224, 224); sb = torch.get_rng_state()
        assert torch.equal(sa, sb) and (e is None) == (q is None or q['v'] is None)
        if e is not None: assert e[:4] == (q['i'], q['j'], q['h'], q['w']) and torch.equal(e[4], q['v'])


def test_batch_tail_is_to_dtype_normalize_and_erase():
    torch.manual_seed(0)
    x = torch.randint(0, 256, (3, 20, 30, 3), dtype=torch.uint8)
    fill, const = torch.randn(3, 5, 7), torch.zeros(1, 1, 1)
    b = collate_uint8([((x[0], None), 0), ((x[1], (2, 3, 5, 7, fill)), 1), ((x[2], (0, 1, 4, 2, const)), 2)]).images
    assert b.noise.shape == (3 * 5 * 7 + 1,)  # the fills in one tensor
    out = BatchPostCrop()(b)
    ref = v2.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))(x.permute(0, 3, 1, 2).float() / 255)
    ref[1, :, 2:7, 3:10] = fill; ref[2, :, 0:4, 1:3] = 0
    assert out.shape == (3, 3, 20, 30) and torch.allclose(out, ref, atol=1e-6)


def test_fast_loader_repeats_and_skips(files, tmp_path):
    "Two epochs at the same seed through a worker process: the same batches; bad files skipped and named; eval within the resize of draft's."
    root = write_jpegs(tmp_path / 'train', 10, (90, 120))
    for n in ('cmyk.jpg', 'png_named.JPEG', 'gray16.png', 'text.jpg', 'truncated.jpg'): shutil.copy(files / n, root / 'n01' / n)
    ds = ImageFolderDataset(root, FastPostCrop(), skip_bad_images=True, loader=FastCrop(48))
    dl = BatchTransformLoader(create_loader(ds, 4, num_workers=1, collate_fn=collate_uint8), BatchPostCrop(), 'cpu')
    def epoch():
        torch.manual_seed(0); return list(dl)
    a, b = epoch(), epoch()
    assert all(torch.equal(x.images, y.images) and torch.equal(x.targets, y.targets) for x, y in zip(a, b) if x.images is not None)
    assert sum(len(x.images) for x in a if x.images is not None) == len(ds) - 2
    assert sorted(Path(p).name for x in a for p, _ in x.skipped) == ['text.jpg', 'truncated.jpg']
    val = write_jpegs(tmp_path / 'val', 4, (90, 120), seed=7)
    for n in ('cmyk.jpg', 'png_named.JPEG', 'gray16.png'): shutil.copy(files / n, val / 'n00' / n)
    fast, draft = create_pipeline('fast', tmp_path, 48), create_pipeline('draft', tmp_path, 48)
    for i in range(len(fast.val)):
        u8 = collate_uint8([fast.val[i]]).images
        assert (((fast.val_transform(u8)[0] - draft.val[i][0]).abs() * STD255).max()) <= 2.01


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


@pytest.mark.parametrize('name', list(PIPELINES))
def test_every_pipeline_gives_batches_of_the_recipe(name, tmp_path):
    root = tmp_path / 'inet'
    write_jpegs(root / 'train', 6, (90, 120)); write_jpegs(root / 'val', 4, (90, 120), seed=9)
    p = create_pipeline(name, root, 32)
    for split, ds in (('train', p.train), ('val', p.val)):
        x, y, skipped = next(iter(p.wrap(create_loader(ds, 2, collate_fn=p.collate_fn), split, 'cpu')))
        assert x.shape == (2, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (2,) and skipped == []


# ------------------------------------------------------------------ t2t_train --pipeline
def bad_folder(root, files):
    write_jpegs(root / 'train', 16, (40, 48), classes=4); write_jpegs(root / 'val', 8, (40, 48), classes=4, seed=50)
    for n in ('cmyk.jpg', 'png_named.JPEG', 'gray16.png', 'text.jpg', 'truncated.jpg'): shutil.copy(files / n, root / 'train' / 'n00' / n)
    return root


@pytest.mark.parametrize('pipeline', [p for p in PIPELINES if p != 'gpu'])
def test_t2t_train_every_cpu_pipeline_names_or_skips_bad_files(pipeline, files, tmp_path):
    root = bad_folder(tmp_path / 'data', files)
    code, _, err = call(['--data', str(root), *TINY_ARGS, '--pipeline', pipeline, '--device', 'cpu', '--workers', '0',
                         '--output', str(tmp_path / 'a')])
    assert code == 1 and 'cannot decode image file' in err and ('text.jpg' in err or 'truncated.jpg' in err), err
    code, out, err = call(['--data', str(root), *TINY_ARGS, '--pipeline', pipeline, '--device', 'cpu', '--workers', '1',
                           '-b', '3', '--skip-bad-images', '--output', str(tmp_path / 'b')])  # 21 files: every one is seen
    assert code == 0, err
    assert 'skipped 2 bad image sample(s) from 2 file(s)' in out and f"pipeline='{pipeline}'" in out
    ck = torch.load(tmp_path / 'b' / 'last.pth', weights_only=True)
    assert ck['config']['pipeline'] == pipeline


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the message a machine without CUDA gets')
def test_gpu_pipeline_without_cuda_is_a_clear_setup_error(tmp_path):
    root = write_jpegs(tmp_path / 'd' / 'train', 4, (40, 48)).parent
    write_jpegs(root / 'val', 2, (40, 48))
    code, _, err = call(['--data', str(root), *TINY_ARGS, '--pipeline', 'gpu', '--output', str(tmp_path / 'o')])
    assert code == 2 and '--pipeline gpu decodes and augments on a CUDA GPU' in err and '--pipeline draft' in err, err


def test_help_says_the_default_on_cpu_and_gpu_and_why():
    h = next(a.help for a in build_parser()._actions if a.dest == 'pipeline')
    flat = ' '.join(h.split())
    assert 'default: draft, on the CPU and on a GPU' in flat and 'because' in flat and 'not been measured' in flat


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


@pytest.mark.cuda
def test_t2t_train_gpu_pipeline_on_cuda(files, tmp_path):
    root = bad_folder(tmp_path / 'data', files)
    code, out, err = call(['--data', str(root), *TINY_ARGS, '--pipeline', 'gpu', '--device', 'cuda', '--workers', '1',
                           '-b', '3', '--skip-bad-images', '--output', str(tmp_path / 'g')])
    assert code == 0, err
    assert 'skipped 2 bad image sample(s) from 2 file(s)' in out
    assert 'pipeline gpu:' in out and 'by PIL on the CPU' in out


@pytest.mark.cuda
def test_fast_batch_step_on_cuda_is_the_cpu_one(files):
    "BatchPostCrop where the batch lands on a GPU: the CPU's result, the erasing noise included."
    fc, ft = FastCrop(64), FastPostCrop(re_prob=1.)
    torch.manual_seed(0)
    b = collate_uint8([(ft(fc(files / 'photo.JPEG')), 0) for _ in range(4)]).images
    cpu = BatchPostCrop()(b)
    cuda = BatchPostCrop()(type(b)(b.pixels.cuda(), b.erase, b.noise.cuda()))
    assert cuda.device.type == 'cuda' and torch.allclose(cuda.cpu(), cpu, atol=1e-6)


@pytest.mark.cuda
def test_t2t_train_fast_pipeline_on_cuda(files, tmp_path):
    "The fast pipeline's workers on the CPU, its batch step on the GPU: bad files skipped and counted, a checkpoint."
    root = bad_folder(tmp_path / 'data', files)
    code, out, err = call(['--data', str(root), *TINY_ARGS, '--pipeline', 'fast', '--device', 'cuda', '--workers', '1',
                           '-b', '3', '--skip-bad-images', '--output', str(tmp_path / 'f')])
    assert code == 0, err
    assert 'skipped 2 bad image sample(s) from 2 file(s)' in out and "pipeline='fast'" in out

