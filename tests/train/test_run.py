"""A run's assembly, checkpoint and exact resume (chapter 18c, `t2t_course.train.run`): a run killed at any step resumes
to the uninterrupted run's weights, EMA and metrics (with the draft and the fast pipelines); resumed with other
hyper-parameters it uses them from the saved step on; every rate of the schedule scaled to a small batch; fine-tuning an
official checkpoint at another size and class count; an architecture that cannot be built is one line."""
import csv, signal

import pytest
import torch

from t2t_course.models.t2t_vit import create_model
from t2t_course.train.cli import main
from t2t_course.train.config import TrainConfig
from t2t_course.train.optim import scale_lr

from tests.support.commands import RESUME_ARGS, TINY, TINY_ARGS, call, max_diff, no_traceback, run, train_args


# ------------------------------------------------------------------ kill and resume
@pytest.fixture(scope='module')
def uninterrupted(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp('full')
    p = run(['-m', 't2t_course.train', '--data', str(folder), *RESUME_ARGS, '--output', str(out)])
    assert p.returncode == 0, p.stderr
    return out


@pytest.mark.parametrize('kill_at', [11, 16])  # in the middle of epoch 2; at its last step
def test_kill_and_resume_reproduces_the_uninterrupted_run(folder, uninterrupted, tmp_path, kill_at):
    out = tmp_path / 'run'
    p = run(['-m', 'tests.support.fault_run', f'signal:{kill_at}', '--', '--data', str(folder), *RESUME_ARGS, '--output', str(out)])
    assert p.returncode == 128 + signal.SIGTERM, p.stderr  # 143: stopped by SIGTERM, checkpoint written
    assert 'stopped by SIGTERM' in p.stdout and '--resume auto' in p.stdout
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert ck['step'] == kill_at and ck['epoch'] == (1 if kill_at < 16 else 2) and ck['batch'] == (kill_at % 8)
    assert not list(out.glob('.*tmp'))  # no temporary file left behind
    p = run(['-m', 't2t_course.train', '--data', str(folder), *RESUME_ARGS, '--output', str(out), '--resume', 'auto'])
    assert p.returncode == 0, p.stderr
    assert 'resumed from' in p.stdout
    a, b = torch.load(uninterrupted / 'last.pth', weights_only=True), torch.load(out / 'last.pth', weights_only=True)
    assert max_diff(a['state_dict'], b['state_dict']) <= 1e-6
    assert max_diff(a['state_dict_ema'], b['state_dict_ema']) <= 1e-6
    drop = lambda rows: [{k: v for k, v in r.items() if k not in ('epoch_time_s', 'train_images_per_s')} for r in rows]
    assert drop(a['history']) == drop(b['history'])  # identical metrics, the interrupted epoch's train loss included
    assert (out / 'metrics.csv').read_text().count('\n') == 4


def test_kill_and_resume_with_the_fast_pipeline(folder, tmp_path):
    "The fast pipeline draws in the worker under the per-sample seeds, as draft does: a killed run resumes to the same weights."
    args = [*RESUME_ARGS, '--pipeline', 'fast']
    p = run(['-m', 't2t_course.train', '--data', str(folder), *args, '--output', str(tmp_path / 'full')])
    assert p.returncode == 0, p.stderr
    out = tmp_path / 'run'
    p = run(['-m', 'tests.support.fault_run', 'signal:11', '--', '--data', str(folder), *args, '--output', str(out)])
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    p = run(['-m', 't2t_course.train', '--data', str(folder), *args, '--output', str(out), '--resume', 'auto'])
    assert p.returncode == 0 and 'resumed from' in p.stdout, p.stderr
    a, b = torch.load(tmp_path / 'full' / 'last.pth', weights_only=True), torch.load(out / 'last.pth', weights_only=True)
    assert a['config']['pipeline'] == b['config']['pipeline'] == 'fast'
    assert max_diff(a['state_dict'], b['state_dict']) <= 1e-6 and max_diff(a['state_dict_ema'], b['state_dict_ema']) <= 1e-6


def test_resume_keeps_this_runs_schedule_and_hyper_parameters(folder, tmp_path):
    "Resuming with more epochs, another lr, weight decay or EMA decay uses the new values from the saved step on."
    out = tmp_path / 'run'
    code, _, err = call(main, ['--data', str(folder), *RESUME_ARGS, '--workers', '0', '--epochs', '2', '--output', str(out)])
    assert code == 0, err
    code, stdout, err = call(main, ['--data', str(folder), *RESUME_ARGS, '--workers', '0', '--epochs', '4', '--lr', '0.4',
                                    '--weight-decay', '0.01', '--ema-decay', '0.5', '--output', str(out), '--resume', 'auto'])
    assert code == 0, err
    assert "the learning-rate schedule is this run's" in stdout and 'decay_steps 16 -> 32' in stdout
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert ck['epoch'] == 4 and ck['step'] == 32
    assert ck['scheduler']['peak_lr'] == pytest.approx(scale_lr(0.4, 8)) and ck['scheduler']['decay_steps'] == 32
    assert [g['weight_decay'] for g in ck['optimizer']['param_groups']] == [0., 0.01]
    assert ck['ema']['decay'] == 0.5
    lrs = [float(r['lr']) for r in csv.DictReader(open(out / 'metrics.csv'))]
    assert lrs[2] > lrs[1]  # epoch 3 is back up the new, longer cosine, not stuck at the old min_lr


# ------------------------------------------------------------------ the schedule, the model
def test_small_batch_schedule_decays_after_its_peak(folder, tmp_path):
    "With -b 4 every rate of the schedule is scaled by 4/512, so the cosine really decays (min_lr was not scaled once)."
    out = tmp_path / 'run'
    code, stdout, err = call(main, ['--data', str(folder), *TINY_ARGS, '-b', '4', '--epochs', '4', '--workers', '0',
                                    '--output', str(out)])
    assert code == 0, err
    lrs = [float(r['lr']) for r in csv.DictReader(open(out / 'metrics.csv'))]
    ck = torch.load(out / 'last.pth', weights_only=True)
    peak, floor = ck['scheduler']['peak_lr'], ck['scheduler']['min_lr']
    assert peak == pytest.approx(1e-3 * 4 / 512) and floor == pytest.approx(1e-5 * 4 / 512) and floor < peak
    assert lrs[0] <= peak and lrs[1] > lrs[2] > lrs[3] and lrs[3] == pytest.approx(floor, rel=0.2)  # the last step, just above the floor
    assert f'floor {floor:.3g}' in stdout


def test_finetune_an_official_checkpoint_at_a_new_size_and_class_count(folder, tmp_path):
    "t2t_train --pretrained OFFICIAL --data FOLDER: the official transfer-learning recipe, a new head, the table rebuilt."
    import warnings
    from t2t_course.train import build_run
    torch.manual_seed(0)
    src = create_model('t2t_vit_7', img_size=64, **TINY)                       # 1000 classes at 64 px: an "ImageNet" model
    sd = src.state_dict()
    ckpt = tmp_path / 'official.pth.tar'
    torch.save({'state_dict': {'module.' + k: v for k, v in sd.items()}, 'state_dict_ema': sd, 'epoch': 299}, ckpt)
    cfg = TrainConfig(data=str(folder), model='t2t_vit_7', model_kwargs=TINY, img_size=32, pretrained=str(ckpt), epochs=2,
                      batch_size=8, workers=0, output=str(tmp_path / 'probe'), progress=False).resolve()
    assert (cfg.opt, cfg.backbone_lr_scale, cfg.weight_decay, cfg.smoothing, cfg.mix_prob, cfg.ema_decay, cfg.data_preset) == \
           ('sgd', 0.01, 5e-4, 0., 0., 0., 'finetune')
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        r = build_run(cfg)
    try:
        m = r.state.model
        assert any('dropping the checkpoint\'s classifier head (1000 classes)' in str(x.message) for x in w)
        assert torch.equal(m.blocks[0].attn.qkv.weight, sd['blocks.0.attn.qkv.weight'])        # the backbone starts pretrained
        assert m.head.out_features == 4 and m.pos_embed.shape[1] == 1 + 2 * 2                   # a new head; the 32-px table
        lrs = [(g['lr_scale'], g['lr']) for g in r.state.optimizer.param_groups]
        assert [s for s, _ in lrs] == [0.01, 0.01, 1., 1.] and lrs[2][1] == pytest.approx(100 * lrs[0][1])
    finally:
        r.lock.release()
    code, stdout, err = call(main, ['--data', str(folder), *TINY_ARGS, '--img-size', '32', '--pretrained', str(ckpt), '--epochs', '2',
                                    '-b', '8', '--workers', '0', '--output', str(tmp_path / 'ft')])
    assert code == 0, err
    ck = torch.load(tmp_path / 'ft' / 'last.pth', weights_only=True)
    assert ck['config']['opt'] == 'sgd' and ck['config']['pretrained'] == str(ckpt) and ck['state_dict']['head.weight'].shape[0] == 4
    assert 'sgd' in stdout and f"peak lr {0.4 * 8 / 512:.3g}" in stdout


def test_bad_architecture_overrides_get_one_line(folder, tmp_path):
    p = run(['-m', 't2t_course.train', *train_args(folder, tmp_path / 'a', '--epochs', '1'), '--model-kwargs', 'depth=-1'])
    assert p.returncode == 2 and "cannot build t2t_vit_7 with" in p.stderr and 'depth' in p.stderr, p.stderr
    no_traceback(p.stderr)


# ------------------------------------------------------------------ another global batch at an epoch's end
@pytest.mark.parametrize('before,after', [(16, 8), (8, 16)])
def test_a_resume_with_another_batch_continues_the_schedule_at_the_same_epoch(folder, tmp_path, before, after):
    "The learning rates of the epochs after the change equal those of a run that used the new batch from the start."
    import json
    common = ['--epochs', '3', '--warmup-epochs', '1', '--lr', '0.1']
    out = tmp_path / 'changed'
    assert call(main, train_args(folder, out, *common, '-b', str(before), '--epochs', '1'))[0] == 0
    code, printed, err = call(main, train_args(folder, out, *common, '-b', str(after), '--resume', 'auto'))
    assert code == 0, err
    assert f"steps per epoch {64 // before} -> {64 // after}" in printed and 'the schedule continues at epoch 1 of 3' in printed
    assert call(main, train_args(folder, tmp_path / 'ref', *common, '-b', str(after)))[0] == 0
    lrs = lambda p: [float(r['lr']) for r in csv.DictReader(open(p / 'metrics.csv'))]
    assert lrs(out)[1:] == lrs(tmp_path / 'ref')[1:]
    saved = json.loads((out / 'config.json').read_text())       # rewritten by the resume, with its notes
    assert saved['batch_size'] == after and saved['resumed']['epoch'] == 1
    assert any('steps per epoch' in n for n in saved['resumed']['notes'])
