"""Choosing a pipeline (chapter 12e, `t2t_course.data.pipelines.registry`): every registered pipeline gives batches of
the recipe; `t2t_train --pipeline` with each CPU-capable choice names bad files, or skips and counts them; the gpu
pipeline without CUDA is a clear setup error; the help says the default and why; on a GPU (marked `cuda`), t2t_train
with the gpu and the fast pipelines."""
import shutil

import pytest
import torch

from t2t_course.data import create_loader
from t2t_course.data.pipelines import PIPELINES, create_pipeline
from t2t_course.data.synthetic import write_jpegs
from t2t_course.train.cli import build_parser, main

from tests.support.commands import call

TINY_ARGS = ['--model', 't2t_vit_7', '--model-kwargs', 'embed_dim=32', 'depth=1', 'num_heads=2', 'mlp_ratio=2.0',
             'token_dim=16', '--img-size', '32', '--threads', '1', '--no-progress', '-b', '4', '--epochs', '1']


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
    code, _, err = call(main, ['--data', str(root), *TINY_ARGS, '--pipeline', pipeline, '--device', 'cpu', '--workers', '0',
                         '--output', str(tmp_path / 'a')])
    assert code == 1 and 'cannot decode image file' in err and ('text.jpg' in err or 'truncated.jpg' in err), err
    code, out, err = call(main, ['--data', str(root), *TINY_ARGS, '--pipeline', pipeline, '--device', 'cpu', '--workers', '1',
                           '-b', '3', '--skip-bad-images', '--output', str(tmp_path / 'b')])  # 21 files: every one is seen
    assert code == 0, err
    assert 'skipped 2 bad image sample(s) from 2 file(s)' in out and f"pipeline='{pipeline}'" in out
    ck = torch.load(tmp_path / 'b' / 'last.pth', weights_only=True)
    assert ck['config']['pipeline'] == pipeline


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the message a machine without CUDA gets')
def test_gpu_pipeline_without_cuda_is_a_clear_setup_error(tmp_path):
    root = write_jpegs(tmp_path / 'd' / 'train', 4, (40, 48)).parent
    write_jpegs(root / 'val', 2, (40, 48))
    code, _, err = call(main, ['--data', str(root), *TINY_ARGS, '--pipeline', 'gpu', '--output', str(tmp_path / 'o')])
    assert code == 2 and '--pipeline gpu decodes and augments on a CUDA GPU' in err and '--pipeline draft' in err, err


def test_help_says_the_default_on_cpu_and_gpu_and_why():
    h = next(a.help for a in build_parser()._actions if a.dest == 'pipeline')
    flat = ' '.join(h.split())
    assert 'default: draft, on the CPU and on a GPU' in flat and 'because' in flat and 'not been measured' in flat


# ------------------------------------------------------------------ GPU
@pytest.mark.cuda
def test_t2t_train_gpu_pipeline_on_cuda(files, tmp_path):
    root = bad_folder(tmp_path / 'data', files)
    code, out, err = call(main, ['--data', str(root), *TINY_ARGS, '--pipeline', 'gpu', '--device', 'cuda', '--workers', '1',
                           '-b', '3', '--skip-bad-images', '--output', str(tmp_path / 'g')])
    assert code == 0, err
    assert 'skipped 2 bad image sample(s) from 2 file(s)' in out
    assert 'pipeline gpu:' in out and 'by PIL on the CPU' in out


@pytest.mark.cuda
def test_t2t_train_fast_pipeline_on_cuda(files, tmp_path):
    "The fast pipeline's workers on the CPU, its batch step on the GPU: bad files skipped and counted, a checkpoint."
    root = bad_folder(tmp_path / 'data', files)
    code, out, err = call(main, ['--data', str(root), *TINY_ARGS, '--pipeline', 'fast', '--device', 'cuda', '--workers', '1',
                           '-b', '3', '--skip-bad-images', '--output', str(tmp_path / 'f')])
    assert code == 0, err
    assert 'skipped 2 bad image sample(s) from 2 file(s)' in out and "pipeline='fast'" in out
