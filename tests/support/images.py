"""Image files and folders the tests write: an ImageNet-layout folder of noisy solid colours that a tiny model learns in
a few steps (`make_folder`), a random JPEG (`write_jpeg`), a folder of three coloured classes with bad files put in
(`tiny_imagenet`), and a FIFO named like an image (`fifo`)."""
import os
from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = [(220, 30, 30), (30, 200, 30), (30, 30, 220), (230, 230, 40)]


def make_folder(root, n_train=16, n_val=6, classes=4, size=(20, 24), ext='.png', seed=0):
    "An ImageNet-layout folder: `classes` classes (n00, n01, ...) of noisy solid colours, learnable in a few steps."
    rng, root = np.random.default_rng(seed), Path(root)
    for split, n in (('train', n_train), ('val', n_val)):
        for c in range(classes):
            d = root / split / f'n{c:02d}'
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                a = np.clip(np.array(COLOURS[c % 4]) + rng.normal(0, 25, (*size, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(a).save(d / f'{c}_{i}{ext}')
    return root


def write_jpeg(path, size=(48, 40), seed=0):
    arr = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(arr).save(path, quality=90)
    return path


def tiny_imagenet(root, n=4, bad=(), size=(40, 32)):
    "root/{train,val}/{n01,n02,n03}/*.JPEG with distinct colours per class; `bad`: (split, class, name, bytes)."
    colours = {'n01': (255, 0, 0), 'n02': (0, 255, 0), 'n03': (0, 0, 255)}
    for split in ('train', 'val'):
        for c, col in colours.items():
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(n): Image.new('RGB', size, col).save(root / split / c / f'{c}_{i:02d}.JPEG')
    for split, c, name, content in bad: (root / split / c / name).write_bytes(content)
    return root


def fifo(path):
    os.mkfifo(path)
    return path
