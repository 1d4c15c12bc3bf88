"""The callbacks every run has (chapter 18b, `t2t_course.train.callbacks`), here `BestModelFolder`: the run's best weights
as a model folder in timm's layout, `best_model/`, holding what best.pth is used with (the EMA where the run keeps one,
else the weights), with the run's class names and preprocessing, rewritten exactly when best.pth is."""
import pytest
import torch

from t2t_course.models.t2t_vit import create_model
from t2t_course.train import Callback
from t2t_course.train.cli import main

from tests.support.commands import call, train_args


class Stamps(Callback):
    "After each epoch (after the default callbacks): when best.pth and best_model/'s weights were last written."
    order = 100
    def __init__(self): self.seen = []
    def after_epoch(self, run):
        self.seen.append(tuple((run.out / f).stat().st_mtime_ns for f in ('best.pth', 'best_model/model.safetensors')))


@pytest.mark.parametrize('ema', [True, False])
def test_best_model_holds_what_best_pth_is_used_with(ema, folder, tmp_path):
    stamps = Stamps()
    code, _, err = call(lambda argv: main(argv, callbacks=[stamps]),
                        train_args(folder, tmp_path / 'run', '--epochs', '4', '--lr', '0.2', '--ema-decay', '0.9' if ema else '0'))
    assert code == 0, err
    best = torch.load(tmp_path / 'run' / 'best.pth', weights_only=True)
    kept = best['state_dict_ema'] if ema else best['state_dict']
    assert bool(best['state_dict_ema']) == ema
    model = create_model(tmp_path / 'run' / 'best_model')
    for k, v in model.state_dict().items(): assert torch.equal(v, kept[k]), k
    assert (model.default_cfg['label_names'], model.default_cfg['input_size'], model.default_cfg['crop_pct']) == \
        (best['classes'], (3, 16, 16), 0.9)                                       # a folder's data: the imagenet preset's crop
    best_changed = [i for i in range(1, 4) if stamps.seen[i][0] != stamps.seen[i - 1][0]]
    folder_changed = [i for i in range(1, 4) if stamps.seen[i][1] != stamps.seen[i - 1][1]]
    assert best_changed == folder_changed                                          # rewritten together, and only then


# ------------------------------------------------------------------ TensorBoard
def test_tensorboard_event_files_read_back_and_a_resume_continues_the_steps(folder, tmp_path):
    "`--log tensorboard`: the listed tags, by optimizer step; a run resumed from an earlier checkpoint drops what came after it."
    import shutil
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = tmp_path / 'run'
    args = train_args(folder, out, '--log', 'tensorboard', '-b', '4')          # 16 steps an epoch
    assert call(main, [*args, '--epochs', '1'])[0] == 0
    shutil.copy(out / 'last.pth', tmp_path / 'epoch1.pth')
    assert call(main, [*args, '--epochs', '3', '--resume', 'auto'])[0] == 0
    shutil.copy(tmp_path / 'epoch1.pth', out / 'last.pth')                    # as if epochs 2-3 had died before their save
    assert call(main, [*args, '--epochs', '3', '--resume', 'auto'])[0] == 0
    ev = EventAccumulator(str(out)); ev.Reload()
    assert set(ev.Tags()['scalars']) == {'train/loss', 'train/lr', 'train/images_per_s', 'val/loss', 'val/top1', 'val/top5',
                                         'val/ema_top1'}
    assert [e.step for e in ev.Scalars('val/top1')] == [16, 32, 48]            # once each, the replaced points purged
    assert [e.step for e in ev.Scalars('train/loss')] == [16, 32, 48]              # at each epoch's end (16 < SYNC_EVERY)
    assert all(e.value > 0 for e in ev.Scalars('train/images_per_s'))


def test_tensorboard_missing_is_one_line(folder, tmp_path, monkeypatch):
    import importlib.util
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'tensorboard' else find(name, *a))
    code, _, err = call(main, train_args(folder, tmp_path / 'run', '--log', 'tensorboard'))
    assert code == 2 and "pip install 't2t-course[tensorboard]'" in err.strip().splitlines()[-1], err
