"""The recipe and the configuration (chapter 17, `t2t_course.train.config`): the paper's recipe; the default output
folders (numbered, the latest one for --resume auto and --overwrite, a resumed checkpoint's own); the main job's image
size, which gives the backbone a real token grid; more workers than CPUs refused."""
import os
from pathlib import Path

import pytest

from t2t_course.models.t2t_vit import create_model
from t2t_course.train.config import TrainConfig, recipe, resolve_config
from t2t_course.train.optim import SetupError, scale_lr


def test_recipe_matches_the_paper():
    r14, r7, r19, rt24 = (recipe(m, '/data') for m in ('t2t_vit_14', 't2t_vit_7', 't2t_vit_19', 't2t_vit_t_24'))
    # the official recipe's numbers (its training script's arguments), written out here rather than read from the module
    assert (r14['lr'], r14['weight_decay'], r7['lr'], r7['weight_decay']) == (5e-4, 0.05, 1e-3, 0.03)
    assert (r19['weight_decay'], rt24['weight_decay']) == (0.065, 0.065)
    assert (r14['epochs'], r14['cooldown_epochs'], r14['warmup_epochs'], r14['min_lr']) == (300, 10, 10, 1e-5)
    assert (r14['drop_path'], r14['ema_decay'], r14['smoothing'], r14['mixup'], r14['cutmix']) == (0.1, 0.99996, 0.1, 0.8, 1.0)
    assert r14['batch_size'] * 8 == 512  # 8 GPUs make the paper's global batch
    cfg = TrainConfig(data=None, model=None).resolve()
    assert cfg.data_preset == 'digits' and cfg.mix_prob == 0
    assert scale_lr(5e-4, 1024) == 1e-3 and scale_lr(1e-3, 64) == 1e-3 / 8


def test_main_job_runs_on_a_real_grid():
    "t2t_train without flags: 64 px, so the backbone sees 4 x 4 = 16 tokens and every soft split works on a real grid."
    cfg = TrainConfig().resolve()
    assert cfg.data == 'digits' and cfg.img_size >= 64
    t2t = create_model(cfg.model, num_classes=10, img_size=cfg.img_size, **cfg.model_kwargs).tokens_to_token
    H0 = t2t.soft_split0.output_size((cfg.img_size,) * 2); H1 = t2t.soft_split1.output_size(H0)
    assert min(H0) >= 16 and min(H1) >= 8 and t2t.num_patches >= 16


def test_default_output_folders_are_numbered(tmp_path, monkeypatch):
    "Without --output, a new run never lands in an old run's folder; --resume auto and --overwrite take the latest."
    monkeypatch.chdir(tmp_path)
    assert TrainConfig().resolve().output == str(Path('runs') / 't2t_vit_7-digits')
    for name in ('t2t_vit_7-digits', 't2t_vit_7-digits-2'):
        (tmp_path / 'runs' / name).mkdir(parents=True)
        (tmp_path / 'runs' / name / 'last.pth').write_bytes(b'')
    assert TrainConfig().resolve().output == str(Path('runs') / 't2t_vit_7-digits-3')
    assert TrainConfig(resume='auto').resolve().output == str(Path('runs') / 't2t_vit_7-digits-2')
    assert TrainConfig(overwrite=True).resolve().output == str(Path('runs') / 't2t_vit_7-digits-2')
    assert TrainConfig(output='mine').resolve().output == 'mine'  # an explicit folder is used as given


def test_resume_from_a_path_continues_in_its_folder(folder, tmp_path):
    ck = tmp_path / 'somewhere' / 'last.pth'
    ck.parent.mkdir(); ck.write_bytes(b'')
    cfg = TrainConfig(data=str(folder), model='t2t_vit_7', resume=str(ck)).resolve()
    assert cfg.output == str(ck.parent)


def test_workers_above_the_cpus_are_refused():
    with pytest.raises(SetupError, match=r"workers \(\d+\) must be at most this machine's \d+ CPUs"):
        resolve_config(TrainConfig(data='digits', workers=(os.cpu_count() or 1) + 1))
