"""The training loop (chapter 18d, `t2t_course.train.loop`): it stops on signals (SIGTERM from outside or to the whole
process group, Ctrl-C once or twice, a closed stdout) with a checkpoint and the signal's exit status; a non-finite loss
keeps the last good checkpoint; bad images stop the run with a clear message, or are skipped and counted (training and
validation); `train` leaves the process-wide switches alone; the README's main job reaches 97% (slow); on a GPU (marked
`cuda`), mixed precision and torch.compile."""
import csv, io, math, os, signal, subprocess, time

import numpy as np
import pytest
import torch
from PIL import Image

from t2t_course.train import train
from t2t_course.train.cli import main
from t2t_course.train.config import TrainConfig

from tests.support.commands import FAULT, PY, REPO, RESUME_ARGS, TINY, TINY_ARGS, call, no_traceback, run, train_args
from tests.support.faults import NanAfterStep
from tests.support.images import make_folder
from tests.support.warm import WarmPopen


# ------------------------------------------------------------------ stopped by a signal
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


def test_sigterm_to_the_process_group_stops_cleanly(folder, tmp_path):
    "Slurm or `kill -TERM -PGID` signal every process of the job, loader workers included: still a checkpoint and 143."
    out = tmp_path / 'run'
    proc = WarmPopen([PY, '-m', 'tests.support.fault_run', 'signal-group:11', '--', '--data', str(folder), *RESUME_ARGS,
                             '--output', str(out)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 143, stderr[-3000:]
    assert 'stopped by SIGTERM' in stdout and 'Traceback' not in stderr
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert ck['step'] == 11 and ck['batch'] == 3


def test_ctrl_c_twice_stops_at_once_with_status_130(folder, tmp_path):
    p = run([*FAULT, 'sigint2:3', '--', *train_args(folder, tmp_path / 'run', '--epochs', '3', '--workers', '1')])
    assert p.returncode == 130, p.stderr
    assert 'interrupted twice: stopped at once' in p.stderr
    no_traceback(p.stderr)


def test_ctrl_c_once_saves_and_exits_130(folder, tmp_path):
    p = run([*FAULT, 'sigint:3', '--', *train_args(folder, tmp_path / 'run', '--epochs', '3')])
    assert p.returncode == 130 and 'stopped by SIGINT' in p.stdout, p.stderr
    assert torch.load(tmp_path / 'run' / 'last.pth', weights_only=True)['step'] == 3


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


# ------------------------------------------------------------------ a non-finite loss
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


def test_skip_bad_images_trains_and_reports(bad_folder, tmp_path):
    root, bad = bad_folder
    code, out, err = call(main, ['--data', str(root), *TINY_ARGS, '--batch-size', '4', '--epochs', '2', '--workers', '1',
                                 '--skip-bad-images', '--output', str(tmp_path / 'run')])
    assert code == 0, err
    assert f'skipped {2 * len(bad)} bad image sample(s) from {len(bad)} file(s)' in out
    assert all(b in out for b in bad)
    rows = list(csv.DictReader(open(tmp_path / 'run' / 'metrics.csv')))
    assert [int(r['skipped_images']) for r in rows] == [3, 6]  # cumulative, over all processes


def test_skip_bad_validation_images_are_counted(tmp_path):
    root = make_folder(tmp_path / 'data')
    (root / 'val' / 'n01' / 'broken.png').write_bytes(b'not a png')
    code, out, err = call(main, ['--data', str(root), *TINY_ARGS, '--batch-size', '4', '--epochs', '2', '--workers', '0',
                                 '--skip-bad-images', '--output', str(tmp_path / 'run')])
    assert code == 0, err
    assert 'validation (not counted in the accuracy): skipped 1 bad image sample(s) from 1 file(s)' in out and 'broken.png' in out


# ------------------------------------------------------------------ train()
def test_train_leaves_cudnn_and_tf32_switches_as_they_were(tmp_path):
    "Process-wide switches are the command line's to set (`_gpu_switches`), not the library's."
    flags = lambda: (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                     torch.get_float32_matmul_precision())
    saved = flags()
    try:
        for values in [(True, True, False, 'medium'), (False, False, True, 'highest')]:
            torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = values[:3]
            torch.set_float32_matmul_precision(values[3])
            expected = flags()
            r = train(TrainConfig(epochs=1, img_size=16, model_kwargs=TINY, output=str(tmp_path / str(values[0])), progress=False))
            assert r.exit_code == 0 and flags() == expected, (flags(), expected)
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:3]
        torch.set_float32_matmul_precision(saved[3])


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


# ------------------------------------------------------------------ gradient accumulation
def test_grad_accumulation_matches_the_doubled_batch_in_float64(folder, tmp_path):
    "2 batches of 8 per optimizer step give the weights of one batch of 16, to rounding; a short last group still steps."
    from tests.support.ddp_worker import accumulation_run
    whole, acc = (accumulation_run(folder, tmp_path / f'n{n}', 16 // n, n) for n in (1, 2))
    assert (whole['step'], acc['step'], acc['schedule']) == (4, 4, 4)
    assert max(abs(whole['weights'][k] - acc['weights'][k]).max().item() for k in whole['weights']) < 1e-10
    three = accumulation_run(folder, tmp_path / 'n3', 8, 3)      # 8 batches in groups of 3, 3 and 2
    assert (three['step'], three['schedule']) == (3, 3)


def test_grad_accumulation_on_the_command_line(folder, tmp_path):
    "The header says what the global batch is made of; the learning rate follows it; config.json records it."
    import json
    code, out, err = call(main, train_args(folder, tmp_path / 'run', '--epochs', '1', '--grad-accum-steps', '2', '--lr', '0.1'))
    assert code == 0, err
    assert 'global batch 16 = 8 x 1 x 2 batches accumulated' in out and '1 epochs of 4 steps (8 batches)' in out, out
    saved = json.loads((tmp_path / 'run' / 'config.json').read_text())
    assert (saved['grad_accum_steps'], saved['launch']['global_batch'], saved['launch']['steps_per_epoch']) == (2, 16, 4)
    assert math.isclose(saved['launch']['peak_lr'], 0.1 * 16 / 512)
    code, _, err = call(main, train_args(folder, tmp_path / 'bad', '--grad-accum-steps', '0'))
    assert code == 2 and 'grad_accum_steps must be a positive int' in err.strip().splitlines()[-1], err  # argparse's usage, then one line
