"""Tests of `t2t_course.data` (chapter 11): decoding odd and broken files, folder scanning, skipping bad images
through worker processes, the recipe transforms, MixUp/CutMix and the loss, the embedded digits folder (also with
two processes at once), and the ILSVRC2012 validation reorganiser in all label formats, as a function and a CLI.

Every image is generated in tmp_path; references are computed independently (NumPy formulas, PIL directly,
torchvision's own devkit parser, scikit-learn's arrays)."""
import json, os, subprocess, sys, tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image, ImageFile
from torchvision.transforms import v2

from support.warm import WarmPopen, warm_run
from t2t_course.core import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
import t2t_course.data as data
import t2t_course.data.datasets as datasets  # the built-in datasets' module (chapter 11)
from t2t_course.data import (BadImageError, BadImageLog, BadSample, DATA_PRESETS, FOLDER_MARKER, ImageFolderDataset,
                             MixupCutmix, collate_skip_bad, create_datasets, create_eval_transform, create_loader,
                             create_loss, create_train_transform, digits_folder, load_rgb, prepare_imagenet_val,
                             prepare_val_cli, read_val_labels, scan_image_folder)

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def _run(*args, **kw):
    "Run `python args...` from the repo root with the package importable."
    env = {**os.environ, 'PYTHONPATH': str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', '')}
    return warm_run([PY, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, **kw)


# ---------------------------------------------------------------------------------------------------- decoding

def _write_jpeg(path, size=(48, 40), seed=0):
    arr = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(arr).save(path, quality=90)
    return path


@pytest.fixture
def zoo(tmp_path):
    "Tiny files in every awkward mode plus broken ones; returns (folder, expected RGB arrays by name)."
    d, exp = tmp_path / 'zoo', {}
    d.mkdir()
    g = np.random.default_rng(1).integers(0, 256, (12, 10), dtype=np.uint8)
    Image.fromarray(g, 'L').save(d / 'gray.png'); exp['gray.png'] = np.repeat(g[..., None], 3, -1)
    b = (np.arange(120).reshape(12, 10) % 3 == 0)
    Image.fromarray(b).save(d / 'bits.png'); exp['bits.png'] = np.repeat((b * 255).astype(np.uint8)[..., None], 3, -1)
    # CMYK JPEG: pure colours, checked against the CMYK definition with JPEG tolerance
    cmyk = np.zeros((16, 16, 4), np.uint8)
    cmyk[:8, :, 1:3] = 255          # C=0 M=255 Y=255 K=0 -> red
    cmyk[8:, :, 3] = 255            # K=255 -> black
    Image.fromarray(cmyk, 'CMYK').save(d / 'cmyk.jpg', quality=95)
    c, m, y, k = [cmyk[..., i].astype(float) / 255 for i in range(4)]
    exp['cmyk.jpg'] = np.stack([255 * (1 - c) * (1 - k), 255 * (1 - m) * (1 - k), 255 * (1 - y) * (1 - k)], -1)
    # RGBA: alpha composited on white, by the formula
    rgba = np.random.default_rng(2).integers(0, 256, (12, 10, 4), dtype=np.uint8)
    rgba[0, 0, 3], rgba[0, 1, 3] = 0, 255
    Image.fromarray(rgba, 'RGBA').save(d / 'rgba.png')
    a = rgba[..., 3:].astype(float) / 255
    exp['rgba.png'] = rgba[..., :3] * a + 255 * (1 - a)
    la = np.random.default_rng(3).integers(0, 256, (12, 10, 2), dtype=np.uint8)
    Image.fromarray(la, 'LA').save(d / 'la.png')
    a = la[..., 1:].astype(float) / 255
    exp['la.png'] = np.repeat(la[..., :1] * a + 255 * (1 - a), 3, -1)
    # palette with and without a transparent index
    idx = (np.arange(120).reshape(12, 10) % 3).astype(np.uint8)
    palette = [10, 20, 30, 200, 100, 0, 0, 0, 255]
    p = Image.fromarray(idx, 'P'); p.putpalette(palette + [0] * (768 - len(palette)))
    p.save(d / 'pal_t.png', transparency=2)
    p.save(d / 'pal.png')
    colours = np.array(palette).reshape(3, 3)
    exp['pal.png'] = colours[idx]
    exp['pal_t.png'] = np.where((idx == 2)[..., None], 255, colours[idx])
    # 16-bit PNG and TIFF, 32-bit int TIFF: divide by 257
    v16 = np.random.default_rng(4).integers(0, 65536, (12, 10)).astype(np.uint16)
    v16[0, :4] = [0, 257, 65535, 32896]
    Image.fromarray(v16).save(d / 'gray16.png'); Image.fromarray(v16).save(d / 'gray16.tif')
    Image.fromarray(v16.astype(np.int32)).save(d / 'gray32.tif')
    e16 = np.repeat(np.floor(v16.astype(float) / 257 + 0.5)[..., None], 3, -1)
    exp['gray16.png'] = exp['gray16.tif'] = exp['gray32.tif'] = e16
    rgb = _write_jpeg(d / 'photo.JPEG')
    with Image.open(rgb) as im: exp['photo.JPEG'] = np.asarray(im.convert('RGB'))
    # broken files
    full = _write_jpeg(tmp_path / 'big.jpg', size=(64, 64)).read_bytes()
    (d / 'truncated.jpg').write_bytes(full[:len(full) * 6 // 10])
    (d / 'text.jpg').write_text('not an image at all')
    (d / 'empty.png').write_bytes(b'')
    return d, exp


def test_load_rgb_modes(zoo):
    d, exp = zoo
    for name, expected in exp.items():
        out = load_rgb(d / name)
        assert out.mode == 'RGB', name
        arr = np.asarray(out).astype(float)
        assert arr.shape == expected.shape, name
        tol = 4 if name.endswith('jpg') else 1  # JPEG noise; alpha_composite rounds by up to 1
        assert np.abs(arr - expected).max() <= tol, (name, np.abs(arr - expected).max())
    # the 16-bit values are scaled, not clipped: the specific values
    assert np.asarray(load_rgb(d / 'gray16.png'))[0, :4, 0].tolist() == [0, 1, 255, 128]


@pytest.mark.parametrize('name', ['truncated.jpg', 'text.jpg', 'empty.png', 'missing.png'])
def test_load_rgb_bad_files(zoo, name):
    d, _ = zoo
    assert not ImageFile.LOAD_TRUNCATED_IMAGES  # importing the module must not switch PIL's silent mode on
    with pytest.raises(BadImageError, match=name):
        load_rgb(d / name)
    assert issubclass(BadImageError, ValueError)


# ---------------------------------------------------------------------------------------------------- folders

def _tiny_imagenet(root, n=4, bad=(), size=(40, 32)):
    "root/{train,val}/{n01,n02,n03}/*.JPEG with distinct colours per class; `bad`: (split, class, name, bytes)."
    colours = {'n01': (255, 0, 0), 'n02': (0, 255, 0), 'n03': (0, 0, 255)}
    for split in ('train', 'val'):
        for c, col in colours.items():
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(n): Image.new('RGB', size, col).save(root / split / c / f'{c}_{i:02d}.JPEG')
    for split, c, name, content in bad: (root / split / c / name).write_bytes(content)
    return root


def test_scan_folder_basics(tmp_path):
    root = _tiny_imagenet(tmp_path / 'inet', n=2)
    (root / 'train/n01/UPPER.PNG').write_bytes((root / 'train/n01/n01_00.JPEG').read_bytes())  # case-insensitive ext
    (root / 'train/n01/notes.txt').write_text('ignored')
    (root / 'train/n01/._n01_00.JPEG').write_bytes(b'macOS resource fork')                  # hidden: ignored
    (root / 'train/.ipynb_checkpoints').mkdir()                                               # hidden dir: ignored
    (root / 'train/n02/sub').mkdir(); Image.new('RGB', (8, 8)).save(root / 'train/n02/sub/deep.jpg')  # recursive
    ds = ImageFolderDataset(root / 'train')
    assert ds.classes == ['n01', 'n02', 'n03'] and ds.class_to_idx == {'n01': 0, 'n02': 1, 'n03': 2}
    names = sorted(Path(p).name for p, _ in ds.samples)
    assert names == sorted(['n01_00.JPEG', 'n01_01.JPEG', 'UPPER.PNG', 'n02_00.JPEG', 'n02_01.JPEG', 'deep.jpg',
                            'n03_00.JPEG', 'n03_01.JPEG'])
    assert ds.targets == [t for _, t in ds.samples] and len(ds) == 8
    for p, t in ds.samples: assert Path(p).relative_to(root / 'train').parts[0] == ds.classes[t]
    img, t = ds[0]
    assert isinstance(img, Image.Image) and img.mode == 'RGB'
    # validation with the training classes: a class missing from val keeps the indices aligned
    import shutil; shutil.rmtree(root / 'val/n01')
    val = ImageFolderDataset(root / 'val', classes=ds.classes)
    assert val.class_to_idx == ds.class_to_idx and sorted(set(val.targets)) == [1, 2]


def test_scan_folder_errors(tmp_path):
    root = _tiny_imagenet(tmp_path / 'inet', n=1)
    with pytest.raises(FileNotFoundError, match='test'): ImageFolderDataset(root / 'test')
    with pytest.raises(ValueError, match='holds split folders'): ImageFolderDataset(root)  # the dataset root, not a split
    (root / 'empty_split').mkdir()
    with pytest.raises(ValueError, match='empty_split has no class folders'): ImageFolderDataset(root / 'empty_split')
    (root / 'train/n04').mkdir()
    with pytest.raises(ValueError, match=r'n04 holds no image files'): ImageFolderDataset(root / 'train')
    (root / 'train/n04').rmdir()
    train = ImageFolderDataset(root / 'train')
    (root / 'val/n09').mkdir(); Image.new('RGB', (8, 8)).save(root / 'val/n09/x.png')
    with pytest.raises(ValueError, match=r'val/n09 is not one of the 3 given classes'):
        ImageFolderDataset(root / 'val', classes=train.classes)
    with pytest.raises(ValueError, match='duplicate'): scan_image_folder(root / 'train', classes=['n01', 'n01'])


def _bad_root(tmp_path):
    "5 good images per class in 3 classes, plus 3 bad files whose sorted names put them together in class n02."
    bad = [('train', 'n02', 'n02_zz_empty.png', b''), ('train', 'n02', 'n02_zz_text.jpg', b'hello'),
           ('train', 'n02', 'n02_zz_trunc.jpg', _write_jpeg(tmp_path / 'b.jpg', (64, 64)).read_bytes()[:1500])]
    return _tiny_imagenet(tmp_path / 'inet', n=5, bad=bad)


@pytest.mark.parametrize('num_workers', [0, 2])
def test_skip_bad_images_counts_reach_main_process(tmp_path, num_workers):
    root = _bad_root(tmp_path)
    tf = create_eval_transform(16, crop_pct=1.0)
    ds = ImageFolderDataset(root / 'train', tf, skip_bad_images=True)
    assert len(ds) == 18
    bad_idx = [i for i, (p, _) in enumerate(ds.samples) if '_zz_' in p]
    assert bad_idx == [10, 11, 12]  # n02's 5 good images sort first: with batch_size 3, batch 3 is idx 9..11, batch 4 is 12..14
    # batch size 1 around the bad files: a batch of only bad samples must come out as images=None
    log, seen, empty_batches = BadImageLog(), 0, 0
    for images, targets, skipped in create_loader(ds, batch_size=1, num_workers=num_workers):
        log.update(skipped)
        if images is None: empty_batches += 1; continue
        assert images.shape[1:] == (3, 16, 16) and targets.dtype == torch.int64
        seen += len(images)
    assert (log.count, seen, empty_batches) == (3, 15, 3)
    assert [Path(p).name for p in log.paths] == ['n02_zz_empty.png', 'n02_zz_text.jpg', 'n02_zz_trunc.jpg']
    assert 'skipped 3 bad image sample(s) from 3 file(s)' in log.report() and 'n02_zz_trunc.jpg' in log.report()
    # larger batches, two epochs: counted every time they are met; paths stay unique
    log2 = BadImageLog()
    for _ in range(2):
        for images, targets, skipped in create_loader(ds, batch_size=3, num_workers=num_workers, shuffle=True):
            log2.update(skipped)
            if images is not None: assert len(images) == len(targets) <= 3
    assert log2.count == 6 and len(log2.paths) == 3
    assert BadImageLog().merge(log).merge(log2).count == 9


@pytest.mark.parametrize('num_workers', [0, 2])
def test_bad_image_stops_the_run_by_default(tmp_path, num_workers):
    root = _bad_root(tmp_path)
    ds = ImageFolderDataset(root / 'train', create_eval_transform(16, crop_pct=1.0))
    it = iter(create_loader(ds, batch_size=4, num_workers=num_workers))
    try:
        with pytest.raises(BadImageError, match=r'n02_zz_(empty|text|trunc)'):
            for _ in it: pass
    finally:  # torch frees a failed iterator only in a gc cycle, whose worker shutdown then waits 2 x 5 s
        if num_workers: it._shutdown_workers()


def test_collate_skip_bad_direct():
    good = [(torch.zeros(3, 2, 2), 1), (torch.ones(3, 2, 2), 0)]
    b = collate_skip_bad([good[0], BadSample('a.jpg', 'boom'), good[1]])
    assert b.images.shape == (2, 3, 2, 2) and b.targets.tolist() == [1, 0] and b.skipped == [('a.jpg', 'boom')]
    b = collate_skip_bad([BadSample('a.jpg', 'x'), BadSample('b.jpg', 'y')])
    assert b.images is None and b.targets is None and len(b.skipped) == 2
    assert BadImageLog().report() == 'no bad images skipped'


def test_imagenet_layout_end_to_end(tmp_path):
    "The ImageNet path: folders -> datasets with the full recipe -> loader with workers -> mixing -> loss -> a step."
    root = _tiny_imagenet(tmp_path / 'inet', n=4, size=(50, 38))
    train, val = create_datasets(root, img_size=32, preset='imagenet')
    assert val.classes == train.classes and len(train) == len(val) == 12
    mixer = MixupCutmix(len(train.classes), **DATA_PRESETS['imagenet']['mix'])
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, len(train.classes)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loss, eval_loss = create_loss(True, DATA_PRESETS['imagenet']['label_smoothing']), create_loss(False)
    torch.manual_seed(0)
    for images, targets, skipped in create_loader(train, 4, shuffle=True, num_workers=2, drop_last=True):
        assert skipped == [] and images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
        images, soft = mixer(images, targets)
        assert soft.shape == (4, 3) and torch.allclose(soft.sum(1), torch.ones(4))
        loss = train_loss(model(images), soft)
        opt.zero_grad(); loss.backward(); opt.step()
        assert torch.isfinite(loss)
    with torch.no_grad():
        for images, targets, _ in create_loader(val, 6):
            assert images.shape == (6, 3, 32, 32)
            assert torch.isfinite(eval_loss(model(images), targets))
    # a uniformly coloured val image comes out as its colour, normalised
    x, t = val[0]
    col = torch.tensor([255., 0., 0.]) / 255
    exp = ((col - torch.tensor(IMAGENET_DEFAULT_MEAN)) / torch.tensor(IMAGENET_DEFAULT_STD)).view(3, 1, 1)
    assert val.classes[t] == 'n01' and torch.allclose(x, exp.expand_as(x), atol=0.05)  # JPEG: colours within ~2/255


# ---------------------------------------------------------------------------------------------------- transforms

def _norm(arr):
    x = torch.from_numpy(np.asarray(arr, dtype=np.float32) / 255).permute(2, 0, 1)
    return (x - torch.tensor(IMAGENET_DEFAULT_MEAN).view(3, 1, 1)) / torch.tensor(IMAGENET_DEFAULT_STD).view(3, 1, 1)


@pytest.mark.parametrize('size', [32, (24, 40)])
def test_transform_shapes_and_normalisation(size):
    H, W = (size, size) if isinstance(size, int) else size
    torch.manual_seed(0)
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (70, 90, 3), dtype=np.uint8))
    for tf in (create_train_transform(size), create_train_transform(size, interpolation='random'),
               create_eval_transform(size), create_eval_transform(size, crop_pct=1.0)):
        for _ in range(5):
            out = tf(img)
            assert type(out) is torch.Tensor and out.dtype == torch.float32 and out.shape == (3, H, W)
    flat = Image.new('RGB', (90, 70), (10, 120, 250))
    exp = _norm(np.full((H, W, 3), (10, 120, 250)))
    assert torch.allclose(create_train_transform(size, rand_augment=False, re_prob=0.)(flat), exp, atol=1e-5)
    assert torch.allclose(create_eval_transform(size)(flat), exp, atol=1e-5)
    custom = create_eval_transform(size, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))(flat)
    assert torch.allclose(custom[:, 0, 0], torch.tensor([10., 120., 250.]) / 255 * 2 - 1, atol=1e-5)


def test_eval_transform_geometry():
    "256 x 320 at img_size 224: resize the shorter side to int(224 / 0.9) = 248 (so 248 x 310), centre-crop 224."
    arr = np.random.default_rng(0).integers(0, 256, (256, 320, 3), dtype=np.uint8)
    img = Image.fromarray(arr)
    ref = img.resize((310, 248), Image.BICUBIC)
    ref = np.asarray(ref)[12:12 + 224, 43:43 + 224]  # (248 - 224) / 2 = 12, (310 - 224) / 2 = 43
    out = create_eval_transform(224)(img)
    assert torch.allclose(out, _norm(ref), atol=1e-5)
    # crop_pct 1.0 resizes straight to 224 on the shorter side
    ref = np.asarray(img.resize((280, 224), Image.BICUBIC))[:, 28:28 + 224]
    assert torch.allclose(create_eval_transform(224, crop_pct=1.0)(img), _norm(ref), atol=1e-5)
    # non-square (H, W) = (160, 224): cover (177, 248) keeping the aspect ratio -> 198 x 248, centre-crop
    ref = np.asarray(img.resize((248, 198), Image.BICUBIC))[19:19 + 160, 12:12 + 224]
    assert torch.allclose(create_eval_transform((160, 224))(img), _norm(ref), atol=1e-5)


def test_train_transform_switches():
    tf = create_train_transform(32)
    kinds = [type(t).__name__ for t in tf.transforms]
    assert kinds == ['RandomResizedCrop', 'RandomHorizontalFlip', 'RandAugment', 'ToImage', 'ToDtype', 'Normalize',
                     'RandomErasing', 'ToPureTensor']
    rrc, flip, ra, *_, er, _ = tf.transforms
    assert rrc.scale == (0.08, 1.0) and rrc.interpolation == v2.InterpolationMode.BICUBIC and rrc.antialias
    assert flip.p == 0.5 and er.p == 0.25 and er.value is None  # value='random' -> per-pixel normal noise
    assert (ra.num_ops, ra.magnitude, ra.num_magnitude_bins) == (2, 9, 11)
    mean255 = [round(255 * m) for m in IMAGENET_DEFAULT_MEAN]
    assert list(ra.fill) == mean255 == [124, 116, 104]
    light = create_train_transform(32, scale=(0.9, 1.0), hflip=0., rand_augment=False, re_prob=0.)
    assert [type(t).__name__ for t in light.transforms] == ['RandomResizedCrop', 'ToImage', 'ToDtype', 'Normalize',
                                                              'ToPureTensor']
    assert light.transforms[0].scale == (0.9, 1.0)
    assert type(create_train_transform(32, interpolation='random').transforms[0]).__name__ == 'RandomChoice'
    assert create_train_transform(32, re_mode='const').transforms[-2].value == [0.0]
    # scale 1, ratio 1 on a square picture: the crop is the whole picture, resized like PIL resizes it
    arr = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    full = create_train_transform(32, scale=(1., 1.), ratio=(1., 1.), hflip=0., rand_augment=False, re_prob=0.)
    ref = np.asarray(Image.fromarray(arr).resize((32, 32), Image.BICUBIC))
    assert torch.allclose(full(Image.fromarray(arr)), _norm(ref), atol=1e-5)
    for bad, match in [(dict(ra_magnitude=11), 'index in 0..10'), (dict(re_mode='box'), 're_mode'),
                       (dict(img_size=0), 'img_size must be positive'), (dict(interpolation='cubic'), 'cubic')]:
        with pytest.raises(ValueError, match=match): create_train_transform(**bad)
    with pytest.raises(ValueError, match='crop_pct'): create_eval_transform(224, crop_pct=0.)


def test_digits_preset_keeps_digits_intact():
    p = DATA_PRESETS['digits']
    assert p['train']['hflip'] == 0 and p['train']['rand_augment'] is False and p['train']['re_prob'] == 0
    assert p['train']['scale'][0] >= 0.5 and p['eval']['crop_pct'] == 1.0


# ---------------------------------------------------------------------------------------------------- mixing, loss

def test_mixup_cutmix_targets_and_pixels():
    torch.manual_seed(0)
    B, K = 8, 12
    x = torch.arange(B, dtype=torch.float32).view(B, 1, 1, 1).expand(B, 3, 16, 16).clone()  # image i is all i
    y = torch.arange(B) + 2
    seen = set()
    mixer = MixupCutmix(K)  # the recipe: prob 1, switch 0.5
    for _ in range(40):
        xm, ym = mixer(x, y)
        assert ym.shape == (B, K) and ym.dtype == torch.float32
        assert torch.allclose(ym.sum(1), torch.ones(B))
        lam = ym[torch.arange(B), y]                          # weight of each sample's own class
        other = ym[torch.arange(B), y.roll(1)]                # weight of the partner's class
        assert torch.allclose(lam + other, torch.ones(B))
        is_cutmix = bool(((xm == x) | (xm == x.roll(1, 0))).all()) and not torch.allclose(lam, torch.ones(B))
        if is_cutmix:
            assert torch.allclose((xm == x).float().mean((1, 2, 3)), lam, atol=1e-6)
        else:
            l = lam.view(B, 1, 1, 1)
            assert torch.allclose(xm, l * x + (1 - l) * x.roll(1, 0), atol=1e-5)
        seen.add('cutmix' if is_cutmix else 'mixup')
    assert seen == {'mixup', 'cutmix'}  # both are chosen, per batch
    # switches
    xo, yo = MixupCutmix(K, prob=0.)(x, y)
    assert torch.equal(xo, x) and torch.equal(yo, F.one_hot(y, K).float())
    xo, yo = MixupCutmix(K, mixup_alpha=0., cutmix_alpha=0.)(x, y)
    assert torch.equal(xo, x) and not MixupCutmix(K, mixup_alpha=0., cutmix_alpha=0.).enabled
    for _ in range(5):
        xc, _ = MixupCutmix(K, switch_prob=1.)(x, y)
        assert ((xc == x) | (xc == x.roll(1, 0))).all()  # always CutMix: every pixel from one of the two
    with pytest.raises(ValueError, match='>= 0'): MixupCutmix(K, cutmix_alpha=-0.5)
    with pytest.raises(ValueError, match=r'\(B,\)'): MixupCutmix(K)(x, F.one_hot(y, K))


def test_loss_with_soft_and_hard_targets():
    torch.manual_seed(0)
    B, K, eps = 6, 5, 0.1
    logits, y = torch.randn(B, K), torch.randint(0, K, (B,))
    logp = logits.log_softmax(-1)
    train_loss = create_loss(True, eps)
    hard_ref = -(((1 - eps) * F.one_hot(y, K) + eps / K) * logp).sum(-1).mean()
    assert torch.allclose(train_loss(logits, y), hard_ref, atol=1e-6)
    soft = torch.softmax(torch.randn(B, K), -1)
    soft_ref = -(((1 - eps) * soft + eps / K) * logp).sum(-1).mean()
    assert torch.allclose(train_loss(logits, soft), soft_ref, atol=1e-6)
    assert create_loss(False).label_smoothing == 0.0
    assert torch.allclose(create_loss(False)(logits, y), F.nll_loss(logp, y))
    with pytest.raises(ValueError, match='label_smoothing'): create_loss(True, 1.0)


# ---------------------------------------------------------------------------------------------------- digits

def test_digits_folder(tmp_path, monkeypatch):
    from sklearn.datasets import load_digits
    ref = load_digits()
    monkeypatch.setenv('T2T_COURSE_CACHE', str(tmp_path / 'cache'))
    root = digits_folder()
    assert root == tmp_path / 'cache' / 'digits' and (root / FOLDER_MARKER).is_file()
    train, val = ImageFolderDataset(root / 'train'), ImageFolderDataset(root / 'val')
    assert (len(train), len(val)) == (1437, 360)
    assert train.classes == val.classes == [str(c) for c in range(10)]
    per_class = np.bincount(train.targets, minlength=10) + np.bincount(val.targets, minlength=10)
    assert per_class.tolist() == np.bincount(ref.target).tolist()
    assert np.all(np.abs(np.bincount(val.targets) - 0.2 * np.bincount(ref.target)) <= 1)  # stratified
    stems = [int(Path(p).stem) for p, _ in train.samples + val.samples]
    assert sorted(stems) == list(range(1797))  # every image exactly once
    for k in (0, 500, 1436):
        p, t = train.samples[k]
        i = int(Path(p).stem)
        with Image.open(p) as im: assert im.mode == 'L' and im.size == (8, 8); px = np.asarray(im)
        assert int(train.classes[t]) == ref.target[i]
        assert np.abs(px.astype(float) - ref.images[i] * 255 / 16).max() <= 0.5
    # idempotent: the second call reuses the folder without rewriting it
    mtime = (root / FOLDER_MARKER).stat().st_mtime_ns
    assert digits_folder(tmp_path / 'cache') == root and (root / FOLDER_MARKER).stat().st_mtime_ns == mtime
    # the split is the same in another cache
    other = digits_folder(tmp_path / 'other')
    assert sorted(p.name for p in (other / 'val').rglob('*.png')) == sorted(p.name for p in (root / 'val').rglob('*.png'))
    # an incomplete folder is an error, not silently reused
    (tmp_path / 'broken' / 'digits' / 'train').mkdir(parents=True)
    with pytest.raises(ValueError, match='incomplete'): digits_folder(tmp_path / 'broken')


def test_digits_folder_lost_race(tmp_path, monkeypatch):
    "Another process publishes its copy while we write ours: our rename fails, we use theirs and leave no temp folder."
    real = datasets._write_digits
    def write_and_lose(folder, *a, **kw):
        counts = real(folder, *a, **kw)
        theirs = tmp_path / 'theirs'
        (theirs / FOLDER_MARKER).parent.mkdir(parents=True)
        (theirs / FOLDER_MARKER).write_text(json.dumps(real(theirs)))  # a finished copy, as build_folder_once publishes it
        os.rename(theirs, tmp_path / 'digits')  # the other process wins
        (tmp_path / 'digits' / 'winner').write_text('theirs')
        return counts
    monkeypatch.setattr(datasets, '_write_digits', write_and_lose)
    root = digits_folder(tmp_path)
    assert (root / 'winner').read_text() == 'theirs'
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith('.digits-')] == []


def test_digits_folder_two_processes_at_once(tmp_path):
    code = 'import sys; from t2t_course.data import digits_folder; print(digits_folder(sys.argv[1]))'
    env = {**os.environ, 'PYTHONPATH': str(REPO)}
    procs = [WarmPopen([PY, '-c', code, str(tmp_path)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert {o.strip() for o, _ in outs} == {str(tmp_path / 'digits')}
    assert sorted(p.name for p in tmp_path.iterdir()) == ['digits']  # no temp folder left behind
    assert len(list((tmp_path / 'digits').rglob('*.png'))) == 1797


# ---------------------------------------------------------------------------------------------------- validation reorganiser

WNIDS = {1: 'n02119789', 2: 'n02100735', 3: 'n02110185', 4: 'n02096294'}
GT = [3, 1, 4, 1, 2, 2, 4]  # ILSVRC2012_IDs of images 1..7


def _fake_meta_mat(path):
    "A meta.mat in the devkit's layout: a (n, 1) struct array `synsets`, leaves first, then a non-leaf synset."
    from scipy.io import savemat
    fields = ['ILSVRC2012_ID', 'WNID', 'words', 'gloss', 'num_children', 'children', 'wordnet_height',
              'num_train_images']
    rows = [(i, w, f'class {i}, alias', 0) for i, w in WNIDS.items()] + [(1001, 'n00001740', 'entity', 2)]
    arr = np.zeros((len(rows), 1), dtype=[(f, 'O') for f in fields])
    for k, (i, w, words, nc) in enumerate(rows):
        arr[k, 0] = (np.array([[i]], np.uint16), np.array([w]), np.array([words]), np.array(['gloss']),
                     np.array([[nc]], np.uint16), np.arange(1, nc + 1, dtype=np.uint16).reshape(1, -1),
                     np.array([[0]], np.uint16), np.array([[1300]], np.uint16))
    savemat(path, {'synsets': arr})
    return path


def _flat_val(folder, n=len(GT)):
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(1, n + 1): Image.new('RGB', (6, 6), (30 * k, 0, 0)).save(folder / f'ILSVRC2012_val_{k:08d}.JPEG')
    return folder


@pytest.fixture
def labels(tmp_path):
    "The same labels in the three formats plus the devkit archive; returns a dict of paths and the expected mapping."
    kit = tmp_path / 'ILSVRC2012_devkit_t12' / 'data'
    kit.mkdir(parents=True)
    _fake_meta_mat(kit / 'meta.mat')
    (kit / 'ILSVRC2012_validation_ground_truth.txt').write_text('\n'.join(map(str, GT)) + '\n')
    tgz = tmp_path / 'ILSVRC2012_devkit_t12.tar.gz'
    with tarfile.open(tgz, 'w:gz') as tar: tar.add(tmp_path / 'ILSVRC2012_devkit_t12', arcname='ILSVRC2012_devkit_t12')
    expected = {f'ILSVRC2012_val_{k:08d}.JPEG': WNIDS[i] for k, i in enumerate(GT, start=1)}
    csv_path = tmp_path / 'LOC_val_solution.csv'
    lines = ['ImageId,PredictionString'] + [f'{Path(n).stem},{w} 1 2 3 4 {w} 5 6 7 8' for n, w in reversed(expected.items())]
    csv_path.write_text('\n'.join(lines) + '\n')
    txt = tmp_path / 'val_map.txt'
    txt.write_text('# filename wnid\n' + ''.join(f'{n} {w}\n' for n, w in expected.items()))
    return dict(gt=kit / 'ILSVRC2012_validation_ground_truth.txt', meta=kit / 'meta.mat', tgz=tgz, csv=csv_path,
                txt=txt), expected


def test_fake_devkit_matches_torchvision_parser(labels, tmp_path, monkeypatch):
    "torchvision's own devkit parser reads our fake archive, and agrees with read_val_labels."
    import torchvision.datasets.imagenet as tvi
    paths, expected = labels
    monkeypatch.setattr(tvi, '_verify_archive', lambda *a, **k: None)  # our archive is not the real one (md5)
    out = tmp_path / 'tv'; out.mkdir()
    import shutil; shutil.copy(paths['tgz'], out / 'ILSVRC2012_devkit_t12.tar.gz')
    tvi.parse_devkit_archive(str(out))
    wnid_to_classes, val_wnids = torch.load(out / tvi.META_FILE, weights_only=False)
    assert val_wnids == list(expected.values())
    assert set(wnid_to_classes) == set(WNIDS.values())  # the non-leaf synset is ignored
    assert [w for _, w in read_val_labels(paths['tgz'])] == val_wnids


@pytest.mark.parametrize('fmt', ['gt', 'tgz', 'csv', 'txt'])
def test_prepare_val_all_formats(labels, tmp_path, fmt):
    paths, expected = labels
    val = _flat_val(tmp_path / 'val')
    plan = prepare_imagenet_val(val, paths[fmt], dry_run=True)
    assert plan['placed'] == 7 and plan['classes'] == 4 and len(list(val.glob('*.JPEG'))) == 7  # dry run: untouched
    done = prepare_imagenet_val(val, paths[fmt])
    assert (done['placed'], done['already'], done['labels']) == (7, 0, 7)
    assert list(val.glob('*.JPEG')) == []
    got = {p.name: p.parent.name for p in val.glob('*/*.JPEG')}
    assert got == expected
    again = prepare_imagenet_val(val, paths[fmt])  # idempotent
    assert (again['placed'], again['already']) == (0, 7)
    ds = ImageFolderDataset(val, classes=sorted(WNIDS.values()))
    assert len(ds) == 7


@pytest.mark.parametrize('mode', ['copy', 'symlink'])
def test_prepare_val_copy_and_symlink(labels, tmp_path, mode):
    paths, expected = labels
    val = _flat_val(tmp_path / 'val')
    dest = tmp_path / 'sorted'
    done = prepare_imagenet_val(val, paths['csv'], dest=dest, mode=mode)
    assert done['placed'] == 7 and len(list(val.glob('*.JPEG'))) == 7  # the originals stay
    got = {p.name: p.parent.name for p in dest.glob('*/*.JPEG')}
    assert got == expected
    for p in dest.glob('*/*.JPEG'):
        assert p.is_symlink() == (mode == 'symlink')
        assert p.read_bytes() == (val / p.name).read_bytes()
    assert list(dest.rglob('*.part')) == []
    assert prepare_imagenet_val(val, paths['csv'], dest=dest, mode=mode)['already'] == 7


def test_prepare_val_errors(labels, tmp_path):
    paths, _ = labels
    # a labelled image is missing
    val = _flat_val(tmp_path / 'v1', n=6)
    with pytest.raises(FileNotFoundError, match=r'1 of the 7 labelled images.*ILSVRC2012_val_00000007'):
        prepare_imagenet_val(val, paths['txt'])
    assert len(list(val.glob('*.JPEG'))) == 6  # checked before touching anything
    # an image without a label
    val = _flat_val(tmp_path / 'v2', n=8)
    with pytest.raises(ValueError, match=r'count mismatch: 1 images .*ILSVRC2012_val_00000008'):
        prepare_imagenet_val(val, paths['gt'])
    assert len(list(val.glob('*.JPEG'))) == 8
    # refuses to overwrite
    val = _flat_val(tmp_path / 'v3')
    (val / 'n02119789').mkdir(); (val / 'n02119789' / 'ILSVRC2012_val_00000002.JPEG').write_bytes(b'other')
    with pytest.raises(FileExistsError, match='ILSVRC2012_val_00000002.JPEG already exists'):
        prepare_imagenet_val(val, paths['gt'])
    assert (val / 'n02119789' / 'ILSVRC2012_val_00000002.JPEG').read_bytes() == b'other'
    # ground truth without meta.mat
    lone = tmp_path / 'lone_gt.txt'; lone.write_text(paths['gt'].read_text())
    with pytest.raises(FileNotFoundError, match='meta.mat'): read_val_labels(lone)
    assert len(read_val_labels(lone, meta=paths['meta'])) == 7
    # a class-number map is not a wnid map; malformed lines; missing files; meta.mat as labels
    bad = tmp_path / 'caffe_val.txt'; bad.write_text('ILSVRC2012_val_00000001.JPEG 65\n')
    with pytest.raises(ValueError, match='must be a wnid'): read_val_labels(bad)
    bad.write_text('just_one_column\n')
    with pytest.raises(ValueError, match="line 1: expected 'filename wnid'"): read_val_labels(bad)
    with pytest.raises(FileNotFoundError, match='nope.txt'): read_val_labels(tmp_path / 'nope.txt')
    with pytest.raises(ValueError, match='class table'): read_val_labels(paths['meta'])
    with pytest.raises(FileNotFoundError, match='does not exist'): prepare_imagenet_val(tmp_path / 'none', paths['txt'])
    with pytest.raises(ValueError, match='mode'): prepare_imagenet_val(val, paths['txt'], mode='hardlink')


def test_prepare_val_cli(labels, tmp_path, capsys):
    paths, expected = labels
    val = _flat_val(tmp_path / 'val')
    assert prepare_val_cli([str(val), str(paths['gt']), '--meta', str(paths['meta']), '--dry-run']) == 0  # exit status
    assert 'dry run: would have moved 7 images into 4 class folders' in capsys.readouterr().out
    with pytest.raises(SystemExit) as e: prepare_val_cli([str(val), str(tmp_path / 'nope.txt')])
    assert e.value.code == 2 and 'nope.txt does not exist' in capsys.readouterr().err
    with pytest.raises(SystemExit): prepare_val_cli([str(val), str(paths['csv']), '--copy', '--symlink'])
    # as `python -m t2t_course.data`: help, then a real run
    r = _run('-m', 't2t_course.data', '--help')
    assert r.returncode == 0, r.stderr
    for word in ('VAL_DIR', 'LABELS', '--meta', '--dest', '--copy', '--symlink', '--dry-run', 'default', 'meta.mat',
                 'LOC_val_solution.csv', 'ILSVRC2012_devkit_t12.tar.gz'):
        assert word in r.stdout, word
    r = _run('-m', 't2t_course.data', str(val), str(paths['tgz']), '--symlink')
    assert r.returncode == 0, r.stderr
    assert 'linked 7 images into 4 class folders' in r.stdout
    assert {p.name: p.parent.name for p in val.glob('*/*.JPEG')} == expected
