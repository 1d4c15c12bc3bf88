"""Decoding images and scanning folders (chapter 11a, `t2t_course.data.images`): odd files (gray, CMYK, alpha, palette,
16-bit) decoded as 8-bit RGB by their formulas and broken ones refused with the file named; which files of a split folder
are its images (case-insensitive extensions, hidden files and folders, sub-folders) and its errors; links (a loop
followed once, a link to another class folder skipped and named, linked folders and files loaded) and special files
(skipped and named).

Every image is generated in tmp_path; references are computed independently (NumPy formulas, PIL directly)."""
import os, warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

from t2t_course.data import BadImageError, ImageFolderDataset, load_rgb, scan_image_folder

from tests.support.images import fifo, make_folder, tiny_imagenet, write_jpeg


# ------------------------------------------------------------------ decoding
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
    rgb = write_jpeg(d / 'photo.JPEG')
    with Image.open(rgb) as im: exp['photo.JPEG'] = np.asarray(im.convert('RGB'))
    # broken files
    full = write_jpeg(tmp_path / 'big.jpg', size=(64, 64)).read_bytes()
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


# ------------------------------------------------------------------ folders
def test_scan_folder_basics(tmp_path):
    root = tiny_imagenet(tmp_path / 'inet', n=2)
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
    root = tiny_imagenet(tmp_path / 'inet', n=1)
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


# ------------------------------------------------------------------ links and special files
def test_symlink_loop_in_a_class_folder_is_followed_once(tmp_path):
    "24 real images and `ln -s .. train/dog/up`: 24 samples, not thousands, and the link is named."
    root = make_folder(tmp_path / 'data', n_train=12, n_val=1, classes=2)
    dog = root / 'train' / 'n01'
    os.symlink('..', dog / 'up')                             # a loop back to the split folder
    os.symlink(root / 'train' / 'n00', dog / 'cats')         # another class's images under this label
    os.symlink(dog / '1_0.png', dog / 'again.png')           # the same file twice in one class
    os.symlink(tmp_path / 'nowhere', dog / 'broken')         # a dangling folder link
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        ds = ImageFolderDataset(root / 'train')
    assert len(ds) == 24 and sorted(ds.targets) == [0] * 12 + [1] * 12
    assert sorted(Path(p).name for p, _ in ds.skipped_links) == ['cats', 'up']
    msg = str(w[0].message)
    assert 'skipped 2 entries (folder links not followed, special files)' in msg and str(dog / 'up') in msg and 'a loop' in msg and 'another class folder' in msg


def test_symlinked_class_folders_and_files_still_load(tmp_path):
    "The common layout: class folders, and files, that are links to another disk."
    real = make_folder(tmp_path / 'real', n_train=3, n_val=1, classes=2)
    (tmp_path / 'linked' / 'train').mkdir(parents=True)
    os.symlink(real / 'train' / 'n00', tmp_path / 'linked' / 'train' / 'n00')
    (tmp_path / 'linked' / 'train' / 'n01').mkdir()
    for f in (real / 'train' / 'n01').iterdir(): os.symlink(f, tmp_path / 'linked' / 'train' / 'n01' / f.name)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        ds = ImageFolderDataset(tmp_path / 'linked' / 'train')
    assert len(ds) == 6 and ds.skipped_links == []


def test_special_files_in_a_class_folder_are_skipped_and_named(tmp_path):
    "A FIFO named like an image: skipped and named by the folder scan."
    for c in ('a', 'b'):
        (tmp_path / 'train' / c).mkdir(parents=True)
        Image.new('RGB', (8, 8), (255, 0, 0)).save(tmp_path / 'train' / c / 'ok.png')
    fifo(tmp_path / 'train' / 'a' / 'pipe.JPEG')
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        ds = ImageFolderDataset(tmp_path / 'train')
    assert len(ds) == 2 and [Path(p).name for p, _ in ds.skipped_links] == ['pipe.JPEG']
    assert 'not a regular file' in str(w[0].message)
