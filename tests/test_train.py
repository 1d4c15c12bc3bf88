"""Training (chapters 13-19): DDP against a single process, kill-and-resume, bad images, a non-finite loss, the command
lines and their errors, the ImageNet path on a tiny generated folder, and t2t_eval on our and on official-layout
checkpoints (the real run on the embedded digits, with an independent evaluation of its weights, is chapter 18's).
GPU-only checks are marked `cuda`."""
import csv, io, math, os, signal, subprocess, sys, time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from support.warm import WarmPopen, warm_run
from t2t_course.data import create_eval_transform, create_loss, ImageFolderDataset
from t2t_course.models.t2t_vit import create_model
from t2t_course.train.optim import ModelEma, WarmupCosineSchedule, param_groups_weight_decay, scale_lr
from t2t_course.train.config import TrainConfig, recipe
from t2t_course.train import train
from support.faults import NanAfterStep
from t2t_course.train.cli import build_parser, eval_main, main

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TINY = dict(embed_dim=32, depth=1, num_heads=2, mlp_ratio=2., token_dim=16)
TINY_ARGS = ['--model', 't2t_vit_7', '--model-kwargs', 'embed_dim=32', 'depth=1', 'num_heads=2', 'mlp_ratio=2.0',
             'token_dim=16', '--img-size', '16', '--threads', '1', '--no-progress']
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


def run(args, env=None, timeout=300):
    "Run a command line of this Python in the repository; the CompletedProcess."
    e = dict(os.environ, PYTHONWARNINGS='ignore', **(env or {}))
    return warm_run([PY, *args], cwd=REPO, env=e, capture_output=True, text=True, timeout=timeout)


def call(fn, argv):
    "Call a command's entry point in-process; (exit status, stdout, stderr) (argparse errors exit with 2)."
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try: code = fn(argv)
        except SystemExit as e: code = e.code
    return code, out.getvalue(), err.getvalue()


def max_diff(a:dict, b:dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp('tiny_imagenet'))


# ------------------------------------------------------------------ the recipe and its pieces
def test_recipe_matches_the_paper():
    r14, r7, r19, rt24 = (recipe(m, '/data') for m in ('t2t_vit_14', 't2t_vit_7', 't2t_vit_19', 't2t_vit_t_24'))
    # the paper's numbers (T2T_FACTS section 5), written out here rather than read from the module
    assert (r14['lr'], r14['weight_decay'], r7['lr'], r7['weight_decay']) == (5e-4, 0.05, 1e-3, 0.03)
    assert (r19['weight_decay'], rt24['weight_decay']) == (0.065, 0.065)
    assert (r14['epochs'], r14['cooldown_epochs'], r14['warmup_epochs'], r14['min_lr']) == (300, 10, 10, 1e-5)
    assert (r14['drop_path'], r14['ema_decay'], r14['smoothing'], r14['mixup'], r14['cutmix']) == (0.1, 0.99996, 0.1, 0.8, 1.0)
    assert r14['batch_size'] * 8 == 512  # 8 GPUs make the paper's global batch
    cfg = TrainConfig(data=None, model=None).resolve()
    assert cfg.data_preset == 'digits' and cfg.mix_prob == 0
    assert scale_lr(5e-4, 1024) == 1e-3 and scale_lr(1e-3, 64) == 1e-3 / 8


def test_weight_decay_groups():
    model = create_model('t2t_vit_7', num_classes=3, img_size=32, **TINY)
    model.head.weight.requires_grad_(False)  # a frozen parameter gets no group at all
    groups = param_groups_weight_decay(model, 0.05)
    ids = {id(p): n for n, p in model.named_parameters()}
    no_decay, decay = ({ids[id(p)] for p in g['params']} for g in groups)
    assert (groups[0]['weight_decay'], groups[1]['weight_decay']) == (0., 0.05)
    expect_no = {n for n, p in model.named_parameters() if p.requires_grad and (n.endswith('.bias') or 'norm' in n or n == 'cls_token')}
    expect_yes = {n for n, p in model.named_parameters() if p.requires_grad and n.endswith('.weight') and 'norm' not in n}
    assert no_decay == expect_no and decay == expect_yes
    assert 'head.weight' not in no_decay | decay and 'cls_token' in no_decay
    names = {n for n, _ in model.named_parameters()}
    assert 'pos_embed' not in names and not any(n.endswith('.w') for n in names)  # buffers, never optimised


def test_schedule_and_ema_against_hand_computation():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.)
    sched = WarmupCosineSchedule(opt, peak_lr=1e-3, warmup_steps=10, decay_steps=110, min_lr=1e-5, warmup_lr=1e-6)
    seen = []
    for s in range(130):
        seen.append(opt.param_groups[0]['lr']); sched.step()
    assert seen[0] == 1e-6 and math.isclose(seen[5], 1e-6 + (1e-3 - 1e-6) * 5 / 10)
    assert math.isclose(seen[10], 1e-3) and math.isclose(seen[60], (1e-3 + 1e-5) / 2)  # half-way down the cosine
    assert seen[110] == seen[129] == 1e-5
    lin = torch.nn.Linear(2, 1)
    ema = ModelEma(lin, decay=0.5)
    w0 = lin.weight.detach().clone()
    with torch.no_grad(): lin.weight.add_(1.)
    ema.update_parameters(lin)  # the first update copies the weights (AveragedModel's rule)
    torch.testing.assert_close(ema.module.weight, w0 + 1)
    with torch.no_grad(): lin.weight.add_(1.)
    ema.update_parameters(lin)  # after 1 update: decay min(0.5, 2/11) = 2/11: ema = 2/11 (w0 + 1) + 9/11 (w0 + 2)
    torch.testing.assert_close(ema.module.weight, w0 + 1 + 9 / 11)


# ------------------------------------------------------------------ the command line
def test_help_lists_every_flag_with_its_default():
    code, out, _ = call(main, ['--help'])
    assert code == 0
    for flag in ('--data', '--model', '--img-size', '--epochs', '--batch-size', '--lr', '--weight-decay', '--output',
                 '--resume', '--amp', '--compile', '--workers', '--seed', '--device', '--skip-bad-images'):
        assert flag in out, flag
    opts = [a for a in build_parser()._actions if a.option_strings and a.dest != 'help']
    assert all('default' in (a.help or '') for a in opts), [a.dest for a in opts if 'default' not in (a.help or '')]
    code, out, _ = call(eval_main, ['--help'])
    assert code == 0 and '--data' in out and '--model' in out


@pytest.mark.parametrize('argv, message', [
    (['--epochs', '0'], 'epochs must be a positive int'),
    (['--model', 't2t_vit_13'], "unknown model 't2t_vit_13'"),
    (['--data', '/no/such/folder'], 'data folder /no/such/folder does not exist'),
    (['--lr', '-1'], 'lr must be a positive number'),
    (['--drop-path', '1.5'], 'drop_path must be in [0, 1)'),
    (['--amp', 'fp8'], "invalid choice: 'fp8'"),
    (['--resume', '/no/such.pth'], '/no/such.pth does not exist'),
    (['--model-kwargs', 'depth'], 'KEY=VALUE'),
    (['--warmup-epochs', '50', '--epochs', '10'], 'warmup_epochs must be in [0, epochs=10]'),
    (['--device', 'tpu'], "unknown device 'tpu'"),
])
def test_bad_arguments_get_clear_messages(argv, message):
    code, _, err = call(main, argv)
    assert code == 2 and message in err, err


def test_setup_errors_get_clear_messages(folder, tmp_path):
    code, _, err = call(main, ['--data', str(folder), *TINY_ARGS, '--batch-size', '1000', '--output', str(tmp_path / 'a')])
    assert code == 2 and 'fewer than one global batch' in err, err
    code, _, err = call(main, ['--data', str(folder / 'train'), *TINY_ARGS])
    assert code == 2 and 'has no train/ folder' in err, err
    (tmp_path / 'b').mkdir(); (tmp_path / 'b' / 'last.pth').write_bytes(b'x')
    code, _, err = call(main, ['--data', str(folder), *TINY_ARGS, '--output', str(tmp_path / 'b')])
    assert code == 2 and 'already holds a run' in err and '--resume auto' in err, err
    code, _, err = call(main, ['--data', str(folder), *TINY_ARGS, '--output', str(tmp_path / 'b'), '--resume', 'auto'])
    assert code == 2 and 'cannot read checkpoint' in err, err
    if not torch.cuda.is_available():
        code, _, err = call(main, ['--device', 'cuda'])
        assert code == 2 and 'no CUDA GPU' in err, err
        code, _, err = call(main, ['--amp', 'fp16', '--output', str(tmp_path / 'c')])
        assert code == 2 and "'fp16' needs a CUDA GPU" in err, err


# ------------------------------------------------------------------ kill and resume
RESUME_ARGS = [*TINY_ARGS, '--batch-size', '8', '--epochs', '3', '--lr', '0.2', '--workers', '1', '--deterministic',
               '--ema-decay', '0.9', '--mix-prob', '0.5']  # mixing on: its random draws must resume exactly too


@pytest.fixture(scope='module')
def uninterrupted(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp('full')
    p = run(['-m', 't2t_course.train', '--data', str(folder), *RESUME_ARGS, '--output', str(out)])
    assert p.returncode == 0, p.stderr
    return out


@pytest.mark.parametrize('kill_at', [11, 16])  # in the middle of epoch 2; at its last step
def test_kill_and_resume_reproduces_the_uninterrupted_run(folder, uninterrupted, tmp_path, kill_at):
    out = tmp_path / 'run'
    p = run(['tests/fault_run.py', f'signal:{kill_at}', '--', '--data', str(folder), *RESUME_ARGS, '--output', str(out)])
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
    p = run(['tests/fault_run.py', 'signal:11', '--', '--data', str(folder), *args, '--output', str(out)])
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    p = run(['-m', 't2t_course.train', '--data', str(folder), *args, '--output', str(out), '--resume', 'auto'])
    assert p.returncode == 0 and 'resumed from' in p.stdout, p.stderr
    a, b = torch.load(tmp_path / 'full' / 'last.pth', weights_only=True), torch.load(out / 'last.pth', weights_only=True)
    assert a['config']['pipeline'] == b['config']['pipeline'] == 'fast'
    assert max_diff(a['state_dict'], b['state_dict']) <= 1e-6 and max_diff(a['state_dict_ema'], b['state_dict_ema']) <= 1e-6


def test_sigterm_from_outside_stops_cleanly(folder, tmp_path):
    "A real signal from another process (not the debug hook): a checkpoint, exit status 143, a resumable run."
    out = tmp_path / 'run'
    proc = WarmPopen([PY, '-m', 't2t_course.train', '--data', str(folder), *TINY_ARGS, '--batch-size', '4',
                             '--epochs', '1000', '--output', str(out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / 'last.pth').exists() and time.time() < deadline: time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert ck['epoch'] >= 1 and 'stopped by SIGTERM' in stdout


EVAL_MAIN = 'import sys; from t2t_course.train.cli import eval_main; sys.exit(eval_main(sys.argv[1:]))'


def test_a_closed_stdout_stops_cleanly_and_resumes(folder, tmp_path):
    "`t2t_train ... | head -1`: no traceback, a checkpoint, exit 141 (SIGPIPE's status), a run that resumes; t2t_eval likewise quiet."
    out, e = tmp_path / 'run', dict(os.environ, PYTHONWARNINGS='ignore')
    args = ['-m', 't2t_course.train', '--data', str(folder), *TINY_ARGS, '--batch-size', '8', '--epochs', '3', '--output', str(out)]
    proc = WarmPopen([PY, *args], cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.readline(); proc.stdout.close()  # what head -1 does
    stderr = proc.stderr.read(); proc.wait(timeout=300)
    assert proc.returncode == 141 and 'Traceback' not in stderr and 'stdout was closed' in stderr, (proc.returncode, stderr)
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert ck['step'] >= 1 and ck['epoch'] < 3  # stopped after the step or the epoch during which the pipe closed
    p = run([*args, '--resume', 'auto'])
    assert p.returncode == 0 and 'resumed from' in p.stdout, p.stderr
    proc = WarmPopen([PY, '-c', EVAL_MAIN, str(out / 'last.pth')], cwd=REPO, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    stderr = proc.stderr.read(); proc.wait(timeout=300)
    assert proc.returncode == 1 and 'Traceback' not in stderr, (proc.returncode, stderr)


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(folder, tmp_path, monkeypatch):
    out = tmp_path / 'run'
    nan_main = lambda argv: main(argv, callbacks=[NanAfterStep(11)])  # step 12: step 4 of epoch 2 (8 steps per epoch)
    code, _, err = call(nan_main, ['--data', str(folder), *RESUME_ARGS, '--workers', '0', '--output', str(out)])
    assert code == 1 and 'the training loss is not finite in epoch 2, step 4 of 8' in err, err
    assert 'is untouched' in err
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert ck['epoch'] == 1 and ck['step'] == 8
    assert all(torch.isfinite(v).all() for v in ck['state_dict'].values())


# ------------------------------------------------------------------ bad images
def odd_and_bad(root):
    "Add images in odd modes (which must load) and corrupt files (which must be reported) to the training split."
    d = root / 'train' / 'n00'
    rng = np.random.default_rng(1)
    Image.fromarray((rng.random((20, 20)) * 65535).astype(np.uint16)).save(d / 'gray16.png')       # 16-bit
    Image.new('RGBA', (20, 20), (200, 30, 30, 128)).save(d / 'rgba.png')
    Image.new('LA', (20, 20), (90, 200)).save(d / 'la.png')
    Image.new('CMYK', (20, 20), (0, 200, 200, 0)).save(d / 'cmyk.jpg')
    Image.new('1', (20, 20), 1).save(d / 'bilevel.png')
    p = Image.new('P', (20, 20), 1); p.putpalette([0, 0, 0, 220, 30, 30] * 128); p.info['transparency'] = 0; p.save(d / 'palette.png')
    good = io.BytesIO(); Image.new('RGB', (64, 64), (200, 30, 30)).save(good, 'JPEG')
    (d / 'truncated.jpg').write_bytes(good.getvalue()[:200])
    (d / 'text.jpg').write_text('not an image')
    (d / 'empty.png').write_bytes(b'')
    return ['empty.png', 'text.jpg', 'truncated.jpg']


@pytest.fixture(scope='module')
def bad_folder(tmp_path_factory):
    root = make_folder(tmp_path_factory.mktemp('bad'))
    return root, odd_and_bad(root)


@pytest.mark.parametrize('workers', [0, 1])
def test_bad_images_stop_with_a_clear_message(bad_folder, tmp_path, workers):
    root, bad = bad_folder
    t = time.perf_counter()
    code, _, err = call(main, ['--data', str(root), *TINY_ARGS, '--batch-size', '4', '--epochs', '1', '--workers', str(workers),
                               '--output', str(tmp_path / 'run')])
    assert code == 1 and 'cannot decode image file' in err and any(b in err for b in bad), err
    assert '--skip-bad-images' in err and 'Traceback' not in err
    assert time.perf_counter() - t < 8  # the worker is shut down at once, not after torch's 10 s garbage-collection wait


def test_sigterm_to_the_process_group_stops_cleanly(folder, tmp_path):
    "Slurm or `kill -TERM -PGID` signal every process of the job, loader workers included: still a checkpoint and 143."
    out = tmp_path / 'run'
    proc = WarmPopen([PY, 'tests/fault_run.py', 'signal-group:11', '--', '--data', str(folder), *RESUME_ARGS,
                             '--output', str(out)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 143, stderr[-3000:]
    assert 'stopped by SIGTERM' in stdout and 'Traceback' not in stderr
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert ck['step'] == 11 and ck['batch'] == 3


def test_resume_keeps_this_runs_schedule_and_hyper_parameters(folder, tmp_path):
    "Resuming with more epochs, another lr, weight decay or EMA decay uses the new values from the saved step on."
    out = tmp_path / 'run'
    code, _, err = call(main, ['--data', str(folder), *RESUME_ARGS, '--workers', '0', '--epochs', '2', '--output', str(out)])
    assert code == 0, err
    code, stdout, err = call(main, ['--data', str(folder), *RESUME_ARGS, '--workers', '0', '--epochs', '4', '--lr', '0.4',
                                    '--weight-decay', '0.01', '--ema-decay', '0.5', '--output', str(out), '--resume', 'auto'])
    assert code == 0, err
    assert 'the learning-rate schedule differs' in stdout and 'decay_steps 16 -> 32' in stdout
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert ck['epoch'] == 4 and ck['step'] == 32
    assert ck['scheduler']['peak_lr'] == pytest.approx(scale_lr(0.4, 8)) and ck['scheduler']['decay_steps'] == 32
    assert [g['weight_decay'] for g in ck['optimizer']['param_groups']] == [0., 0.01]
    assert ck['ema']['decay'] == 0.5
    lrs = [float(r['lr']) for r in csv.DictReader(open(out / 'metrics.csv'))]
    assert lrs[2] > lrs[1]  # epoch 3 is back up the new, longer cosine, not stuck at the old min_lr


def test_resume_from_a_path_continues_in_its_folder(folder, tmp_path):
    ck = tmp_path / 'somewhere' / 'last.pth'
    ck.parent.mkdir(); ck.write_bytes(b'')
    cfg = TrainConfig(data=str(folder), model='t2t_vit_7', resume=str(ck)).resolve()
    assert cfg.output == str(ck.parent)


def test_skip_bad_validation_images_are_counted(tmp_path):
    root = make_folder(tmp_path / 'data')
    (root / 'val' / 'n01' / 'broken.png').write_bytes(b'not a png')
    code, out, err = call(main, ['--data', str(root), *TINY_ARGS, '--batch-size', '4', '--epochs', '2', '--workers', '0',
                                 '--skip-bad-images', '--output', str(tmp_path / 'run')])
    assert code == 0, err
    assert 'validation (not counted in the accuracy): skipped 1 bad image sample(s) from 1 file(s)' in out and 'broken.png' in out


@pytest.mark.slow
def test_main_job_reaches_97_percent(tmp_path):
    "The README's main job, `t2t_train` with no flags: at least 97% validation top-1 on the digits (the time is printed)."
    t = time.perf_counter()
    p = run(['-m', 't2t_course.train', '--output', str(tmp_path / 'run')], timeout=900)
    elapsed = time.perf_counter() - t
    assert p.returncode == 0, p.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / 'run' / 'metrics.csv')))
    acc = max(float(rows[-1]['val_acc1']), float(rows[-1]['ema_val_acc1']))
    print(f"main job: val_acc1 {acc:.2f}% in {elapsed:.0f} s")
    assert acc >= 97.0, p.stdout[-2000:]



def test_skip_bad_images_trains_and_reports(bad_folder, tmp_path):
    root, bad = bad_folder
    code, out, err = call(main, ['--data', str(root), *TINY_ARGS, '--batch-size', '4', '--epochs', '2', '--workers', '1',
                                 '--skip-bad-images', '--output', str(tmp_path / 'run')])
    assert code == 0, err
    assert f'skipped {2 * len(bad)} bad image sample(s) from {len(bad)} file(s)' in out
    assert all(b in out for b in bad)
    rows = list(csv.DictReader(open(tmp_path / 'run' / 'metrics.csv')))
    assert [int(r['skipped_images']) for r in rows] == [3, 6]  # cumulative, over all processes


# ------------------------------------------------------------------ DDP against one process
def test_ddp_matches_a_single_process_on_the_combined_batch(folder, tmp_path):
    sys.path.insert(0, str(REPO / 'tests'))
    from ddp_worker import TINY as DTINY, fixed_batch
    p = run(['-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port', str(29500 + os.getpid() % 1000),
             'tests/ddp_worker.py', str(folder), str(tmp_path)], env={'OMP_NUM_THREADS': '1'})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ddp = torch.load(tmp_path / 'ddp.pt', weights_only=False)
    assert (ddp['world_size'], ddp['rank']) == (2, 0)
    # one step: the whole batch in one process
    torch.manual_seed(0)
    model = create_model('t2t_vit_7', num_classes=4, img_size=16, **DTINY)
    images, targets = fixed_batch()
    loss = create_loss(True, 0.1)(model(images), F.one_hot(targets, 4).float())
    loss.backward()
    assert abs(loss.item() - ddp['loss']) < 1e-5
    assert max_diff({n: p.grad for n, p in model.named_parameters()}, ddp['grads']) < 1e-5
    # evaluation: the all-reduced metrics of two shards equal those of the whole split
    from t2t_course.data import create_datasets, create_loader
    from t2t_course.train.evaluate import evaluate
    _, val = create_datasets(folder, 16, 'digits')
    single = evaluate(model, create_loader(val, 7), torch.device('cpu'))
    assert single['n'] == ddp['eval']['n'] == len(val) and single['acc1'] == ddp['eval']['acc1']
    assert single['acc5'] == ddp['eval']['acc5'] and math.isclose(single['loss'], ddp['eval']['loss'], rel_tol=1e-6)
    # the loop's first step: the two halves from the samplers make up the single process's batch, same update
    from ddp_worker import config
    from t2t_course.train import build_run, train_step
    r = build_run(config(folder, tmp_path / 'trainer', batch_size=8))
    r.sampler.set_epoch(0)
    images, targets, _ = next(iter(r.train_dl))
    (i0, t0), (i1, t1) = ddp['batch']
    torch.testing.assert_close(torch.cat([i0, i1]), images[[0, 2, 4, 6, 1, 3, 5, 7]], rtol=0, atol=0)
    assert torch.equal(torch.cat([t0, t1]), targets[[0, 2, 4, 6, 1, 3, 5, 7]])
    train_step(r.state, r.model, images, targets, r.loss_fn, r.mixer, r.dtype)
    r.lock.release()
    assert max_diff(r.state.model.state_dict(), ddp['step1']) < 1e-5
    # a whole run under torchrun: rank 0 wrote the files; its logged metrics are those of its weights on the whole split.
    # (The weights are not compared after many steps: Adam's first updates are lr * sign(g), so gradients that are 0
    # up to rounding flip and the two runs drift apart by ~lr per step, however exact the reduction.)
    run_dir = tmp_path / 'run'
    assert {'last.pth', 'best.pth', 'metrics.csv', 'curves.png'} <= {p.name for p in run_dir.iterdir()}
    ck = torch.load(run_dir / 'last.pth', weights_only=True)
    assert ck['world_size'] == 2 and len(ck['rng']) == 2 and ck['step'] == 2 * 8
    model.load_state_dict(ck['state_dict'])
    m = evaluate(model, create_loader(val, 7), torch.device('cpu'))
    h = ddp['history'][-1]
    assert (h['val_acc1'], h['val_acc5']) == (m['acc1'], m['acc5']) and math.isclose(h['val_loss'], m['loss'], rel_tol=1e-5)
    r = train(config(folder, tmp_path / 'single', batch_size=8))
    assert math.isclose(r.history[0]['train_loss'], ddp['history'][0]['train_loss'], rel_tol=1e-3)


# ------------------------------------------------------------------ the ImageNet path and t2t_eval
def test_imagenet_recipe_end_to_end_and_t2t_eval(folder, tmp_path):
    "The paper's preset (RandAugment, mixing, erasing, smoothing, EMA) on a tiny ImageNet-layout folder, then t2t_eval."
    out = tmp_path / 'run'
    code, stdout, err = call(main, ['--data', str(folder), *TINY_ARGS, '--img-size', '32', '--batch-size', '8', '--epochs', '2',
                                    '--workers', '1', '--output', str(out)])
    assert code == 0, err
    ck = torch.load(out / 'last.pth', weights_only=True)
    cfg = ck['config']
    assert cfg['data_preset'] == 'imagenet' and cfg['mix_prob'] == 1.0 and cfg['smoothing'] == 0.1
    assert cfg['lr'] == 1e-3 and cfg['weight_decay'] == 0.03  # t2t_vit_7's recipe, scaled to the global batch of 8:
    assert f'peak lr {1e-3 * 8 / 512:.3g}' in stdout
    last = ck['history'][-1]
    code, stdout, err = call(eval_main, [str(out / 'last.pth'), '--workers', '0'])
    assert code == 0, err
    assert f"top-1 {last['val_acc1']:6.2f}%" in stdout and f"top-1 {last['ema_val_acc1']:6.2f}%" in stdout
    assert '24 images, 4 classes' in stdout
    # fine-tuning from it (--pretrained); resuming it with another architecture is refused with a reason
    code, _, err = call(main, ['--data', str(folder), *TINY_ARGS, '--img-size', '32', '--batch-size', '8', '--epochs', '1',
                               '--workers', '0', '--pretrained', str(out / 'best.pth'), '--output', str(tmp_path / 'ft')])
    assert code == 0, err
    code, _, err = call(main, ['--data', str(folder), *TINY_ARGS, '--img-size', '32', '--model-kwargs', 'embed_dim=64', 'depth=1',
                               'num_heads=2', '--output', str(out), '--resume', 'auto'])
    assert code == 2 and "cannot resume" in err and 'model_kwargs' in err, err


def test_t2t_eval_on_an_official_layout_checkpoint(tmp_path):
    "The golden file's official state_dict (module. prefixes, EMA wrapping) through t2t_eval, against a hand evaluation."
    g = torch.load(REPO / 'reference' / 'golden' / 'tiny_performer_64.pt', weights_only=True)
    sd = g['state_dict']
    ck = {'state_dict': {'module.' + k: v for k, v in sd.items()}, 'state_dict_ema': sd, 'epoch': 299}
    torch.save(ck, tmp_path / 'official.pth.tar')
    root = make_folder(tmp_path / 'ten', n_train=1, n_val=2, classes=10, size=(70, 80))
    args = [str(tmp_path / 'official.pth.tar'), '--data', str(root), '--model', 't2t_vit_7', '--model-kwargs', 'embed_dim=64',
            'depth=2', 'num_heads=2', 'mlp_ratio=2.0', '--img-size', '64', '--workers', '0']
    code, stdout, err = call(eval_main, args)
    assert code == 0, err
    model = create_model('t2t_vit_7', num_classes=10, img_size=64, embed_dim=64, depth=2, num_heads=2, mlp_ratio=2.).eval()
    model.load_state_dict(sd)
    ds = ImageFolderDataset(root / 'val', create_eval_transform(64, crop_pct=0.9, interpolation='bicubic'))
    with torch.no_grad():
        logits = model(torch.stack([ds[i][0] for i in range(len(ds))]))
    y = torch.tensor(ds.targets)
    acc1 = 100 * (logits.argmax(1) == y).float().mean().item()
    acc5 = 100 * (logits.topk(5, 1).indices == y[:, None]).any(1).float().mean().item()
    assert stdout.count(f'top-1 {acc1:6.2f}%  top-5 {acc5:6.2f}%') == 2  # weights and EMA (the same tensors here)
    code, _, err = call(eval_main, args[:3] + ['--workers', '0'])
    assert code == 2 and 'name its architecture with --model' in err
    three = make_folder(tmp_path / 'three', n_train=1, n_val=1, classes=3)
    code, _, err = call(eval_main, [a if a != str(root) else str(three) for a in args])
    assert code == 2 and 'has 3 class folders but the checkpoint\'s head has 10 classes' in err, err


@pytest.mark.slow
def test_t2t_vit_14_paper_recipe_on_a_tiny_imagenet(tmp_path):
    "`t2t_train --data FOLDER --model t2t_vit_14`: the real model at 224 px, one epoch of two steps on the CPU."
    root = make_folder(tmp_path / 'inet', n_train=2, n_val=1, classes=4, size=(240, 260), ext='.JPEG')
    code, stdout, err = call(main, ['--data', str(root), '--model', 't2t_vit_14', '--epochs', '1', '--batch-size', '4',
                                    '--workers', '0', '--no-progress', '--output', str(tmp_path / 'run')])
    assert code == 0, err
    assert 'global batch 4' in stdout and f'peak lr {5e-4 * 4 / 512:.3g}' in stdout and '224 px' in stdout


# ------------------------------------------------------------------ GPU
@pytest.mark.cuda
@pytest.mark.parametrize('amp', ['bf16', 'fp16'])
def test_cuda_mixed_precision_run(folder, tmp_path, amp):
    r = train(TrainConfig(data=str(folder), model='t2t_vit_7', model_kwargs=TINY, img_size=32, batch_size=8, epochs=2,
                          amp=amp, device='cuda', workers=1, output=str(tmp_path / amp), progress=False))
    assert r.exit_code == 0 and all(math.isfinite(h['train_loss']) for h in r.history)


@pytest.mark.cuda
def test_cuda_compiled_run(folder, tmp_path):
    r = train(TrainConfig(data=str(folder), model='t2t_vit_7', model_kwargs=TINY, img_size=32, batch_size=8, epochs=1,
                          compile=True, device='cuda', output=str(tmp_path / 'c'), progress=False))
    ck = torch.load(r.checkpoint, weights_only=True)
    assert not any(k.startswith('_orig_mod.') for k in ck['state_dict'])  # saved from the uncompiled module


# ------------------------------------------------------------------ the GPU benchmark script
def test_gpu_benchmark_smoke_on_cpu():
    p = run(['benchmarks/gpu_train.py', '--device', 'cpu', '--smoke'], timeout=120)
    assert p.returncode == 0, p.stderr
    assert 'img/s' in p.stdout and 'MFU' in p.stdout and 'per worker' in p.stdout
    if not torch.cuda.is_available():
        p = run(['benchmarks/gpu_train.py'], timeout=60)
        assert p.returncode == 2 and 'needs a CUDA GPU' in p.stderr


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


def test_optimizer_uses_the_fused_kernel_when_available():
    from t2t_course.train.optim import create_optimizer
    opt = create_optimizer(create_model('t2t_vit_7', img_size=32, num_classes=10), lr=1e-3)
    assert opt.defaults.get('fused') in (True, None)  # None only on a torch without a fused CPU kernel
    if tuple(int(v) for v in torch.__version__.split('.')[:2]) >= (2, 4): assert opt.defaults['fused'] is True


# ------------------------------------------------------------------ the structure: recipes, registry, config as the source of flags
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


def test_help_shows_the_recipes_defaults():
    code, out, _ = call(main, ['--help'])
    assert code == 0
    flat = ' '.join(out.split())
    assert 'digits: 0.008;' in flat and 'a folder: 0.0005 (t2t_vit_7, t2t_vit_10, t2t_vit_12: 0.001)' in flat  # --lr
    assert 'fine-tuning (a folder and --pretrained): 0.4' in flat                                          # --lr, fine-tuning
    assert 'digits: 64;' in flat and 'a folder: the model\'s (224, 384)' in flat                         # --img-size
    assert "choose" not in flat and '{adamw,sgd}' in flat


def test_builtin_dataset_by_name_and_sgd(tmp_path):
    "--data digits names the registered dataset; --opt sgd swaps the optimizer (one registry entry each)."
    out = tmp_path / 'run'
    code, _, err = call(main, ['--data', 'digits', '--epochs', '1', '--opt', 'sgd', '--lr', '0.4', '--model-kwargs',
                               'embed_dim=32', 'depth=1', 'num_heads=2', 'mlp_ratio=2.0', 'token_dim=16', '--img-size', '16',
                               '--no-progress', '--output', str(out)])
    assert code == 0, err
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert ck['config']['data'] == 'digits' and ck['config']['opt'] == 'sgd'
    assert 'momentum' in ck['optimizer']['param_groups'][0] and 'betas' not in ck['optimizer']['param_groups'][0]


def test_t2t_eval_caps_workers_and_prints_top5_only_when_it_means_something(folder, tmp_path):
    out = tmp_path / 'run'
    code, _, err = call(main, ['--data', str(folder), *TINY_ARGS, '-b', '8', '--epochs', '1', '--output', str(out)])
    assert code == 0, err
    p = run(['-m', 't2t_course.train.cli', '--help'])  # the module runs as t2t_train too
    assert p.returncode == 0 and 'usage: t2t_train' in p.stdout
    code = 'import sys; from t2t_course.train.cli import eval_main; sys.exit(eval_main(sys.argv[1:]))'
    p = warm_run([PY, '-W', 'default', '-c', code, str(out / 'last.pth')], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert 'suggested max number of worker' not in p.stderr  # no more workers than CPUs
    assert 'top-1' in p.stdout and 'top-5' not in p.stdout    # 4 classes: top-5 would be 100% by definition


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
