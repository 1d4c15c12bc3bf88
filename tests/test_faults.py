"""Reliability under faults (chapters 11, 14, 15, 18, 19): symlink loops, two runs on one folder, interrupted writes,
unwritable outputs and full disks, Ctrl-C twice, bad weight files and bad architectures, t2t_eval's bad input, and
distributed faults (a hung or dead peer, a signal to one process). No command prints a Python traceback on any of
them, and nothing a run trained is lost."""
import os, resource, signal, socket, subprocess, time, warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from support.warm import WarmPopen, warm_run
from test_train import PY, REPO, TINY_ARGS, call, make_folder, run
from t2t_course.train.cli import eval_main, main
from t2t_course.data import ImageFolderDataset

FAULT = ['tests/fault_run.py']


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp('faults_data'))


def train_args(folder, out, *more):
    return ['--data', str(folder), *TINY_ARGS, '-b', '8', '--workers', '0', '--output', str(out), *more]


def no_traceback(text):
    assert 'Traceback' not in text, text[-3000:]


# ------------------------------------------------------------------ data that is silently wrong
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


# ------------------------------------------------------------------ a run's results lost
def _wait_for(path, proc, timeout=120):
    deadline = time.time() + timeout
    while not path.exists() and time.time() < deadline and proc.poll() is None: time.sleep(0.1)
    assert path.exists(), proc.communicate(timeout=30)


def test_a_second_run_on_the_same_folder_is_refused(folder, tmp_path):
    out = tmp_path / 'run'
    first = WarmPopen([PY, '-m', 't2t_course.train', *train_args(folder, out, '--epochs', '1000')], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(out / 'last.pth', first)
        for extra in ([], ['--resume', 'auto']):
            code, _, err = call(main, train_args(folder, out, '--epochs', '2', *extra))
            assert code == 2 and f'output folder {out} is in use by another run (pid {first.pid} on {socket.gethostname()}' in err, err
            no_traceback(err)
    finally:
        first.send_signal(signal.SIGTERM); first.communicate(timeout=60)
    assert first.returncode == 143
    code, _, err = call(main, train_args(folder, out, '--epochs', '2', '--resume', 'auto'))  # the lock died with its holder
    assert code == 0, err


def test_a_lock_file_left_by_a_dead_run_does_not_block(folder, tmp_path):
    out = tmp_path / 'run'; out.mkdir()
    (out / '.lock').write_text('{"pid": 999999, "host": "elsewhere", "since": "yesterday"}')
    code, _, err = call(main, train_args(folder, out, '--epochs', '1'))
    assert code == 0, err


def test_stale_temporaries_of_killed_saves_are_removed(folder, tmp_path):
    out = tmp_path / 'run'; out.mkdir()
    (out / '.last.pth.4242.tmp').write_bytes(b'\0' * 2_000_000)  # a partial write of a process killed by -9
    code, stdout, err = call(main, train_args(folder, out, '--epochs', '1'))
    assert code == 0, err
    assert 'removed 1 temporary file(s) of interrupted writes' in stdout and '.last.pth.4242.tmp' in stdout
    assert not list(out.glob('.*.tmp'))


# ------------------------------------------------------------------ tracebacks instead of messages
def test_output_that_is_a_file_or_under_a_file(folder, tmp_path):
    (tmp_path / 'a_file').write_text('x')
    code, _, err = call(main, train_args(folder, tmp_path / 'a_file', '--epochs', '1'))
    assert code == 2 and 'is a file, not a folder' in err, err
    code, _, err = call(main, train_args(folder, tmp_path / 'a_file' / 'sub', '--epochs', '1'))
    assert code == 2 and 'cannot use output folder' in err and 'not a directory' in err, err


def _limited(limit_bytes):
    "A preexec_fn: files may not grow beyond `limit_bytes` (writes fail with EFBIG, as on a full or quota'd disk)."
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write beyond the limit fails instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return apply


def test_unwritable_output_is_refused_before_training(folder, tmp_path):
    out = tmp_path / 'run'
    t = time.perf_counter()
    p = warm_run([PY, '-m', 't2t_course.train', *train_args(folder, out, '--epochs', '5')], cwd=REPO, text=True,
                       capture_output=True, timeout=120, preexec_fn=_limited(0))
    assert p.returncode == 2 and f'cannot write into output folder {out}: file too large' in p.stderr, p.stderr
    assert 'epoch' not in p.stdout and time.perf_counter() - t < 60  # refused at the start, not after an epoch
    no_traceback(p.stderr)
    if os.geteuid() != 0:  # a read-only folder (root may write anywhere)
        ro = tmp_path / 'ro'; ro.mkdir(); ro.chmod(0o555)
        code, _, err = call(main, train_args(folder, ro, '--epochs', '1'))
        assert code == 2 and 'permission denied' in err, err


def test_a_full_disk_at_save_keeps_the_previous_checkpoint(folder, tmp_path):
    out = tmp_path / 'run'
    code, _, err = call(main, train_args(folder, out, '--epochs', '1'))
    assert code == 0, err
    before = (out / 'last.pth').read_bytes()
    p = warm_run([PY, '-m', 't2t_course.train', *train_args(folder, out, '--epochs', '2', '--resume', 'auto')], cwd=REPO,
                       text=True, capture_output=True, timeout=300, preexec_fn=_limited(20_000))
    assert p.returncode == 1, p.stderr
    assert f'file too large while saving {out / "last.pth"}; the previous checkpoint is intact' in p.stderr, p.stderr
    no_traceback(p.stderr)
    assert (out / 'last.pth').read_bytes() == before and not list(out.glob('.*.tmp'))
    assert torch.load(out / 'last.pth', weights_only=True)['epoch'] == 1


def test_no_space_left_names_the_cause(folder, tmp_path, monkeypatch):
    import errno
    import t2t_course.train.checkpoint as ckpt
    real_fsync = os.fsync
    def full(fd):  # the disk fills up while the first checkpoint is written
        if '.last.pth.' in os.readlink(f'/proc/self/fd/{fd}'): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)
    monkeypatch.setattr(ckpt.os, 'fsync', full)
    code, _, err = call(main, train_args(folder, tmp_path / 'run', '--epochs', '1'))
    assert code == 1 and 'no space left on device while saving' in err and 'no earlier checkpoint exists' in err, err


def test_ctrl_c_twice_stops_at_once_with_status_130(folder, tmp_path):
    p = run([*FAULT, 'sigint2:3', '--', *train_args(folder, tmp_path / 'run', '--epochs', '3', '--workers', '1')])
    assert p.returncode == 130, p.stderr
    assert 'interrupted twice: stopped at once' in p.stderr
    no_traceback(p.stderr)


def test_ctrl_c_once_saves_and_exits_130(folder, tmp_path):
    p = run([*FAULT, 'sigint:3', '--', *train_args(folder, tmp_path / 'run', '--epochs', '3')])
    assert p.returncode == 130 and 'stopped by SIGINT' in p.stdout, p.stderr
    assert torch.load(tmp_path / 'run' / 'last.pth', weights_only=True)['step'] == 3


def _saved(obj) -> bytes:
    import io; buf = io.BytesIO(); torch.save(obj, buf); return buf.getvalue()


@pytest.mark.parametrize('content, message', [(b'this is text, not weights\n', 'not a PyTorch checkpoint'),
                                               (b'', 'is empty (0 bytes)'),
                                               (_saved({'state_dict': {'w': torch.zeros(5000)}})[:3000], 'truncated or damaged'),
                                               (_saved({'state_dict': {}, 'best_acc1': np.float64(71.7)}), 'pickled numpy')])
def test_bad_pretrained_and_resume_files_get_one_line(folder, tmp_path, content, message):
    bad = tmp_path / 'weights.pth'; bad.write_bytes(content)
    code, _, err = call(main, train_args(folder, tmp_path / 'a', '--epochs', '1', '--pretrained', str(bad)))
    assert code == 2 and 'pretrained weights' in err and str(bad) in err and message in err, err
    code, _, err = call(main, train_args(folder, tmp_path / 'b', '--epochs', '1', '--resume', str(bad)))
    assert code == 2 and str(bad) in err and message in err, err
    assert 'weights_only=False' not in err  # never the unsafe advice for a file the user did not make
    for e in (err,): assert len(e.strip().splitlines()) == 1 and 'Traceback' not in e


def test_bad_architecture_overrides_get_one_line(folder, tmp_path):
    p = run(['-m', 't2t_course.train', *train_args(folder, tmp_path / 'a', '--epochs', '1'), '--model-kwargs', 'depth=-1'])
    assert p.returncode == 2 and "cannot build t2t_vit_7 with" in p.stderr and 'depth' in p.stderr, p.stderr
    no_traceback(p.stderr)


def test_t2t_eval_bad_input(folder, tmp_path):
    out = tmp_path / 'run'
    code, _, err = call(main, train_args(folder, out, '--epochs', '1'))
    assert code == 0, err
    (tmp_path / 'no_val' / 'train' / 'n00').mkdir(parents=True)
    code, _, err = call(eval_main, [str(out / 'last.pth'), '--data', str(tmp_path / 'no_val'), '--workers', '0'])
    assert code == 2 and 'has no val/ folder' in err, err
    code, _, err = call(eval_main, [str(out / 'last.pth'), '--img-size', '7'])
    assert code == 2 and '--img-size must be an int >= 16' in err, err
    code, _, err = call(eval_main, [str(out / 'last.pth'), '--model', 't2t_vit_14', '--workers', '0'])
    assert code == 2 and "was trained as t2t_vit_7 with {'embed_dim': 32" in err and "own architecture" in err, err
    (tmp_path / 'text.pth').write_text('hello')
    p = run(['-c', 'import sys; from t2t_course.train.cli import eval_main; sys.exit(eval_main(sys.argv[1:]))', str(tmp_path / 'text.pth'),
             '--model', 't2t_vit_7', '--data', str(folder)])
    assert p.returncode == 2 and 'not a PyTorch checkpoint' in p.stderr, p.stderr
    no_traceback(p.stderr)


# ------------------------------------------------------------------ distributed faults
def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]


def two_processes(fault, args, tmp_path):
    "Start a 2-process gloo run as torchrun would (the environment), without torchrun: the test controls each process."
    if '--device' not in args: args = [*args, '--device', 'cpu']  # gloo on the CPU, on a GPU machine too
    port, procs = _free_port(), []
    for rank in (0, 1):
        env = dict(os.environ, WORLD_SIZE='2', RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE='2',
                   MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
        procs.append(WarmPopen([PY, *FAULT, fault, '--', *args], cwd=REPO, env=env, text=True,
                                stdout=open(tmp_path / f'out{rank}.txt', 'w'), stderr=open(tmp_path / f'err{rank}.txt', 'w')))
    return procs


def _finish(procs, timeout, grace:float=0.):
    "Wait for rank 0; give the others `grace` seconds more to exit on their own, then kill what is left."
    try: return procs[0].wait(timeout=timeout)
    finally:
        for p in procs:
            try: p.wait(timeout=grace)
            except subprocess.TimeoutExpired: pass
            if p.poll() is None: p.kill(); p.wait()


@pytest.mark.parametrize('fault', ['stop@1:3', 'kill@1:3'])  # a hung peer (SIGSTOP), a dead one (SIGKILL)
def test_a_lost_peer_gets_one_clear_line(folder, tmp_path, fault):
    args = train_args(folder, tmp_path / 'run', '--epochs', '3', '--dist-timeout', '10', '--device', 'cpu', '-b', '4')
    t = time.perf_counter()
    procs = two_processes(fault, args, tmp_path)
    code = _finish(procs, timeout=150)
    err = (tmp_path / 'err0.txt').read_text()
    assert code == 1, err[-3000:]
    assert 'rank 0: a collective of the training loop' in err and 'died or stopped responding' in err and '--resume auto' in err, err
    no_traceback(err)
    assert time.perf_counter() - t < 120  # bounded by --dist-timeout, not torch's 30 minutes


def test_sigterm_to_one_process_stops_both_within_a_step(folder, tmp_path):
    "The stop vote runs after every step: a signal at step 3 of an 8-step epoch stops both at step 4 (one step late)."
    out = tmp_path / 'run'
    procs = two_processes('signal@1:3', train_args(folder, out, '--epochs', '3', '--device', 'cpu', '-b', '4'), tmp_path)
    code = _finish(procs, timeout=150, grace=60)  # rank 1 also saves and exits: not killed the moment rank 0 is done
    assert code == 143 and procs[1].returncode == 143, (tmp_path / 'err0.txt').read_text()[-3000:]
    ck = torch.load(out / 'last.pth', weights_only=True)
    assert (ck['epoch'], ck['batch'], ck['step']) == (0, 4, 4) and len(ck['rng']) == 2
    assert 'stopped by SIGTERM in epoch 1 after 4 of its 8 steps' in (tmp_path / 'out0.txt').read_text()
