"""The recipe's transforms (chapter 11c, `t2t_course.data.transforms`): shapes and normalisation, the evaluation
geometry (resize, centre crop) against PIL, the training transform's switches, the digits preset, and `create_datasets`
on an ImageNet-layout folder, through the loader, mixing and the loss to an optimizer step."""
import numpy as np
import pytest
import torch
import torch.nn as nn
from PIL import Image
from torchvision.transforms import v2

from t2t_course.core import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from t2t_course.data import (DATA_PRESETS, MixupCutmix, create_datasets, create_eval_transform, create_loader, create_loss,
                             create_train_transform)

from tests.support.images import tiny_imagenet


def test_imagenet_layout_end_to_end(tmp_path):
    "The ImageNet path: folders -> datasets with the full recipe -> loader with workers -> mixing -> loss -> a step."
    root = tiny_imagenet(tmp_path / 'inet', n=4, size=(50, 38))
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
