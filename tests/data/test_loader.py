"""Image folders through worker processes (chapter 11b, `t2t_course.data.loader`): bad images skipped, and counted in
the main process whatever the number of workers, or stopping the run by default; `collate_skip_bad` on its own."""
from pathlib import Path

import pytest
import torch

from t2t_course.data import (BadImageError, BadImageLog, BadSample, ImageFolderDataset, collate_skip_bad,
                             create_eval_transform, create_loader)

from tests.support.images import tiny_imagenet, write_jpeg


def _bad_root(tmp_path):
    "5 good images per class in 3 classes, plus 3 bad files whose sorted names put them together in class n02."
    bad = [('train', 'n02', 'n02_zz_empty.png', b''), ('train', 'n02', 'n02_zz_text.jpg', b'hello'),
           ('train', 'n02', 'n02_zz_trunc.jpg', write_jpeg(tmp_path / 'b.jpg', (64, 64)).read_bytes()[:1500])]
    return tiny_imagenet(tmp_path / 'inet', n=5, bad=bad)


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
