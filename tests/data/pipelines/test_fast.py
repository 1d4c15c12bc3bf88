"""The fast pipeline (chapter 12d, `t2t_course.data.pipelines.fast`): its lean RandAugment bit for bit torchvision's,
the numpy ops (shears, translations, Sharpness, Posterize, Solarize) bit for bit PIL's at every magnitude, torch's uint8 resize within 2 levels of PIL's, the crop drawing what draft
draws, a whole sample at pil's draws, the erasing draws, the batch step, a loader through a worker process; on a GPU
(marked `cuda`), the batch step equals the CPU's."""
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from t2t_course.data import ImageFolderDataset, create_loader, create_train_transform, load_rgb, mean_fill
from t2t_course.data.pipelines import (BatchPostCrop, BatchTransformLoader, DraftCrop, FastCrop, FastPostCrop,
                                 KernelRandAugment, RA_OPS, U8_OPS, collate_uint8, create_pipeline, erase_params,
                                 pil_vertical_first, resize_uint8, sharpness_rgb, shear_bicubic, translate_u8)
from t2t_course.data.synthetic import make_photo, write_jpegs

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


def test_u8_ops_are_pils_at_every_magnitude():
    "Each numpy op against torchvision's PIL op, at every magnitude of 11 bins and both signs, on a photo and on noise of odd size: PIL's bytes, in a new writable array."
    fill, rng = list(mean_fill()), np.random.default_rng(3)
    assert sorted(U8_OPS) == [1, 2, 3, 4, 9, 10, 11]  # ShearX, ShearY, TranslateX, TranslateY, Sharpness, Posterize, Solarize
    for arr in (make_photo(64, 96), rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)):
        H, W = arr.shape[:2]
        for k, op in U8_OPS.items():
            name, strengths, signed, pil_op = RA_OPS[k]
            for m in strengths(11, H, W).tolist():
                for sign in ((1, -1) if signed else (1,)):
                    ref = np.asarray(pil_op(Image.fromarray(arr), sign * m, v2.InterpolationMode.BICUBIC, fill))
                    out = op(arr, sign * m, fill)
                    assert out.flags.writeable and np.array_equal(out, ref), (name, sign * m, H, W)
    for dx, dy in [(W, 0), (0, -H), (-W - 3, 5)]:  # shifted out of the image: all fill, as PIL's paste leaves it
        assert (translate_u8(arr, dx, dy, fill) == np.array(fill, np.uint8)).all()


def test_kernel_randaugment_hands_back_pil_only_where_pil_computed_last():
    "The image turns into an array at the first numpy op (a translation of a PIL image stays PIL's paste), back into PIL at a PIL op, and Identity twice hands back the input itself."
    from t2t_course.data.pipelines import ra_draw
    ra, img = KernelRandAugment(2, 9, 11, fill=mean_fill()), Image.fromarray(make_photo(48, 64))
    seen = set()
    for seed in range(200):
        torch.manual_seed(seed); ops = [ra_draw(11, 9, 48, 64)[0] for _ in range(2)]
        state = 'input'
        for k in ops:
            if k: state = 'array' if k in U8_OPS and (state == 'array' or k not in (3, 4)) else 'PIL'
        torch.manual_seed(seed); out = ra(img)
        seen.add(state)
        if state == 'input': assert out is img
        else: assert isinstance(out, np.ndarray if state == 'array' else Image.Image), (seed, ops)
        assert np.asarray(out).shape == (48, 64, 3) and np.asarray(out).dtype == np.uint8
    assert seen == {'input', 'array', 'PIL'}


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


# ------------------------------------------------------------------ GPU
@pytest.mark.cuda
def test_fast_batch_step_on_cuda_is_the_cpu_one(files):
    "BatchPostCrop where the batch lands on a GPU: the CPU's result, the erasing noise included."
    fc, ft = FastCrop(64), FastPostCrop(re_prob=1.)
    torch.manual_seed(0)
    b = collate_uint8([(ft(fc(files / 'photo.JPEG')), 0) for _ in range(4)]).images
    cpu = BatchPostCrop()(b)
    cuda = BatchPostCrop()(type(b)(b.pixels.cuda(), b.erase, b.noise.cuda()))
    assert cuda.device.type == 'cuda' and torch.allclose(cuda.cpu(), cpu, atol=1e-6)
