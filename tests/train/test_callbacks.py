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
